/*
 * coserve.h - LoRA adapters served next to their base model by `orch
 * serve`, on the base's one copy of the weights (S-LoRA/Punica style: one
 * batch may mix adapters), loaded at start (--lora NAME=DIR) or at run time
 * (vLLM's POST /v1/load_lora_adapter and /v1/unload_lora_adapter, only with
 * --enable-lora-loading), and the engine side of co-serving: engine tasks
 * run on the scheduler thread through the scheduler's co-serving hooks
 * (scheduler.h: the engine context belongs to that thread once it runs).
 *
 * An adapter is a PEFT directory (peft_adapter.h) for the served base
 * model's architecture and shapes; one trained by orch on another base
 * (fingerprint) is refused. Requests name an adapter as their "model"; a
 * resolved adapter is held (reference count) until the request is over, so
 * an unload waits for the requests using it (new ones get 404 at once) and
 * the engine adapter is destroyed when the last one ends.
 *
 * Threads: coserve_add_now only before coserve_attach (the caller then owns
 * the engine context); everything else is thread-safe, and the scheduler
 * hooks (coserve_hooks) run on the scheduler thread.
 * Memory: the coserve object is the caller's (coserve_destroy, after the
 * scheduler is gone); it borrows the engine, context and model description.
 * Errors: -1 with an api_error or a one-line message.
 */
#ifndef ORCH_COSERVE_H
#define ORCH_COSERVE_H

#include <stddef.h>
#include <stdint.h>

#include "orchestrator/core/engine_loader.h"
#include "orchestrator/core/strbuf.h"
#include "orchestrator/serve/api_error.h"
#include "orchestrator/serve/scheduler.h"

#define COSERVE_NAME_MAX     320
#define COSERVE_MAX_ADAPTERS 64u

typedef struct coserve_config {
    const engine_handle *engine;
    orch_engine_ctx *ctx;
    const orch_model_desc *model;
    const char *base_name;  /* the served base model's name */
    int allow_runtime_load; /* --enable-lora-loading */
    uint32_t max_adapters;  /* loaded at once; 0 = COSERVE_MAX_ADAPTERS */
    int fingerprint_now;    /* compute the base's fingerprint at create (for
                               adapters trained in the server) */
} coserve_config;

typedef struct coserve coserve;

/* NULL with a message when the engine has no LoRA adapters is NOT an error:
 * coserve_create always succeeds for a valid config (adapter calls then
 * fail with a message naming the engine). */
coserve *coserve_create(const coserve_config *cfg, char *err, size_t err_cap);
void coserve_destroy(coserve *c);

/* Load adapter DIR as NAME now, on the calling thread (before
 * coserve_attach: --lora at start). */
int coserve_add_now(coserve *c, const char *name, const char *dir, char *err,
                    size_t err_cap);

/* From now on engine work goes through the scheduler thread (the hooks). */
void coserve_attach(coserve *c, scheduler *s);
/* The scheduler's co-serving hooks (give them in scheduler_config). */
const sched_coserve *coserve_hooks(coserve *c);

/* A request's "model": 0 and *adapter_id = 0 for the base name; 0 and the
 * adapter's id (held: coserve_release when the request is over) for a
 * served adapter; -1 otherwise. */
int coserve_resolve(coserve *c, const char *name, uint32_t *adapter_id);
void coserve_release(coserve *c, uint32_t adapter_id);

/* The served adapters as /v1/models entries, each preceded by a comma:
 * {"id","object":"model","created","owned_by":"orch","root":DIR,
 * "parent":BASE,"max_model_len"}. */
void coserve_models_json(coserve *c, strbuf *b, uint32_t max_model_len);
/* One adapter's entry (no comma); -1 when NAME is not served. */
int coserve_model_json(coserve *c, const char *name, strbuf *b, uint32_t max_model_len);

/* POST /v1/load_lora_adapter and /v1/unload_lora_adapter bodies
 * ({"lora_name","lora_path"} / {"lora_name"}): run on the scheduler thread,
 * waiting for it (up to timeout_s). */
int coserve_load_request(coserve *c, const char *body, size_t len, double timeout_s,
                         strbuf *answer, api_error *e);
int coserve_unload_request(coserve *c, const char *body, size_t len, double timeout_s,
                           strbuf *answer, api_error *e);

/* Fine-tuning jobs share the hooks: take/done go to the runner, and its
 * tasks run after coserve's own (ft_runner.h). Call before the scheduler
 * starts. */
struct ft_runner;
void coserve_set_runner(coserve *c, struct ft_runner *r);

/* Serve engine adapter `id` (trained in this context; coserve owns it from
 * now on) as NAME from DIR. Scheduler thread only. */
int coserve_register(coserve *c, const char *name, const char *dir, uint32_t id,
                     char *err, size_t err_cap);

/* "sha256:..." of the base ("" when not computed). */
const char *coserve_fingerprint(const coserve *c);

/* Adapters loaded now (for metrics and logs). */
uint32_t coserve_adapter_count(coserve *c);

#endif
