/*
 * serve.h - `orch serve` as a library: load the model (a checkpoint through
 * an engine, or the mock engine's built-in model), size the KV pool, start
 * the HTTP front end (http.h) and the scheduler (scheduler.h), serve until
 * asked to stop, then drain and shut down in the one safe order.
 *
 * Clients: connections are limited in number (in all and per client
 * address; past either 503 at once) and in time (deadlines for the request
 * head, the body and a kept-alive connection's idle time that trickled
 * bytes do not extend); request bodies share a memory cap; Host, media type
 * and CORS are checked before a body is read (http.h, listener.h,
 * http_policy.h; the options below).
 * Start: the HTTP server listens first (API routes answer 503 "loading"),
 * then the model is opened (a MODEL that is not an orch checkpoint is
 * imported first), --max-model-len checked against its context, the KV pool
 * sized, the scheduler created (its warm-up forward runs), the chat template
 * chosen (chat_template_choose: --chat-template, else the checkpoint
 * directory's, then the given directory's tokenizer_config.json; a line
 * "chat template NAME (SOURCE)", or a warning when the model's template is
 * unsupported and chat requests will be refused), and the server set ready.
 * /v1/models reports the id, max_model_len (the context, or the
 * --max-model-len cap) and the architecture (gpt2, llama).
 * Drain (after a stop request): stop accepting (new API requests 503), let
 * running requests finish for up to drain_timeout seconds (a second stop
 * request ends the wait), then cancel what is left (503).
 * Shutdown (also after a failed start): the scheduler goes first (its destroy
 * finishes whatever is left, and no notify reaches the HTTP side after it
 * returns), then up to 5 s for answers still being sent, then the HTTP
 * server, the model, the metrics.
 *
 * Memory: serve_run owns everything it creates and frees it before
 * returning; the options' strings are borrowed.
 * Threads: serve_run blocks the calling thread; the hooks are called on it.
 * Errors: serve_run returns ORCH_EXIT_OK after a clean shutdown (also when
 * stopped before the model was ready), ORCH_EXIT_USAGE when the start failed
 * (bad checkpoint, engine, port, KV budget: message in err), ORCH_EXIT_FAILURE
 * when out of memory. Nothing is printed: progress lines and warnings go to
 * the log hook.
 */
#ifndef ORCH_SERVE_H
#define ORCH_SERVE_H

#include <stddef.h>
#include <stdint.h>

#include "engine_api/orch_engine.h"

#define SERVE_MAX_LIST 16 /* --allowed-host / --cors-origin values */

/* Integer options are uint64_t so that a flag parser can write them all the
 * same way; serve_run takes them as they are (ranges are the CLI's job). */
