/*
 * inference_model.h - open a checkpoint for inference: resolve the run
 * directory to its newest verified checkpoint, read the config from its
 * state.json, load the engine, create a context, load the weights and
 * (optionally) open the tokenizer. Used by `orch generate`, `orch eval` and
 * `orch serve`.
 *
 * Memory: an open inference_model owns its config, engine handle, context and
 * tokenizer; inference_model_close releases them all.
 * Threads: one thread at a time per model (the engine context rule).
 * Errors: 0 / -1 with a one-line message in err; nothing is printed.
 */
#ifndef ORCH_INFERENCE_MODEL_H
#define ORCH_INFERENCE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "orchestrator/core/config.h"
#include "orchestrator/core/engine_loader.h"
#include "orchestrator/data/tokenizer.h"

/* A model ready for inference or evaluation: checkpoint resolved and
 * verified, config read from its state.json, engine loaded, context created,
 * weights loaded, tokenizer opened. Shared by `orch generate` and `orch eval`
 * (and usable by serve). */
typedef struct inference_model {
    char ckpt_dir[4096];  /* the checkpoint actually used */
    uint64_t step;        /* its step */
    orch_config *cfg;     /* merged config from state.json (owned) */
    engine_handle engine; /* loaded engine (owned) */
    orch_engine_ctx *ctx; /* context with the weights (owned) */
    orch_model_desc desc;
    tokenizer *tok; /* NULL without INFERENCE_MODEL_TOKENIZER (owned) */
} inference_model;

/* inference_model_opts.flags */
#define INFERENCE_MODEL_TOKENIZER 1u /* also open the config's tokenizer */
#define INFERENCE_MODEL_TRUST_CONFIG_ENGINE \
    2u /* --trust-config-engine: the config's engine.name may be a library \
          file or path */

typedef struct inference_model_opts {
    const char *checkpoint; /* run dir or checkpoint dir (required) */
    const char *engine;     /* NULL = the config's engine.name (from the
                               command line: any name, file or path) */
    int threads;            /* < 0 = the config's engine.threads */
    const char *options;    /* NULL = the config's engine.options; "+S" =
                               those (or "" with another --engine) followed
                               by S (--quantize adds weights=int8 so) */
    unsigned flags;         /* INFERENCE_MODEL_* bits */
} inference_model_opts;

/* Open everything. Without o->engine the checkpoint config's engine.name
 * is used, and it must be a built-in engine name unless flags has
 * INFERENCE_MODEL_TRUST_CONFIG_ENGINE ("DIR/state.json: config engine.name
 * 'x.so' is a library path; ...", engine_check_config_name): the library is
 * then not opened at all.
 * warn (may be NULL) receives a fallback warning from ckpt_find_latest (""
 * when none). On failure *m is left zeroed and nothing is held. */
int inference_model_open(const inference_model_opts *o, inference_model *m, char *warn,
                         size_t warn_cap, char *err, size_t err_cap);
/* Release everything (safe on a zeroed struct). */
void inference_model_close(inference_model *m);

/* The --quantize choices of generate, serve and eval, for --help. */
#define INFERENCE_QUANTIZE_CHOICES "int8, fp32"

/* The engine options for `--quantize WORD` given the command's own options
 * (NULL = the config's): WORD NULL returns options unchanged; "int8" or
 * "fp32" appends "weights=WORD" (to options, or as "+weights=WORD" to the
 * config's: see inference_model_opts.options; the last key wins, so it
 * overrides a weights= already there) into buf and returns buf.
 * Another word: NULL with "--quantize: unknown format 'W' (choices: int8,
 * fp32)" in err. Whether the engine supports the format is the engine's to
 * say (its context_create error). */
const char *inference_model_quantize_options(const char *word, const char *options,
                                             char *buf, size_t cap, char *err,
                                             size_t err_cap);

/* The --kv-cache-dtype choices of generate, serve and bench, for --help. */
#define INFERENCE_KV_DTYPE_CHOICES "auto, f32, bf16, int8"

/* The engine options for `--kv-cache-dtype WORD`, as
 * inference_model_quantize_options does for --quantize: WORD NULL or
 * "auto" returns options unchanged (the engine's default: the cpu engine
 * stores bf16 with weights=int8, f32 otherwise); "f32", "bf16" or "int8"
 * appends "kv=WORD" (options may already be buf, e.g. the result of
 * inference_model_quantize_options). Another word: NULL with
 * "--kv-cache-dtype: unknown type 'W' (choices: auto, f32, bf16, int8)". An
 * engine without the option refuses it at context_create ("unknown option
 * 'kv=bf16'"). */
const char *inference_model_kv_options(const char *word, const char *options, char *buf,
                                       size_t cap, char *err, size_t err_cap);

#endif
