/*
 * engine_common.h - engine-side code that the mock, cpu and cuda engines share
 * (compiled into each engine .so, hidden like the rest of the engine): the
 * status strings of the ABI, the caller-buffer error helpers, the GPT-2 model
 * description rules, tensor table and initialisation rule, the AdamW
 * constants and the "key=value" options parser. The argument checks of the
 * ABI calls are in engine_checks.h.
 *
 * Error rule: a function that can fail fills the caller buffer err
 * (NUL-terminated, truncated to err_cap; err may be NULL) and returns an
 * orch_status only on failure; on success it writes nothing to err. Each
 * engine passes its context's last_error buffer (ENGINE_FAIL does that) or
 * the caller's buffer of context_create.
 * Memory: nothing here allocates or keeps pointers past a call.
 * Threads: no globals are written; every function is thread-safe.
 * Includable from C11 and from C++ (nvcc compiles the cuda engine, which
 * includes this header); never included by the orchestrator; includes no
 * orchestrator header.
 */
#ifndef ORCH_ENGINE_COMMON_H
#define ORCH_ENGINE_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "engine_api/orch_engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status strings and errors ---- */

/* Static English text of an orch_status ("unknown status" for others). */
const char *engine_status_string(int32_t status);

/* Format into err (if err && cap) and return status. */
int32_t engine_fail_buf(char *err, size_t cap, int32_t status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The `char *err, size_t cap` arguments naming the last_error array of an
 * engine context (ctx not NULL; sizeof gives the array's capacity), for the
 * checks of engine_checks.h: engine_check_x(..., ENGINE_ERRBUF(ctx)). */
#define ENGINE_ERRBUF(ctx) (ctx)->last_error, sizeof(ctx)->last_error

/* engine_fail_buf into the last_error of an engine context:
 * ENGINE_FAIL(ctx, status, fmt, ...) returns status. */
#define ENGINE_FAIL(ctx, ...) engine_fail_buf(ENGINE_ERRBUF(ctx), __VA_ARGS__)

/* optimizer_step found a NaN/Inf gradient norm: the common message, and
 * ORCH_ERR_NUMERIC. */
int32_t engine_fail_nonfinite_norm(char *err, size_t cap);

/* ---- model description ---- */

/* What one engine accepts; every value is an inclusive upper bound. */
typedef struct engine_model_limits {
    const char *engine; /* "cpu", "mock", "cuda": named in messages */
    uint32_t max_vocab, max_context, max_layers, max_width, max_mlp_width;
    int llama; /* nonzero: the engine runs ORCH_ARCH_LLAMA */
} engine_model_limits;

/* context_create: validate *in and fill *out with the defaults applied
 * (mlp_width 0 -> 4*width, layernorm_eps 0 -> 1e-5, kv_heads = heads),
 * accepting descriptions of older callers that end after `width` (absent
 * members read as 0). In order: NULL, struct_size, arch (llama is
 * ORCH_ERR_UNSUPPORTED unless lim->llama), sizes > 0, sizes within lim, heads
 * dividing width; gpt2: kv_heads (ORCH_ERR_UNSUPPORTED unless 0 or heads) and
 * the llama-only members all 0; llama: kv_heads dividing heads (0 -> heads),
 * even head size, known flags, rope_theta (0 -> 10000) and rope scaling
 * (linear: factor 0 -> 1); then mlp_width, layernorm_eps, parameter count.
 * *out is written only on success. */
int32_t engine_model_normalise(const orch_model_desc *in, const engine_model_limits *lim,
                               orch_model_desc *out, char *err, size_t cap);

/* Number of parameters of the GPT-2 table of the normalised description m:
 * 0 and *out, or -1 when the count overflows 64 bits. */
int engine_gpt2_param_count(const orch_model_desc *m, uint64_t *out);

/* The same for the LLaMA table (normalised m). */
int engine_llama_param_count(const orch_model_desc *m, uint64_t *out);

/* The count of m's architecture (gpt2 or llama). */
int engine_model_param_count(const orch_model_desc *m, uint64_t *out);

/* This machine's physical memory in bytes, 0 when unknown. */
uint64_t engine_host_memory_bytes(void);

/* ---- GPT-2 tensor table ---- */

/* One tensor of an engine's table (same for PARAM, ADAM_M, ADAM_V). */
typedef struct engine_tensor {
    char name[ORCH_TENSOR_NAME_MAX];
    uint32_t ndim;
    uint32_t flags;    /* ORCH_TENSOR_FLAG_NO_DECAY for 1-D tensors */
    uint64_t shape[2]; /* shape[1] is 0 for 1-D tensors */
    uint64_t numel;
    uint64_t offset; /* element offset in the flat buffers */
} engine_tensor;

/* Tensors per layer, in table order after wte, wpe: ln_1.weight, ln_1.bias,
 * attn.c_attn.weight, attn.c_attn.bias, attn.c_proj.weight, attn.c_proj.bias,
 * ln_2.weight, ln_2.bias, mlp.c_fc.weight, mlp.c_fc.bias, mlp.c_proj.weight,
 * mlp.c_proj.bias. */
#define ENGINE_GPT2_PER_LAYER 12u

/* Number of tensors of the GPT-2 table: 2 + 12*layers + 2. */
uint32_t engine_gpt2_tensor_count(uint32_t layers);

/* Fill out[0 .. engine_gpt2_tensor_count(layers)) with the GPT-2 table of the
 * header (names, shapes, NO_DECAY flags, offsets); returns the total element
 * count. Sizes must have been checked for overflow by the caller. */
uint64_t engine_gpt2_table_fill(engine_tensor *out, uint32_t layers, uint64_t vocab,
                                uint64_t context, uint64_t width, uint64_t mlp_width);

/* ---- LLaMA tensor table (the header's names, order and shapes) ---- */

/* Tensors per layer, after model.embed_tokens.weight: input_layernorm,
 * q_proj, k_proj, v_proj, o_proj, post_attention_layernorm, gate_proj,
 * up_proj, down_proj. */
#define ENGINE_LLAMA_PER_LAYER 9u

/* Number of tensors: 1 + 9*layers + 1 (+ 1 lm_head with an untied head). */
uint32_t engine_llama_tensor_count(uint32_t layers, uint32_t flags);

/* Fill out[0 .. engine_llama_tensor_count) for the normalised m; returns the
 * total element count (checked by engine_model_normalise). */
uint64_t engine_llama_table_fill(engine_tensor *out, const orch_model_desc *m);

/* The table of m's architecture: count and fill (as the two above or the
 * GPT-2 ones). */
uint32_t engine_model_tensor_count(const orch_model_desc *m);
uint64_t engine_model_table_fill(engine_tensor *out, const orch_model_desc *m);

/* RoPE inverse frequencies of the normalised llama m: out[0 .. D/2), D =
 * width/heads, computed in double as the header states (rope_theta and
 * rope_scaling), rounded to float. Every engine uses these values. */
void engine_rope_inv_freq(const orch_model_desc *m, float *out);

/* Describe t into *out, at most out->struct_size bytes (caller checked that
 * out is non-NULL with struct_size >= 4); dtype f32. */
void engine_tensor_info_fill(const engine_tensor *t, orch_tensor_info *out);

/* ---- GPT-2 initialisation (the ABI rule) ---- */

/* Standard deviation of the N(0, std) draws of 2-D tensor t: 0.02, and
 * 0.02/sqrt(2*layers) for the residual projections (gpt2 attn.c_proj.weight,
 * mlp.c_proj.weight; llama self_attn.o_proj.weight, mlp.down_proj.weight).
 * Serves both architectures. */
double engine_gpt2_init_std(const engine_tensor *t, uint32_t layers);

/* The constant of 1-D tensor t: 1 for norm weights (LayerNorm, RMSNorm), 0
 * for biases. Serves both architectures. */
float engine_gpt2_init_value(const engine_tensor *t);

/* The two functions below are inline so that CUDA kernels call them too
 * (nvcc compiles them for host and device): the cpu and cuda engines draw the
 * same initial weights from the same stream. */
#ifdef __CUDACC__
#define ENGINE_HOST_DEVICE __host__ __device__
#else
#define ENGINE_HOST_DEVICE
#endif

/* Output k (0-based) of the splitmix64 stream seeded with seed (the stream
 * `s += 0x9E3779B97F4A7C15; mix(s)` after k+1 steps). */
static inline ENGINE_HOST_DEVICE uint64_t engine_splitmix64_at(uint64_t seed,
                                                               uint64_t k) {
    uint64_t z = seed + (k + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* x as a double uniform in (0, 1]: ((x >> 11) + 1) / 2^53. */
static inline ENGINE_HOST_DEVICE double engine_unit(uint64_t x) {
    return ((double)(x >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

/* Box-Muller: the two N(0, std) draws of the stream outputs x1, x2 (through
 * engine_unit): *a = std*r*cos(th), *b = std*r*sin(th). */
void engine_normal_pair(uint64_t x1, uint64_t x2, double std, float *a, float *b);

/* ---- AdamW ---- */

/* AdamW constants of one step, in the form the cpu and cuda kernels use. */
typedef struct engine_adamw_consts {
    float beta1, beta2, one_minus_beta1, one_minus_beta2;
    float decay;        /* 1 - lr*weight_decay, or 1 for NO_DECAY tensors */
    float step_size;    /* lr / (1 - beta1^t) */
    float inv_bc2_sqrt; /* 1 / sqrt(1 - beta2^t) */
    float eps;
    float gscale; /* gradient scale of clipping (1: none) */
} engine_adamw_consts;

/* The constants of step p->step (validated p), with decay and gscale 1. */
void engine_adamw_consts_init(const orch_adamw_params *p, engine_adamw_consts *c);

/* The decay factor of a tensor with these flags: 1 for NO_DECAY tensors,
 * else 1 - lr*weight_decay. */
float engine_adamw_decay(const orch_adamw_params *p, uint32_t tensor_flags);

/* Clipping (torch.nn.utils.clip_grad_norm_): grad_clip/norm when grad_clip > 0
 * and the finite norm exceeds it, else 1. */
float engine_grad_clip_scale(const orch_adamw_params *p, double norm);

/* ---- options strings ---- */

/* One item of an options string: text between ',' / ';' separators, trimmed
 * of spaces. key is the part before the first '=' (or the whole item when
 * there is none, has_eq 0), value the part after it (empty without '='), both
 * trimmed. */
typedef struct engine_opt_item {
    const char *item;
    size_t item_len;
    const char *key;
    size_t key_len;
    const char *value;
    size_t value_len;
    int has_eq;
} engine_opt_item;

/* Advance *cursor to the next non-empty item; 1 and *it filled, or 0 at the
 * end of the string. */
int engine_opts_next(const char **cursor, engine_opt_item *it);

/* 1 when the len bytes at s are exactly the string word. */
int engine_opt_is(const char *s, size_t len, const char *word);

/* Parse len decimal digits (1..19 of them) into *out: 0, or -1 if not a number. */
int engine_parse_u64(const char *s, size_t len, uint64_t *out);

/* One key of an engine's options. */
typedef struct engine_opt_spec {
    const char *key;
    const char *choices; /* "a|b|c": the value is one of these words and its
                            index is stored; NULL: an integer in min..max */
    uint64_t min, max;
} engine_opt_spec;

/* Parse the options string s (NULL: nothing) of engine `engine` against
 * spec[0..n_spec): for every item, values[k] receives the value of key k
 * (the integer, or the index of the word) and given[k] is set to 1; keys that
 * are absent leave both alone; a key given twice keeps the last value.
 * Errors (ORCH_ERR_INVALID_ARGUMENT): an item that is not key=value, an
 * unknown key (the message lists the known ones), a value out of range. */
int32_t engine_opts_parse(const char *s, const char *engine, const engine_opt_spec *spec,
                          size_t n_spec, uint64_t *values, uint8_t *given, char *err,
                          size_t cap);

#ifdef __cplusplus
}
#endif
#endif /* ORCH_ENGINE_COMMON_H */