typedef struct serve_options {
    const char *ckpt;           /* run or checkpoint directory; NULL = the mock's model */
    const char *model;          /* MODEL (model_source.h): an orch checkpoint, a Hugging
                                   Face model directory or a GGUF file, imported into a
                                   temporary checkpoint while serving; NULL = ckpt */
    uint64_t max_model_len;     /* cap on prompt + completion tokens (<= the model's
                                   context); 0 = the context */
    const char *tokenizer;      /* tokenizer of a Hugging Face MODEL imported on the
                                   fly (model_source_open); NULL = its own */
    const char *engine;         /* NULL = the checkpoint config's (mock without ckpt) */
    const char *engine_options; /* NULL = the config's */
    const char *host;           /* NULL = 127.0.0.1 */
    const char *model_name;     /* NULL = serve_default_model_name(model or ckpt) or
                                   mock-gpt2 */
    const char *api_key;        /* NULL or "" = none */
    int threads;                /* engine threads; -1 = the config's (mock: 1) */
    int trust_config_engine;    /* the checkpoint config's engine may be a library
                                   path (INFERENCE_MODEL_TRUST_CONFIG_ENGINE) */
    uint64_t port;              /* 0 = any free port */
    uint64_t max_seqs;          /* running sequences */
    uint64_t max_batch_tokens;  /* tokens per scheduler iteration */
    uint64_t max_waiting;       /* waiting sequences before 429 */
    int no_prefix_cache;        /* 1: no prefix caching (scheduler.h) */
    uint64_t kv_blocks;         /* KV pool blocks; 0 = from kv_memory_mib */
    uint64_t kv_memory_mib;     /* KV pool budget when kv_blocks is 0 */
    uint64_t max_body;          /* request body limit, bytes */
    uint64_t max_body_memory_mib; /* all request bodies in flight together */
    uint64_t http_threads;        /* HTTP polling threads */
    uint64_t http_workers;        /* parsing / rendering threads */
    uint64_t drain_timeout;       /* seconds running requests get after a stop */
    /* Connections (listener.h): at most max_connections open, at most
     * max_connections_per_ip from one address (past either: 503 at once);
     * the whole request head within header_timeout_s of the accept, the
     * whole body within body_timeout_s of its head, the next request head on
     * a kept-alive connection within idle_timeout_s (408 and close). */
    uint64_t max_connections;
    uint64_t max_connections_per_ip;
    uint64_t header_timeout_s;
    uint64_t body_timeout_s;
    uint64_t idle_timeout_s;
    /* Host and CORS (http_policy.h): extra accepted Host names; origins that
     * get CORS headers ("*" = any). */
    const char *allowed_hosts[SERVE_MAX_LIST];
    size_t n_allowed_hosts;
    const char *cors_origins[SERVE_MAX_LIST];
    size_t n_cors_origins;
    /* --chat-template: a built-in's name or a Jinja file (chat_template.h);
     * NULL = the checkpoint's tokenizer_config.json template, else
     * orch-plain-v1 */
    const char *chat_template;
    /* --state-dir: where uploaded files (and later fine-tuning jobs and
     * adapters) persist; NULL = the files API is off */
    const char *state_dir;
    uint64_t max_upload_mib; /* --max-upload-mib: one uploaded file */
    /* --lora NAME=DIR: LoRA adapters (PEFT directories) served as models */
    const char *loras[SERVE_MAX_LIST];
    size_t n_loras;
    int enable_lora_loading; /* --enable-lora-loading: load/unload at run time */
    uint64_t max_loras;      /* --max-loras: adapters loaded at once */
    /* fine-tuning jobs inside the server (--state-dir, a LoRA engine) */
    double ft_lr;                 /* --ft-lr: base learning rate */
    uint64_t ft_rank;             /* --ft-rank */
    double ft_alpha;              /* --ft-alpha */
    const char *ft_targets;       /* --ft-targets (peft_targets_parse) */
    uint64_t ft_seq_len;          /* --ft-seq-len (0 = the model's context) */
    uint64_t ft_micro_batch;      /* --ft-micro-batch rows */
    uint64_t ft_checkpoint_every; /* --ft-checkpoint-every steps (0 = per epoch) */
    double slo_tpot_ms;           /* --slo-tpot-ms (0 = no target) */
    double slo_ttft_ms;           /* --slo-ttft-ms */
    const char *coserve_mode;     /* --coserve-mode shared (default) | temporal */
    const char *ft_granularity;   /* --ft-granularity auto (default) | token | sequence */
    uint64_t ft_chunk_tokens;     /* --ft-chunk-tokens (0: 8) */
    int ft_no_packing;            /* --ft-no-packing */
    const char *ft_flag_given;    /* the first fine-tuning/co-serving flag given (NULL:
                                     none); refused when there are no jobs */
} serve_options;

/* The defaults of `orch serve` (port 8080, 64 sequences, 2048 tokens per
 * iteration, 1024 waiting, 1024 MiB of KV, 4 MiB bodies, 256 MiB of bodies
 * in flight, 512 MiB per uploaded file, 1 HTTP thread, 2 workers, 30 s drain, 4096 connections, 1024
 * per address, deadlines 10 s head, 60 s body, 15 s keep-alive idle, threads
 * -1, no API key, no extra Host names, no CORS). */
void serve_options_default(serve_options *o);

typedef struct serve_hooks {
    /* A progress line without prefix ("listening on http://H:P (loading the
     * model)", "ready: ...", "draining (...)", "stopped") or, warning = 1, a
     * warning. May be NULL. */
    void (*log)(void *arg, int warning, const char *msg);
    /* Wait up to ms milliseconds for a stop request; 1 when one arrived (it
     * is consumed). Required. */
    int (*wait_stop)(void *arg, long ms);
    void *arg;
} serve_hooks;

int serve_run(const serve_options *o, const serve_hooks *h, char *err, size_t err_cap);

/* The model name for a checkpoint path: its last component, or the run
 * directory's for a ckpt-* directory; "orch-model" when that is empty or ".".
 * out gets at most 200 bytes. */
void serve_default_model_name(const char *path, char *out, size_t cap);

/* The mock engine's built-in model: GPT-2 shape, vocabulary 256 (byte
 * tokenizer), context 1024, 2 layers, 2 heads, width 64, MLP 256. */
orch_model_desc serve_mock_model_desc(void);

/* KV pool size in blocks of ORCH_KV_BLOCK_TOKENS: the budget kv_memory_mib
 * over block_bytes, at most what max_seqs full contexts need, at most
 * INT32_MAX. Returns 0, or -1 with a message when the budget does not hold
 * one full context. */
int serve_kv_pool_blocks(uint64_t kv_memory_mib, uint64_t block_bytes, uint32_t context,
                         uint64_t max_seqs, uint64_t *blocks, char *err, size_t err_cap);

#endif
