/*
 * config.h - the orch run configuration: one JSON document (cJSON) with the
 * sections `model`, `train`, `data` and `engine`, command-line overrides
 * (`--set a.b=value`), validation with errors that name the JSON path, defaults
 * for optional keys, and serialisation back to JSON (for state.json).
 *
 * Schema (R = required, otherwise the default shown):
 *   model:  arch "gpt2" (gpt2|llama), vocab_size R, context R, layers R,
 *           heads R, width R, mlp_width 4*width, layernorm_eps 1e-5,
 *           kv_heads = heads (llama: must divide heads; gpt2: = heads),
 *           llama only (refused for gpt2, naming the key):
 *             rope_theta 10000 (> 1), an even head size width/heads,
 *             tie_embeddings false (true: the LM head is the embedding, as
 *               HF's tie_word_embeddings; gpt2 ties always, so only true is
 *               accepted there),
 *             rope_scaling none: null or {"type": "linear"|"llama3",
 *               "factor" R (> 0), and for llama3 "low_freq_factor" R (> 0),
 *               "high_freq_factor" R (> low_freq_factor),
 *               "original_context" R (> 0; HF's
 *               original_max_position_embeddings)}
 *           An engine of ABI minor 0 never gets a llama model
 *           (engine_create_context refuses it).
 *   train:  micro_batch R, seq_len R (<= model.context), grad_accum 1,
 *           max_steps R unless epochs is given (exclusive), epochs (> 0),
 *           lr R (> 0), min_lr 0 (0 <= min_lr <= lr), warmup_steps 0,
 *           schedule "cosine" (cosine|linear|constant), weight_decay 0.0,
 *           beta1 0.9, beta2 0.95, eps 1e-8, grad_clip 1.0 (0 = off),
 *           seed 1337, eval_every 100 (0 = only at the end), eval_batches 8,
 *           checkpoint_every 0 (0 = only at the end), keep_checkpoints 3,
 *           early_stop_patience 0 (0 = off; counted in evaluations),
 *           zero 0 (0|1: ZeRO-1 sharded optimizer state, see dist.h),
 *           overlap_allreduce true (data parallel: reduce gradients during
 *             the last micro-batch's backward; ignored with zero 1),
 *           allreduce_bucket_mb 25 (0 < MiB <= 1024; gradient all-reduce
 *             bucket, see dist.h)
 *   data:   tokenizer R (byte|gpt2), train R (shard glob), val R (shard glob)
 *           Relative paths are relative to the current directory of the
 *           process reading the config. `orch train` makes them absolute
 *           (config_absolute_data_paths) before it stores the merged config
 *           in config.json and in every checkpoint's state.json, so
 *           `orch eval/generate/serve --checkpoint DIR` work from any
 *           directory. (The tokenizer is stored by kind only; the GPT-2
 *           vocabulary is found by the search in tokenizer.h.)
 *   engine: name "cpu", threads 0 (all cores), options ""
 *           (any --engine value is stored, but a name read back from a
 *           config file or a checkpoint is only loaded when it is mock, cpu
 *           or cuda, unless --trust-config-engine: engine_check_config_name
 *           in engine_loader.h)
 * Unknown keys anywhere are errors (the message names the nearest valid key).
 * model.vocab_size must cover the tokenizer (256 byte, 50257 gpt2).
 *
 * Error messages have the form "PATH: PROBLEM", e.g.
 *   "train.lrr: unknown key (did you mean train.lr?)"
 *   "train.lr: expected a number, got a string"
 *   "model.heads: 5 does not divide model.width (768)"
 *   "train.seq_len: 2048 exceeds model.context (1024)"
 *   "model.width: missing required key"
 * Functions that read a file prefix the message with "FILE: ".
 *
 * The model section is kept exactly as given (after overrides): serialising
 * never adds defaults to it. The other sections are serialised complete, with
 * defaults filled in, so a resumed run uses the same values even if defaults
 * change.
 *
 * Memory: an orch_config is allocated by the loaders below and released with
 * config_free (NULL is fine). Strings in the struct are owned by it.
 * Threads: a config is immutable after loading except through
 * config_apply_overrides; concurrent reads are safe.
 * Errors: every fallible function returns 0 / -1 and writes one line to err
 * (util_set_err); on failure the outputs are untouched.
 */
#ifndef ORCH_CONFIG_H
#define ORCH_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "engine_api/orch_engine.h"

#define CONFIG_PATH_MAX 4096

typedef struct config_model {
    char arch[16]; /* "gpt2" | "llama" */
    uint32_t vocab_size;
    uint32_t context;
    uint32_t layers;
    uint32_t heads;
    uint32_t kv_heads; /* = heads when not given */
    uint32_t width;
    uint32_t mlp_width; /* = 4*width when not given */
    double layernorm_eps;
    double rope_theta;  /* llama: 10000 when not given; gpt2: 0 */
    int tie_embeddings; /* 1: head tied to the embedding (gpt2 always) */
    char rope_type[16]; /* "" (none) | "linear" | "llama3" */
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    uint32_t rope_original_context;
} config_model;

typedef struct config_train {
    uint32_t micro_batch;
    uint32_t seq_len;
    uint32_t grad_accum;
    uint64_t max_steps; /* 0 when epochs is used instead (see train.h) */
    double epochs;      /* 0 when max_steps is used */
    double lr;
    double min_lr;
    uint64_t warmup_steps;
    char schedule[16]; /* "cosine" | "linear" | "constant" */
    double weight_decay;
    double beta1;
    double beta2;
    double eps;
    double grad_clip;
    uint64_t seed;
    uint64_t eval_every;
    uint32_t eval_batches;
    uint64_t checkpoint_every;
    uint32_t keep_checkpoints;
    uint32_t early_stop_patience;
    uint32_t zero;         /* 1: ZeRO-1, AdamW moments sharded over the ranks (dist.h) */
    int overlap_allreduce; /* all-reduce during the last backward (dist.h) */
    double allreduce_bucket_mb; /* MiB of f32 per all-reduce bucket (dist.h) */
} config_train;

typedef struct config_data {
    char tokenizer[16];          /* "byte" | "gpt2" */
    char train[CONFIG_PATH_MAX]; /* shard glob */
    char val[CONFIG_PATH_MAX];   /* shard glob */
} config_data;

typedef struct config_engine {
    char name[CONFIG_PATH_MAX]; /* --engine value: mock|cpu|cuda|FILE
                                   (FILE: see engine_check_config_name) */
    uint32_t threads;
    char options[1024];
} config_engine;

typedef struct orch_config {
    config_model model;
    config_train train;
    config_data data;
    config_engine engine;
    char source[CONFIG_PATH_MAX]; /* file name or "<text>" */
    void *doc;                    /* private: the merged cJSON document */
} orch_config;

/* Read, parse and validate a config file. *out is a new config (config_free).
 * Errors are "FILE: PATH: PROBLEM" (or "FILE: line L, column C: invalid
 * JSON ..."). */
int config_load_file(const char *path, orch_config **out, char *err, size_t err_cap);

/* The same for JSON text (e.g. the "config" object of a checkpoint's
 * state.json printed as text). `origin` names it in errors (may be NULL). */
int config_parse_text(const char *text, const char *origin, orch_config **out, char *err,
                      size_t err_cap);

/* The same from a parsed cJSON object (const cJSON *, passed as void * so this
 * header does not need cJSON.h). The object is copied, not kept. */
int config_from_cjson(const void *json_object, const char *origin, orch_config **out,
                      char *err, size_t err_cap);

/* Apply overrides "a.b=value" in order (value parsed as JSON when it parses,
 * else taken as a string; for string-typed keys the raw text is used unless
 * it is a quoted JSON string; the value null removes the key, restoring its
 * default), then re-validate everything. On failure cfg is
 * unchanged. Errors name the override: "--set train.lr=x: train.lr: ...". */
int config_apply_overrides(orch_config *cfg, const char *const *sets, size_t n_sets,
                           char *err, size_t err_cap);

/* Make relative data.train and data.val absolute: the directory part of the
 * glob (before its first wildcard) resolved with realpath(3) when it exists,
 * else the pattern joined to the current directory; e.g. "data/train_*.bin"
 * -> "/home/u/proj/data/train_*.bin". Absolute paths are left alone. Then
 * re-validates (as config_apply_overrides). On failure cfg is unchanged. */
int config_absolute_data_paths(orch_config *cfg, char *err, size_t err_cap);

/* Fill *desc (struct_size set, reserved zero) from the model section,
 * llama's ABI 1.1 members included (ORCH_MODEL_FLAG_UNTIED_HEAD unless
 * tie_embeddings, rope_scaling and its parameters). */
void config_model_desc(const orch_config *cfg, orch_model_desc *desc);

/* The merged config as pretty-printed JSON text, malloc'd, caller frees;
 * NULL on allocation failure. */
char *config_to_json(const orch_config *cfg);

/* The merged config as a new cJSON object (returned as void *, really a
 * cJSON *), owned by the caller (cJSON_Delete); NULL on allocation failure. */
void *config_to_cjson(const orch_config *cfg);

/* True (1) when the two configs have identical model sections. */
int config_same_model(const orch_config *a, const orch_config *b);

/* A deep copy (config_free it); NULL on allocation failure. */
orch_config *config_clone(const orch_config *cfg);

void config_free(orch_config *cfg);

/* Levenshtein edit distance between two ASCII strings (exposed for tests). */
size_t config_edit_distance(const char *a, const char *b);

#endif
