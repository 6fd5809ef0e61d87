/*
 * mock_engine.c - the mock engine (libengine_mock.so): implements every call of
 * the orch engine ABI (engine_api/orch_engine.h) deterministically, in plain C
 * with no numeric library, so the orchestrator's training, checkpoint and
 * serving paths can be tested fast and exactly. engines/mock/README.md repeats
 * the rules below for test writers.
 *
 * Capabilities: TRAIN | INFER | KV_COPY | EVAL | DETERMINISTIC | FAULT_INJECTION |
 * LORA.
 *
 * Architectures: gpt2 and llama (ABI 1.1: grouped-query kv_heads, untied
 *   head flag, RoPE members validated by engine_model_normalise; the mock has
 *   no numerics, so RoPE values only need to be valid).
 *
 * Tensors
 *   Real tables (PARAM, ADAM_M, ADAM_V) with the GPT-2 or LLaMA names, shapes
 *   and order of the header (engine_model_table_fill), in real memory, so
 *   contents round-trip and a checkpoint written through the mock loads
 *   through any other engine. 1-D tensors (biases, LayerNorm and RMSNorm
 *   weights) carry ORCH_TENSOR_FLAG_NO_DECAY.
 *   Initialisation follows the header (N(0,0.02) weights, N(0,0.02/sqrt(2L))
 *   for the residual projections, zero biases, norm weights 1). Tensor i draws from its own splitmix64 stream seeded with
 *   opts->seed + (i+1) * 0x9E3779B97F4A7C15, row-major, Box-Muller pairs, so a
 *   tensor can be initialised on its own: the mock does it lazily, on the
 *   first call that reads it (inference never does), and a full tensor_write
 *   skips it. The values do not depend on the order of calls.
 *
 * Loss (forward_backward, eval_loss)
 *   For every target position (b,t) with x = tokens[b,t], y = targets[b,t],
 *   y != -1, C = width, V = vocab_size:
 *     z   = A[x, y mod C] + B[y, x mod C] + P[r, (x+y) mod C] + N[y mod C] + z0
 *           (sum in double of f32 entries)
 *     l   = 2 ln(V) * sigmoid(z)               (ln V at init, like real CE)
 *   gpt2:  A = B = wte.weight, P = wpe.weight with r = t, N = ln_f.bias, z0 = 0.
 *   llama: A = model.embed_tokens.weight, B = lm_head.weight when the head is
 *          untied (else A), P = model.layers.0.self_attn.q_proj.weight with
 *          r = t mod C, N = model.norm.weight, z0 = -1 (N starts at 1).
 *   loss = mean of l over the n counted positions (0 when n = 0, no gradient).
 *   forward_backward ADDS grad_scale * dloss/dparam to the gradient buffer:
 *   each of the four entries gets grad_scale * 2 ln(V) s (1-s) / n (as f32),
 *   s = sigmoid(z). AdamW therefore pushes z down and the loss falls step by
 *   step. Cost O(batch*seq) per call.
 *
 * Optimizer (optimizer_step): AdamW as the header says, in PyTorch's order:
 *   norm = sqrt(sum g^2) (double); non-finite -> ORCH_ERR_NUMERIC, no change;
 *   if grad_clip > 0 and norm > grad_clip the gradient BUFFER is scaled by
 *   grad_clip/norm (like torch.nn.utils.clip_grad_norm_); then per element
 *   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
 *   p = p (1 - lr wd)  [skipped for NO_DECAY tensors];
 *   p = p - lr (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps),   t = params->step.
 *
 * Inference and the KV cache
 *   kv_configure allocates a pool; each slot (block, offset) stores the token
 *   id written at that position plus a written flag: the mock's "K/V". A
 *   llama slot stores the id once per KV head (kv_heads entries, so blocks
 *   are sized by kv_heads as a real engine's are), and position p is read
 *   back from KV head p mod kv_heads; kv_block_bytes is block_size *
 *   (4 * entries + 1) plus a small per-block mark.
 *   infer_forward validates the whole batch first (token range, start_pos +
 *   n_tokens <= context, block ids in the pool, enough blocks, logits_cap,
 *   adapter_id 0 or an adapter of the context (see LoRA below), no block
 *   written by one sequence and used by another, every earlier position
 *   0..start_pos-1 already written), then writes the
 *   new token ids into their slots through the block table, then computes
 *   logits from token ids READ BACK through the block table:
 *     S(p)  = sum of the token ids at positions 0..p (inclusive)
 *     next  = 97 + (S mod 26)   if vocab_size >= 123 (a lowercase ASCII letter)
 *             S mod vocab_size  otherwise
 *     logit[v] = -|v - next|    (float; greedy picks `next`)
 *   Reading a slot that was never written is ORCH_ERR_STATE naming the block
 *   and slot. kv_copy_blocks copies slot contents and written flags.
 *
 * Fault injection (options string of context_create, and environment
 * variables read at create; the string's sleep_ms wins over the variable,
 * faults from both apply):
 *   fault=CALL:N     the Nth call (from 1, per context) of ABI function CALL
 *                    returns ORCH_ERR_INTERNAL "injected fault in CALL (call N)"
 *   fault=CALL:N+    every call from the Nth on fails the same way
 *   sleep_ms=N       sleep N ms at the start of every infer_forward and
 *                    forward_backward
 *   cost_us_per_token=N   cost model for serving benchmarks: every
 *                    infer_forward sleeps N us per prompt token it computes
 *                    (a sequence entry of 2 or more tokens is prompt; a
 *                    cached prefix is not forwarded, so it costs nothing)
 *   cost_us_per_decode=M  ... and M us per decoded token (an entry of one
 *                    token); the sleep is the sum over the batch (at most
 *                    600 s)
 *   ORCH_MOCK_FAULT=CALL:N[+][,CALL:N[+]...]   ORCH_MOCK_SLEEP_MS=N
 *   ORCH_MOCK_COST_US_PER_TOKEN=N   ORCH_MOCK_COST_US_PER_DECODE=M
 *   (the options string's values win over the variables)
 *   CALL is one of the context calls: tensor_count tensor_info tensor_read
 *   tensor_write grads_zero grads_read grads_write forward_backward
 *   optimizer_step eval_loss kv_block_bytes kv_configure infer_forward
 *   kv_copy_blocks coserve_step. Unknown keys or bad values ->
 *   ORCH_ERR_INVALID_ARGUMENT.
 *   (The ABI 1.2 calls take no faults.)
 *
 * ABI 1.3: forward_backward_notify is forward_backward (its fault counter
 * "forward_backward", sleep and checks) followed by one ready() per tensor
 * in reverse table order (ranges disjoint, covering the flat buffer).
 *
 * ABI 1.2 (ZeRO-1): param_read/param_write of the flat parameters (lazy
 * tensors are initialised first); optimizer_shard reallocates the moments to
 * the shard (optimizer_bytes = 8 bytes x shard elements); optimizer_step_range
 * runs optimizer_step's per-element update on its range with g * clip scale
 * computed per element (the same f32 product optimizer_step gets by scaling
 * the buffer first), so a 2-way sharded step gives optimizer_step's bits
 * when handed the same norm.
 *
 * LoRA adapters (ABI 1.4, ORCH_CAP_LORA; not coserve_forward): an
 *   adapter's table follows the header (layer by layer, targets in the
 *   order qkv, attn out, mlp up, mlp down; per base matrix W [out,in]
 *   "<W minus .weight>.lora_A.weight" [rank,in] then ".lora_B.weight"
 *   [out,rank], f32, no flags). A: the element at flat offset k of the
 *   adapter's buffer is (2u - 1)/sqrt(in), u = (splitmix64(seed, k) >> 11)
 *   / 2^53 in [0, 1) (the CPU engine's stream: one seed, one A); B starts
 *   at zero.
 *   Loss through an adapter (adapter_forward_backward, adapter_eval_loss):
 *   the base z above plus, for every (A, B) pair of the table,
 *   (alpha/rank) * sum_k B[y mod out, k] A[k, x mod in] (0 at init, since
 *   B = 0); gradients go to the adapter only (B first moves along A, then
 *   A along B), the base's gradients, moments and weights are never
 *   touched. adapter_optimizer_step is optimizer_step's AdamW over the
 *   adapter's buffers (A and B have no NO_DECAY flag). rank must be
 *   1..min(in, out) of every target matrix, alpha finite > 0, targets a
 *   non-empty subset of ORCH_LORA_TARGET_ALL; each error names the field.
 *   Inference: a sequence may name an adapter of the context (an unknown
 *   id is ORCH_ERR_INVALID_ARGUMENT); the logits (below) do not read
 *   weights, so they are the base's, which are those of the merged
 *   weight. The adapter calls take no faults.
 *
 * Streams (ABI 1.5, ORCH_CAP_FT_STREAM): token-level fine-tuning with the
 *   header's rules (rows forward in order, then backward in reverse;
 *   adapter_tensor_write of PARAM, adapter_optimizer_step and
 *   adapter_destroy refused with ORCH_ERR_STATE while a stream is open on
 *   the adapter). A forward row adds its loss term; the gradient of the
 *   micro-batch is added when the last backward row is done, by the same
 *   loop as adapter_forward_backward, so a stream gives its bits exactly
 *   (the mock's rows are independent). coserve_step runs its inference
 *   batch as infer_forward does (sleep and cost model included) and takes
 *   faults as "coserve_step".
 *
 * Errors: every call validates its arguments (NULL pointers, sizes, ranges)
 * and returns a status with a last_error message; out-parameters and state are
 * untouched on failure. Threads: a context is used by one thread at a time;
 * the engine starts no threads. get_api, probe and status_string are
 * thread-safe (no mutable globals).
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine_api/orch_engine.h"
#include "engines/common/engine_checks.h"
#include "engines/common/engine_common.h"
#include "engines/common/engine_lora.h"

#define MOCK_VERSION      "mock 1.0"
#define MOCK_MAX_LAYERS   4096u
#define MOCK_MAX_FAULTS   16u
#define MOCK_MAX_SLEEP_MS 600000u

/* ------------------------------------------------------------------------- */
/* Context                                                                    */
/* ------------------------------------------------------------------------- */

/* The context calls that can be counted and failed by fault injection. */
enum mock_call {
    CALL_TENSOR_COUNT,
    CALL_TENSOR_INFO,
    CALL_TENSOR_READ,
    CALL_TENSOR_WRITE,
    CALL_GRADS_ZERO,
    CALL_GRADS_READ,
    CALL_GRADS_WRITE,
    CALL_FORWARD_BACKWARD,
    CALL_OPTIMIZER_STEP,
    CALL_EVAL_LOSS,
    CALL_KV_BLOCK_BYTES,
    CALL_KV_CONFIGURE,
    CALL_INFER_FORWARD,
    CALL_KV_COPY_BLOCKS,
    CALL_COSERVE_STEP,
    CALL_COUNT
};

static const char *const call_names[CALL_COUNT] = {
    "tensor_count",   "tensor_info",  "tensor_read",      "tensor_write",   "grads_zero",
    "grads_read",     "grads_write",  "forward_backward", "optimizer_step", "eval_loss",
    "kv_block_bytes", "kv_configure", "infer_forward",    "kv_copy_blocks", "coserve_step"
};

typedef struct mock_fault {
    uint32_t call; /* enum mock_call */
    uint64_t nth;  /* 1-based call number */
    int and_after; /* "N+": every call from the Nth on */
} mock_fault;

typedef struct mock_config {
    mock_fault faults[MOCK_MAX_FAULTS];
    uint32_t n_faults;
    uint32_t sleep_ms;
    uint32_t cost_us_token, cost_us_decode; /* the cost model (0: off) */
} mock_config;

typedef engine_tensor mock_tensor;

/* One LoRA adapter (ABI 1.4): its table (same for PARAM, ADAM_M, ADAM_V)
 * and the four flat buffers of its parameters. */
typedef struct mock_adapter {
    uint32_t id, rank, targets;
    float alpha;
    uint32_t n_tensors;
    engine_tensor *tensors;
    uint64_t n_params;
    float *params, *grads, *adam_m, *adam_v;
    uint32_t open_streams; /* ABI 1.5: streams on it; its parameters are fixed */
} mock_adapter;

/* One fine-tuning stream (ABI 1.5): a copy of the micro-batch and how far
 * its rows have gone. */
typedef struct mock_stream {
    uint32_t id, adapter_id, batch, seq_len;
    float grad_scale;
    int32_t *tokens, *targets;
    uint64_t rows, forward_rows, backward_rows, counted;
    double loss_sum; /* over the forward rows done, in row order */
    int finished;
} mock_stream;

/* Per-block marks used to validate one infer_forward / kv_copy_blocks. */
typedef engine_kv_mark mock_mark;

struct orch_engine_ctx {
    orch_model_desc model;         /* normalised: defaults filled in */
    engine_batch_limits train_lim; /* bounds of forward_backward / eval_loss */
    mock_config cfg;
    uint64_t calls[CALL_COUNT];

    /* Tensor table (same for every kind) and the four flat buffers. */
    uint32_t n_tensors;
    mock_tensor *tensors;
    uint64_t n_params;
    float *params, *grads, *adam_m, *adam_v;
    /* The moments cover flat [sh_off, sh_off+sh_count) (ABI 1.2
     * optimizer_shard): adam_m[i - sh_off]. Unsharded: 0, n_params. */
    uint64_t sh_off, sh_count;
    uint8_t *param_ready; /* per tensor: parameters initialised or written */
    uint64_t seed;
    /* The loss's four entries (see the top): tensors and element offsets of
     * the embedding rows A and B, the position matrix P and the vector N. */
    uint32_t loss_tensor[4];
    uint64_t loss_off[4];
    double z_bias; /* -1 for llama (its N starts at 1), 0 for gpt2 */

    /* KV pool: slot (block b, offset o) is index b*kv_block_size + o; it holds
     * kv_per_slot entries (1 for gpt2, kv_heads for llama), one per KV head. */
    uint32_t kv_block_size, kv_num_blocks, kv_per_slot;
    int32_t *kv_tokens;
    uint8_t *kv_written;
    mock_mark *kv_marks;
    uint32_t kv_epoch;

    /* ABI 1.4 LoRA adapters (see the top), in creation order. */
    struct mock_adapter **adapters;
    uint32_t n_adapters;
    uint32_t next_adapter_id; /* ids are never reused */

    /* ABI 1.5 fine-tuning streams, in opening order. */
    struct mock_stream **streams;
    uint32_t n_streams;
    uint32_t next_stream_id; /* ids are never reused */

    char last_error[512];
};

/* Record a failure on ctx and return its status. */
#define fail(ctx, ...) ENGINE_FAIL(ctx, __VA_ARGS__)

/* Count a call and fire an injected fault if one matches. Returns ORCH_OK or
 * ORCH_ERR_INTERNAL (with last_error set). */
static int32_t enter(orch_engine_ctx *ctx, enum mock_call call) {
    uint64_t n = ++ctx->calls[call];
    for (uint32_t i = 0; i < ctx->cfg.n_faults; i++) {
        const mock_fault *f = &ctx->cfg.faults[i];
        if (f->call != (uint32_t)call) continue;
        if (n == f->nth || (f->and_after && n > f->nth))
            return fail(ctx, ORCH_ERR_INTERNAL, "injected fault in %s (call %llu)",
                        call_names[call], (unsigned long long)n);
    }
    return ORCH_OK;
}

static void sleep_ms(uint32_t ms) {
    if (!ms) return;
    struct timespec ts = { (time_t)(ms / 1000u), (long)(ms % 1000u) * 1000000L };
    while (nanosleep(&ts, &ts) != 0) {
    }
}

/* ------------------------------------------------------------------------- */
/* Options and fault injection                                                */
/* ------------------------------------------------------------------------- */

/* Parse "CALL:N" or "CALL:N+" (len bytes of s) into cfg. */
static int32_t parse_fault(const char *s, size_t len, const char *where, mock_config *cfg,
                           char *err, uint32_t cap) {
    const char *colon = memchr(s, ':', len);
    if (!colon)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "%s: fault '%.*s' is not CALL:N", where, (int)len, s);
    size_t name_len = (size_t)(colon - s);
    int call = -1;
    for (int i = 0; i < CALL_COUNT; i++)
        if (strlen(call_names[i]) == name_len && memcmp(call_names[i], s, name_len) == 0)
            call = i;
    if (call < 0)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "%s: fault names unknown call '%.*s' (known: "
                               "tensor_count, tensor_info, tensor_read, tensor_write, "
                               "grads_zero, grads_read, grads_write, forward_backward, "
                               "optimizer_step, eval_loss, kv_block_bytes, "
                               "kv_configure, infer_forward, kv_copy_blocks)",
                               where, (int)name_len, s);
    const char *num = colon + 1;
    size_t num_len = len - name_len - 1;
    int and_after = 0;
    if (num_len > 0 && num[num_len - 1] == '+') {
        and_after = 1;
        num_len--;
    }
    uint64_t nth;
    if (engine_parse_u64(num, num_len, &nth) != 0 || nth == 0)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "%s: fault '%.*s': N must be an integer >= 1", where,
                               (int)len, s);
    if (cfg->n_faults >= MOCK_MAX_FAULTS)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "%s: more than %u faults", where, MOCK_MAX_FAULTS);
    mock_fault *f = &cfg->faults[cfg->n_faults++];
    f->call = (uint32_t)call;
    f->nth = nth;
    f->and_after = and_after;
    return ORCH_OK;
}

static int32_t parse_sleep(const char *s, size_t len, const char *where, mock_config *cfg,
                           char *err, uint32_t cap) {
    uint64_t ms;
    if (engine_parse_u64(s, len, &ms) != 0 || ms > MOCK_MAX_SLEEP_MS)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "%s: sleep_ms '%.*s' is not an integer 0..%u", where,
                               (int)len, s, MOCK_MAX_SLEEP_MS);
    cfg->sleep_ms = (uint32_t)ms;
    return ORCH_OK;
}

#define MOCK_MAX_COST_US 1000000u

static int32_t parse_cost(const char *s, size_t len, const char *where, const char *key,
                          uint32_t *dst, char *err, uint32_t cap) {
    uint64_t us;
    if (engine_parse_u64(s, len, &us) != 0 || us > MOCK_MAX_COST_US)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "%s: %s '%.*s' is not an integer 0..%u", where, key,
                               (int)len, s, MOCK_MAX_COST_US);
    *dst = (uint32_t)us;
    return ORCH_OK;
}

static int key_is(const engine_opt_item *it, const char *key) {
    return it->has_eq && it->key_len == strlen(key) &&
           memcmp(it->key, key, it->key_len) == 0;
}

/* Call the parser of each item of s (split at ',' / ';', trimmed). kind 0:
 * "key=value" options; kind 1: a list of faults. */
static int32_t parse_list(const char *s, int kind, const char *where, mock_config *cfg,
                          char *err, uint32_t cap) {
    engine_opt_item it;
    while (engine_opts_next(&s, &it)) {
        int32_t st;
        if (kind == 1) {
            st = parse_fault(it.item, it.item_len, where, cfg, err, cap);
        } else if (it.has_eq && it.key_len == 5 && memcmp(it.key, "fault", 5) == 0) {
            st = parse_fault(it.value, it.value_len, where, cfg, err, cap);
        } else if (it.has_eq && it.key_len == 8 && memcmp(it.key, "sleep_ms", 8) == 0) {
            st = parse_sleep(it.value, it.value_len, where, cfg, err, cap);
        } else if (key_is(&it, "cost_us_per_token")) {
            st = parse_cost(it.value, it.value_len, where, "cost_us_per_token",
                            &cfg->cost_us_token, err, cap);
        } else if (key_is(&it, "cost_us_per_decode")) {
            st = parse_cost(it.value, it.value_len, where, "cost_us_per_decode",
                            &cfg->cost_us_decode, err, cap);
        } else {
            st = engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                                 "%s: unknown option '%.*s' (the mock engine knows "
                                 "fault=CALL:N[+], sleep_ms=N, cost_us_per_token=N "
                                 "and cost_us_per_decode=N)",
                                 where, (int)it.item_len, it.item);
        }
        if (st != ORCH_OK) return st;
    }
    return ORCH_OK;
}

/* Environment first, then the options string (whose sleep_ms wins). */
static int32_t config_read(const char *options, mock_config *cfg, char *err,
                           uint32_t cap) {
    memset(cfg, 0, sizeof *cfg);
    const char *ef = getenv("ORCH_MOCK_FAULT");
    if (ef && *ef) {
        int32_t st = parse_list(ef, 1, "ORCH_MOCK_FAULT", cfg, err, cap);
        if (st != ORCH_OK) return st;
    }
    const char *es = getenv("ORCH_MOCK_SLEEP_MS");
    if (es && *es) {
        int32_t st = parse_sleep(es, strlen(es), "ORCH_MOCK_SLEEP_MS", cfg, err, cap);
        if (st != ORCH_OK) return st;
    }
    static const struct {
        const char *var, *key;
        size_t off;
    } costs[2] = {
        { "ORCH_MOCK_COST_US_PER_TOKEN", "cost_us_per_token",
          offsetof(mock_config, cost_us_token) },
        { "ORCH_MOCK_COST_US_PER_DECODE", "cost_us_per_decode",
          offsetof(mock_config, cost_us_decode) },
    };
    for (int i = 0; i < 2; i++) {
        const char *ev = getenv(costs[i].var);
        if (!ev || !*ev) continue;
        int32_t st = parse_cost(ev, strlen(ev), costs[i].var, costs[i].key,
                                (uint32_t *)((char *)cfg + costs[i].off), err, cap);
        if (st != ORCH_OK) return st;
    }
    if (options) return parse_list(options, 0, "mock options", cfg, err, cap);
    return ORCH_OK;
}

/* The cost model's sleep for a validated batch (see the top). */
static void cost_sleep(const mock_config *cfg, const orch_infer_batch *batch) {
    if (!cfg->cost_us_token && !cfg->cost_us_decode) return;
    uint64_t us = 0;
    for (uint32_t i = 0; i < batch->n_seqs; i++) {
        const orch_seq_input *q = engine_batch_seq(batch, i);
        us += q->n_tokens > 1 ? (uint64_t)q->n_tokens * cfg->cost_us_token
                              : cfg->cost_us_decode;
    }
    if (us > 600000000ull) us = 600000000ull;
    struct timespec ts = { (time_t)(us / 1000000u), (long)(us % 1000000u) * 1000L };
    while (nanosleep(&ts, &ts) != 0) {
    }
}

/* ------------------------------------------------------------------------- */
/* Model description and tensor table                                         */
/* ------------------------------------------------------------------------- */

static const engine_model_limits mock_limits = {
    "mock", (uint32_t)INT32_MAX, UINT32_MAX, MOCK_MAX_LAYERS, UINT32_MAX, UINT32_MAX, 1
};

/* Index of the tensor named `name` in the table, or n_tensors. */
static uint32_t tensor_index(const orch_engine_ctx *ctx, const char *name) {
    for (uint32_t i = 0; i < ctx->n_tensors; i++)
        if (strcmp(ctx->tensors[i].name, name) == 0) return i;
    return ctx->n_tensors;
}

/* Build the table of the model's architecture and find the four tensors the
 * loss reads (see the top). Sizes were checked for overflow by the caller. */
static int32_t table_build(orch_engine_ctx *ctx) {
    const orch_model_desc *m = &ctx->model;
    uint32_t n = engine_model_tensor_count(m);
    ctx->tensors = calloc(n, sizeof *ctx->tensors);
    if (!ctx->tensors) return ORCH_ERR_OUT_OF_MEMORY;
    ctx->n_params = engine_model_table_fill(ctx->tensors, m);
    ctx->n_tensors = n;
    if (m->arch == ORCH_ARCH_LLAMA) {
        ctx->loss_tensor[0] = 0; /* model.embed_tokens.weight */
        ctx->loss_tensor[1] = (m->flags & ORCH_MODEL_FLAG_UNTIED_HEAD)
                                  ? tensor_index(ctx, "lm_head.weight")
                                  : 0;
        ctx->loss_tensor[2] = tensor_index(ctx, "model.layers.0.self_attn.q_proj.weight");
        ctx->loss_tensor[3] = tensor_index(ctx, "model.norm.weight");
        ctx->z_bias = -1.0; /* the norm weight starts at 1 */
    } else {
        ctx->loss_tensor[0] = ctx->loss_tensor[1] = 0; /* wte.weight */
        ctx->loss_tensor[2] = 1;                       /* wpe.weight */
        ctx->loss_tensor[3] = n - 1;                   /* ln_f.bias */
        ctx->z_bias = 0.0;
    }
    for (int k = 0; k < 4; k++)
        ctx->loss_off[k] = ctx->tensors[ctx->loss_tensor[k]].offset;
    /* The "K/V" entries of one position: one per KV head for llama. */
    ctx->kv_per_slot = m->arch == ORCH_ARCH_LLAMA ? m->kv_heads : 1u;
    return ORCH_OK;
}

/* n N(0, std) values from the splitmix64 stream seeded with s0, in
 * Box-Muller pairs. */
static void fill_normal(float *dst, uint64_t n, double std, uint64_t s0) {
    for (uint64_t i = 0; i < n; i += 2) {
        float a, b;
        engine_normal_pair(engine_splitmix64_at(s0, i), engine_splitmix64_at(s0, i + 1),
                           std, &a, &b);
        dst[i] = a;
        if (i + 1 < n) dst[i + 1] = b;
    }
}

/* Initialise parameter tensor i unless it already holds values. */
static void param_ensure(orch_engine_ctx *ctx, uint32_t i) {
    if (ctx->param_ready[i]) return;
    const mock_tensor *t = &ctx->tensors[i];
    float *p = ctx->params + t->offset;
    if (t->ndim == 2) {
        fill_normal(p, t->numel, engine_gpt2_init_std(t, ctx->model.layers),
                    ctx->seed + (uint64_t)(i + 1) * 0x9E3779B97F4A7C15ull);
    } else if (engine_gpt2_init_value(t) != 0.0f) { /* LayerNorm weights */
        for (uint64_t j = 0; j < t->numel; j++) p[j] = engine_gpt2_init_value(t);
    } else { /* biases: calloc already zeroed them */
    }
    ctx->param_ready[i] = 1;
}

static void params_ensure_all(orch_engine_ctx *ctx) {
    for (uint32_t i = 0; i < ctx->n_tensors; i++) param_ensure(ctx, i);
}

/* ------------------------------------------------------------------------- */
/* Lifecycle                                                                  */
/* ------------------------------------------------------------------------- */

static void kv_free(orch_engine_ctx *ctx) {
    free(ctx->kv_tokens);
    free(ctx->kv_written);
    free(ctx->kv_marks);
    ctx->kv_tokens = NULL;
    ctx->kv_written = NULL;
    ctx->kv_marks = NULL;
    ctx->kv_block_size = ctx->kv_num_blocks = 0;
}

/* The KV pool as the engines/common checks see it. */
static engine_kv_view kv_view(orch_engine_ctx *ctx) {
    engine_kv_view v = { ctx->kv_block_size, ctx->kv_tokens ? ctx->kv_num_blocks : 0,
                         ctx->kv_marks, &ctx->kv_epoch, ctx->kv_written };
    return v;
}

static void adapters_free(orch_engine_ctx *ctx);

static void mock_context_destroy(orch_engine_ctx *ctx) {
    if (!ctx) return;
    kv_free(ctx);
    adapters_free(ctx);
    free(ctx->tensors);
    free(ctx->param_ready);
    free(ctx->params);
    free(ctx->grads);
    free(ctx->adam_m);
    free(ctx->adam_v);
    free(ctx);
}

static int32_t mock_context_create(const orch_model_desc *model,
                                   const orch_engine_options *opts,
                                   orch_engine_ctx **out_ctx, char *err,
                                   uint32_t err_cap) {
    orch_engine_options o;
    int32_t st = engine_create_args(model, opts, out_ctx, &o, err, err_cap);
    if (st != ORCH_OK) return st;
    orch_model_desc m;
    st = engine_model_normalise(model, &mock_limits, &m, err, err_cap);
    if (st != ORCH_OK) return st;
    mock_config cfg;
    st = config_read(o.options, &cfg, err, err_cap);
    if (st != ORCH_OK) return st;

    uint64_t n_params, bytes;
    if (engine_model_param_count(&m, &n_params) != 0 ||
        __builtin_mul_overflow(n_params, (uint64_t)16, &bytes))
        return engine_fail_buf(err, err_cap, ORCH_ERR_OUT_OF_MEMORY,
                               "model too large (parameter count overflows)");
    const uint64_t mem = engine_host_memory_bytes();
    if (mem && bytes > mem)
        return engine_fail_buf(err, err_cap, ORCH_ERR_OUT_OF_MEMORY,
                               "model needs %llu bytes (%llu parameters; parameters, "
                               "gradients and two moments), more than this machine's "
                               "%llu bytes of memory",
                               (unsigned long long)bytes, (unsigned long long)n_params,
                               (unsigned long long)mem);
    if (n_params > SIZE_MAX / sizeof(float))
        return engine_fail_buf(err, err_cap, ORCH_ERR_OUT_OF_MEMORY, "model too large");

    orch_engine_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return engine_fail_buf(err, err_cap, ORCH_ERR_OUT_OF_MEMORY,
                               "cannot allocate a context");
    ctx->model = m;
    ctx->train_lim = (engine_batch_limits){ "mock", m.vocab_size, m.context, 0 };
    ctx->cfg = cfg;
    if (table_build(ctx) != ORCH_OK) {
        mock_context_destroy(ctx);
        return engine_fail_buf(err, err_cap, ORCH_ERR_OUT_OF_MEMORY,
                               "cannot allocate the tensor table");
    }
    /* calloc: pages of untouched buffers (moments, gradients) stay lazy. */
    size_t n = (size_t)ctx->n_params;
    ctx->params = calloc(n, sizeof(float));
    ctx->grads = calloc(n, sizeof(float));
    ctx->adam_m = calloc(n, sizeof(float));
    ctx->adam_v = calloc(n, sizeof(float));
    ctx->param_ready = calloc(ctx->n_tensors, 1);
    ctx->sh_off = 0;
    ctx->sh_count = ctx->n_params;
    if (!ctx->params || !ctx->grads || !ctx->adam_m || !ctx->adam_v ||
        !ctx->param_ready) {
        mock_context_destroy(ctx);
        return engine_fail_buf(err, err_cap, ORCH_ERR_OUT_OF_MEMORY,
                               "cannot allocate %llu bytes for %llu parameters",
                               (unsigned long long)bytes, (unsigned long long)n_params);
    }
    ctx->seed = o.seed;
    *out_ctx = ctx;
    return ORCH_OK;
}

static const char *mock_last_error(const orch_engine_ctx *ctx) {
    return ctx ? ctx->last_error : "context is NULL";
}

/* ------------------------------------------------------------------------- */
/* Tensor table calls                                                         */
/* ------------------------------------------------------------------------- */

static float *kind_buffer(orch_engine_ctx *ctx, uint32_t kind) {
    return kind == ORCH_TENSOR_PARAM    ? ctx->params
           : kind == ORCH_TENSOR_ADAM_M ? ctx->adam_m
                                        : ctx->adam_v;
}

static int32_t mock_tensor_count(orch_engine_ctx *ctx, uint32_t kind,
                                 uint32_t *out_count) {
    if (!ctx) return ORCH_ERR_INVALID_ARGUMENT;
    int32_t st = enter(ctx, CALL_TENSOR_COUNT);
    if (st) return st;
    if ((st = engine_check_tensor_count(kind, out_count, ENGINE_ERRBUF(ctx)))) return st;
    *out_count = ctx->n_tensors;
    return ORCH_OK;
}

static int32_t mock_tensor_info(orch_engine_ctx *ctx, uint32_t kind, uint32_t index,
                                orch_tensor_info *out) {
    if (!ctx) return ORCH_ERR_INVALID_ARGUMENT;
    int32_t st = enter(ctx, CALL_TENSOR_INFO);
    if (st) return st;
    if ((st = engine_check_tensor_info(kind, index, ctx->n_tensors, out,
                                       ENGINE_ERRBUF(ctx))))
        return st;
    engine_tensor_info_fill(&ctx->tensors[index], out);
    return ORCH_OK;
}

/* The whole-table moment calls need every moment (ABI 1.2). */
static int32_t need_unsharded(orch_engine_ctx *ctx, uint32_t kind, const char *fn) {
    if (kind == ORCH_TENSOR_PARAM || (ctx->sh_off == 0 && ctx->sh_count == ctx->n_params))
        return ORCH_OK;
    return fail(ctx, ORCH_ERR_STATE,
                "%s: this context keeps the AdamW moments of [%llu, %llu+%llu) only "
                "(optimizer_shard); use moments_read/moments_write and "
                "optimizer_step_range",
                fn, (unsigned long long)ctx->sh_off, (unsigned long long)ctx->sh_off,
                (unsigned long long)ctx->sh_count);
}

static int32_t mock_tensor_read(orch_engine_ctx *ctx, uint32_t kind, uint32_t index,
                                void *dst, uint64_t dst_bytes) {
    if (!ctx) return ORCH_ERR_INVALID_ARGUMENT;
    int32_t st = enter(ctx, CALL_TENSOR_READ);
    if (st) return st;
    if ((st = engine_check_tensor_io("tensor_read", kind, index, ctx->tensors,
                                     ctx->n_tensors, dst, dst_bytes, ENGINE_ERRBUF(ctx))))
        return st;
    if ((st = need_unsharded(ctx, kind, "tensor_read"))) return st;
    if (kind == ORCH_TENSOR_PARAM) param_ensure(ctx, index);
    memcpy(dst, kind_buffer(ctx, kind) + ctx->tensors[index].offset, (size_t)dst_bytes);
    return ORCH_OK;
}

static int32_t mock_tensor_write(orch_engine_ctx *ctx, uint32_t kind, uint32_t index,
                                 const void *src, uint64_t src_bytes) {
    if (!ctx) return ORCH_ERR_INVALID_ARGUMENT;
    int32_t st = enter(ctx, CALL_TENSOR_WRITE);
    if (st) return st;
    if ((st = engine_check_tensor_io("tensor_write", kind, index, ctx->tensors,
                                     ctx->n_tensors, src, src_bytes, ENGINE_ERRBUF(ctx))))
        return st;
    if ((st = need_unsharded(ctx, kind, "tensor_write"))) return st;
    memcpy(kind_buffer(ctx, kind) + ctx->tensors[index].offset, src, (size_t)src_bytes);
    if (kind == ORCH_TENSOR_PARAM) ctx->param_ready[index] = 1;
    return ORCH_OK;
}

/* ------------------------------------------------------------------------- */
/* Training                                                                   */
/* ------------------------------------------------------------------------- */

static int32_t mock_grads_zero(orch_engine_ctx *ctx) {
    if (!ctx) return ORCH_ERR_INVALID_ARGUMENT;
    int32_t st = enter(ctx, CALL_GRADS_ZERO);
    if (st) return st;
    memset(ctx->grads, 0, (size_t)ctx->n_params * sizeof(float));
    return ORCH_OK;
}

static int32_t mock_grads_read(orch_engine_ctx *ctx, uint64_t offset, uint64_t count,
                               float *dst) {
    if (!ctx) return ORCH_ERR_INVALID_ARGUMENT;
    int32_t st = enter(ctx, CALL_GRADS_READ);
    if (st) return st;
    if ((st = engine_check_grad_range("grads_read", offset, count, ctx->n_params, dst,
                                      ENGINE_ERRBUF(ctx))))
        return st;
    if (count) memcpy(dst, ctx->grads + offset, (size_t)count * sizeof(float));
    return ORCH_OK;
}

static int32_t mock_grads_write(orch_engine_ctx *ctx, uint64_t offset, uint64_t count,
                                const float *src) {
    if (!ctx) return ORCH_ERR_INVALID_ARGUMENT;
    int32_t st = enter(ctx, CALL_GRADS_WRITE);
    if (st) return st;
    if ((st = engine_check_grad_range("grads_write", offset, count, ctx->n_params, src,
                                      ENGINE_ERRBUF(ctx))))
        return st;
    if (count) memcpy(ctx->grads + offset, src, (size_t)count * sizeof(float));
    return ORCH_OK;
}

/* The four parameter entries (element offsets) term (x,y,t) reads. */
static void term_entries(const orch_engine_ctx *ctx, uint64_t x, uint64_t y, uint64_t t,
                         uint64_t idx[4]) {
    uint64_t C = ctx->model.width;
    uint64_t row = ctx->model.arch == ORCH_ARCH_LLAMA ? t % C : t;
    idx[0] = ctx->loss_off[0] + x * C + y % C;
    idx[1] = ctx->loss_off[1] + y * C + x % C;
    idx[2] = ctx->loss_off[2] + row * C + (x + y) % C;
    idx[3] = ctx->loss_off[3] + y % C;
}

/* Mean loss over counted targets; with grads != NULL also add
 * grad_scale * gradient. Arguments already validated. */
static float loss_compute(orch_engine_ctx *ctx, const int32_t *tokens,
                          const int32_t *targets, uint32_t batch, uint32_t seq_len,
                          float *grads, float grad_scale) {
    const double two_log_v = 2.0 * log((double)ctx->model.vocab_size);
    for (int k = 0; k < 4; k++) param_ensure(ctx, ctx->loss_tensor[k]);
    uint64_t n = (uint64_t)batch * seq_len, counted = 0;
    for (uint64_t i = 0; i < n; i++) counted += targets[i] != -1;
    if (counted == 0) return 0.0f;
    double sum = 0.0;
    for (uint64_t i = 0; i < n; i++) {
        if (targets[i] == -1) continue;
        uint64_t idx[4];
        term_entries(ctx, (uint64_t)tokens[i], (uint64_t)targets[i], i % seq_len, idx);
        const float *p = ctx->params;
        double z = (double)p[idx[0]] + (double)p[idx[1]] + (double)p[idx[2]] +
                   (double)p[idx[3]] + ctx->z_bias;
        double s = 1.0 / (1.0 + exp(-z));
        sum += two_log_v * s;
        if (grads) {
            float g =
                (float)((double)grad_scale * two_log_v * s * (1.0 - s) / (double)counted);
            for (int k = 0; k < 4; k++) grads[idx[k]] += g;
        }
    }
    return (float)(sum / (double)counted);
}

static int32_t mock_forward_backward(orch_engine_ctx *ctx, const int32_t *tokens,
                                     const int32_t *targets, uint32_t batch,
                                     uint32_t seq_len, float grad_scale,
                                     float *out_loss) {
    if (!ctx) return ORCH_ERR_INVALID_ARGUMENT;
    int32_t st = enter(ctx, CALL_FORWARD_BACKWARD);
    if (st) return st;
    sleep_ms(ctx->cfg.sleep_ms);
    if ((st = engine_check_train_call("forward_backward", tokens, targets, batch, seq_len,
                                      grad_scale, out_loss, &ctx->train_lim, NULL,
                                      ENGINE_ERRBUF(ctx))))
        return st;
    *out_loss =
        loss_compute(ctx, tokens, targets, batch, seq_len, ctx->grads, grad_scale);
    return ORCH_OK;
}

/* ABI 1.3: forward_backward (same fault counter, sleep and checks), then
 * every tensor's gradient range reported in reverse table order (the mock
 * has no backward pass to interleave with). */
static int32_t mock_forward_backward_notify(orch_engine_ctx *ctx, const int32_t *tokens,
                                            const int32_t *targets, uint32_t batch,
                                            uint32_t seq_len, float grad_scale,
                                            float *out_loss, orch_grad_ready_fn ready,
                                            void *user) {
    int32_t st =
        mock_forward_backward(ctx, tokens, targets, batch, seq_len, grad_scale, out_loss);
    if (st != ORCH_OK || !ready) return st;
    for (uint32_t i = ctx->n_tensors; i-- > 0;)
        if (ctx->tensors[i].numel)
            ready(user, ctx->tensors[i].offset, ctx->tensors[i].numel);
    return ORCH_OK;
}

static int32_t mock_eval_loss(orch_engine_ctx *ctx, const int32_t *tokens,
                              const int32_t *targets, uint32_t batch, uint32_t seq_len,
                              float *out_loss) {
    if (!ctx) return ORCH_ERR_INVALID_ARGUMENT;
    int32_t st = enter(ctx, CALL_EVAL_LOSS);
    if (st) return st;
    if ((st = engine_check_train_call("eval_loss", tokens, targets, batch, seq_len, 0.0f,
                                      out_loss, &ctx->train_lim, NULL,
                                      ENGINE_ERRBUF(ctx))))
        return st;
    *out_loss = loss_compute(ctx, tokens, targets, batch, seq_len, NULL, 0.0f);
    return ORCH_OK;
}

static int32_t mock_optimizer_step(orch_engine_ctx *ctx, const orch_adamw_params *params,
                                   float *out_grad_norm) {
    if (!ctx) return ORCH_ERR_INVALID_ARGUMENT;
    int32_t st = enter(ctx, CALL_OPTIMIZER_STEP);
    if (st) return st;
    orch_adamw_params p;
    if ((st = engine_check_adamw(params, &p, ENGINE_ERRBUF(ctx))) != ORCH_OK) return st;
    if ((st = need_unsharded(ctx, ORCH_TENSOR_ADAM_M, "optimizer_step"))) return st;
    double sq = 0.0;
    for (uint64_t i = 0; i < ctx->n_params; i++)
        sq += (double)ctx->grads[i] * (double)ctx->grads[i];
    double norm = sqrt(sq);
    if (!isfinite(norm)) return engine_fail_nonfinite_norm(ENGINE_ERRBUF(ctx));
    const float scale = engine_grad_clip_scale(&p, norm);
    if (scale != 1.0f)
        for (uint64_t i = 0; i < ctx->n_params; i++) ctx->grads[i] *= scale;
    params_ensure_all(ctx);
    const float b1 = p.beta1, b2 = p.beta2;
    const float bc1 = (float)(1.0 - pow((double)b1, (double)p.step));
    const float bc2 = (float)(1.0 - pow((double)b2, (double)p.step));
    for (uint32_t ti = 0; ti < ctx->n_tensors; ti++) {
        const mock_tensor *t = &ctx->tensors[ti];
        const float decay = engine_adamw_decay(&p, t->flags);
        float *w = ctx->params + t->offset, *g = ctx->grads + t->offset;
        float *m = ctx->adam_m + t->offset, *v = ctx->adam_v + t->offset;
        for (uint64_t i = 0; i < t->numel; i++) {
            m[i] = b1 * m[i] + (1.0f - b1) * g[i];
            v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
            float mhat = m[i] / bc1, vhat = v[i] / bc2;
            w[i] *= decay;
            w[i] -= p.lr * mhat / (sqrtf(vhat) + p.eps);
        }
    }
    if (out_grad_norm) *out_grad_norm = (float)norm;
    return ORCH_OK;
}

/* ------------------------------------------------------------------------- */
/* ABI 1.2: flat parameters, the optimizer shard, the ranged step             */
/* ------------------------------------------------------------------------- */

/* Initialise the (lazy) parameters of every tensor overlapping [a, b). */
static void params_ensure_range(orch_engine_ctx *ctx, uint64_t a, uint64_t b) {
    for (uint32_t i = 0; i < ctx->n_tensors; i++) {
        const mock_tensor *t = &ctx->tensors[i];
        if (t->offset < b && t->offset + t->numel > a) param_ensure(ctx, i);
    }
}

static int32_t mock_param_read(orch_engine_ctx *ctx, uint64_t offset, uint64_t count,
                               float *dst) {
    if (!ctx) return ORCH_ERR_INVALID_ARGUMENT;
    int32_t st = engine_check_flat_range("param_read", offset, count, ctx->n_params, dst,
                                         ENGINE_ERRBUF(ctx));
    if (st) return st;
    params_ensure_range(ctx, offset, offset + count);
    if (count) memcpy(dst, ctx->params + offset, (size_t)count * sizeof(float));
    return ORCH_OK;
}

static int32_t mock_param_write(orch_engine_ctx *ctx, uint64_t offset, uint64_t count,
                                const float *src) {
    if (!ctx) return ORCH_ERR_INVALID_ARGUMENT;
    int32_t st = engine_check_flat_range("param_write", offset, count, ctx->n_params, src,
                                         ENGINE_ERRBUF(ctx));
    if (st) return st;
    params_ensure_range(ctx, offset, offset + count); /* partly covered tensors */
    if (count) memcpy(ctx->params + offset, src, (size_t)count * sizeof(float));
    return ORCH_OK;
}

static int32_t mock_optimizer_shard(orch_engine_ctx *ctx, uint64_t offset,
                                    uint64_t count) {
    if (!ctx) return ORCH_ERR_INVALID_ARGUMENT;
    int32_t st = engine_check_shard(offset, count, ctx->n_params, ENGINE_ERRBUF(ctx));
    if (st) return st;
    if (offset == ctx->sh_off && count == ctx->sh_count) return ORCH_OK;
    float *m = calloc((size_t)count, sizeof(float));
    float *v = calloc((size_t)count, sizeof(float));
    if (!m || !v) {
        free(m);
        free(v);
        return fail(ctx, ORCH_ERR_OUT_OF_MEMORY,
                    "optimizer_shard: cannot allocate %llu bytes of moments",
                    (unsigned long long)(count * 8));
    }
    uint64_t a = offset > ctx->sh_off ? offset : ctx->sh_off;
    uint64_t e1 = offset + count, e0 = ctx->sh_off + ctx->sh_count;
    uint64_t b = e1 < e0 ? e1 : e0;
    if (a < b) {
        memcpy(m + (a - offset), ctx->adam_m + (a - ctx->sh_off),
               (size_t)(b - a) * sizeof(float));
        memcpy(v + (a - offset), ctx->adam_v + (a - ctx->sh_off),
               (size_t)(b - a) * sizeof(float));
    }
    free(ctx->adam_m);
    free(ctx->adam_v);
    ctx->adam_m = m;
    ctx->adam_v = v;
    ctx->sh_off = offset;
    ctx->sh_count = count;
    return ORCH_OK;
}

/* moments_read (to_engine 0: engine -> buf) and moments_write. */
static int32_t mock_moments_io(orch_engine_ctx *ctx, const char *fn, uint32_t kind,
                               uint64_t offset, uint64_t count, void *buf,
                               int to_engine) {
    if (!ctx) return ORCH_ERR_INVALID_ARGUMENT;
    int32_t st =
        engine_check_moment_range(fn, kind, offset, count, ctx->n_params, ctx->sh_off,
                                  ctx->sh_count, buf, ENGINE_ERRBUF(ctx));
    if (st) return st;
    if (!count) return ORCH_OK;
    float *mom = kind_buffer(ctx, kind) + (offset - ctx->sh_off);
    if (to_engine)
        memcpy(mom, buf, (size_t)count * sizeof(float));
    else
        memcpy(buf, mom, (size_t)count * sizeof(float));
    return ORCH_OK;
}

static int32_t mock_moments_read(orch_engine_ctx *ctx, uint32_t kind, uint64_t offset,
                                 uint64_t count, float *dst) {
    return mock_moments_io(ctx, "moments_read", kind, offset, count, dst, 0);
}

static int32_t mock_moments_write(orch_engine_ctx *ctx, uint32_t kind, uint64_t offset,
                                  uint64_t count, const float *src) {
    /* the buffer is only read on this path */
    return mock_moments_io(ctx, "moments_write", kind, offset, count, (void *)src, 1);
}

/* The ranged step: the same per-element update as optimizer_step, with
 * g * scale computed per element (optimizer_step scales the buffer first:
 * the same f32 product). */
static int32_t mock_optimizer_step_range(orch_engine_ctx *ctx,
                                         const orch_adamw_params *params, uint64_t offset,
                                         uint64_t count, float global_grad_norm) {
    if (!ctx) return ORCH_ERR_INVALID_ARGUMENT;
    orch_adamw_params p;
    int32_t st =
        engine_check_step_range(params, offset, count, ctx->n_params, ctx->sh_off,
                                ctx->sh_count, global_grad_norm, &p, ENGINE_ERRBUF(ctx));
    if (st) return st;
    const float scale = engine_grad_clip_scale(&p, (double)global_grad_norm);
    const uint64_t lo = offset, hi = offset + count;
    params_ensure_range(ctx, lo, hi);
    const float b1 = p.beta1, b2 = p.beta2;
    const float bc1 = (float)(1.0 - pow((double)b1, (double)p.step));
    const float bc2 = (float)(1.0 - pow((double)b2, (double)p.step));
    for (uint32_t ti = 0; ti < ctx->n_tensors; ti++) {
        const mock_tensor *t = &ctx->tensors[ti];
        uint64_t a = t->offset > lo ? t->offset : lo;
        uint64_t b = t->offset + t->numel < hi ? t->offset + t->numel : hi;
        if (a >= b) continue;
        const float decay = engine_adamw_decay(&p, t->flags);
        for (uint64_t i = a; i < b; i++) {
            float g = scale != 1.0f ? ctx->grads[i] * scale : ctx->grads[i];
            float *m = ctx->adam_m + (i - ctx->sh_off),
                  *v = ctx->adam_v + (i - ctx->sh_off);
            float *w = ctx->params + i;
            *m = b1 * *m + (1.0f - b1) * g;
            *v = b2 * *v + (1.0f - b2) * g * g;
            float mhat = *m / bc1, vhat = *v / bc2;
            *w *= decay;
            *w -= p.lr * mhat / (sqrtf(vhat) + p.eps);
        }
    }
    return ORCH_OK;
}

static int32_t mock_optimizer_bytes(orch_engine_ctx *ctx, uint64_t *out_bytes) {
    if (!ctx) return ORCH_ERR_INVALID_ARGUMENT;
    if (!out_bytes) return fail(ctx, ORCH_ERR_INVALID_ARGUMENT, "out_bytes is NULL");
    *out_bytes = 2 * ctx->sh_count * sizeof(float);
    return ORCH_OK;
}

/* ------------------------------------------------------------------------- */
/* Inference                                                                  */
/* ------------------------------------------------------------------------- */

/* Per block: the slot entries (kv_per_slot token ids each) and written
 * flags, plus the validation mark. */
static uint64_t kv_bytes_per_block(const orch_engine_ctx *ctx, uint32_t block_size) {
    return (uint64_t)block_size * (ctx->kv_per_slot * sizeof(int32_t) + sizeof(uint8_t)) +
           sizeof(mock_mark);
}

static int32_t mock_kv_block_bytes(orch_engine_ctx *ctx, uint32_t block_size,
                                   uint64_t *out_bytes) {
    if (!ctx) return ORCH_ERR_INVALID_ARGUMENT;
    int32_t st = enter(ctx, CALL_KV_BLOCK_BYTES);
    if (st) return st;
    if ((st = engine_check_kv_block_bytes(block_size, out_bytes, ENGINE_ERRBUF(ctx))))
        return st;
    *out_bytes = kv_bytes_per_block(ctx, block_size);
    return ORCH_OK;
}

static int32_t mock_kv_configure(orch_engine_ctx *ctx, uint32_t block_size,
                                 uint32_t num_blocks) {
    if (!ctx) return ORCH_ERR_INVALID_ARGUMENT;
    int32_t st = enter(ctx, CALL_KV_CONFIGURE);
    if (st) return st;
    if ((st = engine_check_kv_configure(block_size, num_blocks, 0, ENGINE_ERRBUF(ctx))))
        return st;
    uint64_t slots = (uint64_t)block_size * num_blocks;
    if (slots > SIZE_MAX / sizeof(int32_t) / ctx->kv_per_slot)
        return fail(ctx, ORCH_ERR_OUT_OF_MEMORY, "kv_configure: pool too large");
    int32_t *tok = calloc((size_t)slots * ctx->kv_per_slot, sizeof *tok);
    uint8_t *wr = calloc((size_t)slots, 1);
    mock_mark *marks = calloc(num_blocks, sizeof *marks);
    if (!tok || !wr || !marks) {
        free(tok);
        free(wr);
        free(marks);
        return fail(ctx, ORCH_ERR_OUT_OF_MEMORY,
                    "kv_configure: cannot allocate %u blocks of %u positions", num_blocks,
                    block_size);
    }
    kv_free(ctx);
    ctx->kv_tokens = tok;
    ctx->kv_written = wr;
    ctx->kv_marks = marks;
    ctx->kv_block_size = block_size;
    ctx->kv_num_blocks = num_blocks;
    ctx->kv_epoch = 0;
    return ORCH_OK;
}

/* The next token after a prefix whose token ids sum to S (see the top). */
static uint32_t next_token(uint64_t S, uint32_t vocab) {
    return vocab >= 123u ? 97u + (uint32_t)(S % 26u) : (uint32_t)(S % vocab);
}

static int32_t infer_forward_base(orch_engine_ctx *ctx, const orch_infer_batch *batch,
                                  float *logits, uint64_t logits_cap) {
    int32_t st = enter(ctx, CALL_INFER_FORWARD);
    if (st) return st;
    sleep_ms(ctx->cfg.sleep_ms);
    const engine_kv_view kv = kv_view(ctx);
    const uint32_t bs = ctx->kv_block_size, V = ctx->model.vocab_size;
    uint64_t tokens, rows;
    if ((st = engine_infer_check(batch, logits, logits_cap, V, ctx->model.context, 0,
                                 NULL, &kv, &tokens, &rows, ENGINE_ERRBUF(ctx))))
        return st;
    cost_sleep(&ctx->cfg, batch);

    /* Write the new tokens' "K/V": the id once per KV head. */
    const uint32_t per = ctx->kv_per_slot;
    for (uint32_t i = 0; i < batch->n_seqs; i++) {
        const orch_seq_input *s = engine_batch_seq(batch, i);
        for (uint32_t k = 0; k < s->n_tokens; k++) {
            uint64_t p = (uint64_t)s->start_pos + k;
            uint64_t slot = (uint64_t)s->block_table[p / bs] * bs + p % bs;
            for (uint32_t h = 0; h < per; h++)
                ctx->kv_tokens[slot * per + h] = s->tokens[k];
        }
    }
    engine_kv_mark_written(batch, &kv);
    /* Logits from what the cache holds, read back through the table. */
    float *row = logits;
    for (uint32_t i = 0; i < batch->n_seqs; i++) {
        const orch_seq_input *s = engine_batch_seq(batch, i);
        uint64_t end = (uint64_t)s->start_pos + s->n_tokens;
        if (s->logits_mode == ORCH_LOGITS_NONE) continue;
        uint64_t S = 0;
        for (uint64_t p = 0; p < end; p++) {
            uint64_t slot = (uint64_t)s->block_table[p / bs] * bs + p % bs;
            S += (uint64_t)ctx->kv_tokens[slot * per + p % per]; /* KV head p mod per */
            int emit =
                p >= s->start_pos && (s->logits_mode == ORCH_LOGITS_ALL || p == end - 1);
            if (!emit) continue;
            int64_t next = (int64_t)next_token(S, V);
            for (uint32_t v = 0; v < V; v++) {
                int64_t d = (int64_t)v - next;
                row[v] = -(float)(d < 0 ? -d : d);
            }
            row += V;
        }
    }
    return ORCH_OK;
}

static mock_adapter *adapter_find(orch_engine_ctx *ctx, uint32_t id, const char *fn);

/* infer_forward: sequences may name adapters of this context (ABI 1.4). The
 * mock's logits do not read weights, so they already equal those of the
 * merged weight W + (alpha/rank) B A: an adapter is checked to exist, then
 * the batch runs as on the base. */
static int32_t mock_infer_forward(orch_engine_ctx *ctx, const orch_infer_batch *batch,
                                  float *logits, uint64_t logits_cap) {
    if (!ctx) return ORCH_ERR_INVALID_ARGUMENT;
    const size_t need = offsetof(orch_seq_input, adapter_id) + sizeof(uint32_t);
    int named = 0;
    if (batch && batch->seqs && batch->struct_size >= sizeof *batch &&
        batch->seq_stride >= need && batch->seq_stride % 8 == 0)
        for (uint32_t i = 0; i < batch->n_seqs; i++)
            named |= engine_batch_seq(batch, i)->adapter_id != 0;
    if (!named) return infer_forward_base(ctx, batch, logits, logits_cap);
    orch_seq_input *copy = calloc(batch->n_seqs, sizeof *copy);
    if (!copy) return fail(ctx, ORCH_ERR_OUT_OF_MEMORY, "infer_forward: out of memory");
    for (uint32_t i = 0; i < batch->n_seqs; i++) {
        const orch_seq_input *q = engine_batch_seq(batch, i);
        memcpy(&copy[i], q, need);
        if (q->adapter_id && !adapter_find(ctx, q->adapter_id, "infer_forward")) {
            free(copy);
            return fail(ctx, ORCH_ERR_INVALID_ARGUMENT,
                        "infer_forward: sequence %u: adapter_id %u: no such adapter", i,
                        q->adapter_id);
        }
        copy[i].adapter_id = 0;
    }
    orch_infer_batch b = *batch;
    b.seqs = copy;
    b.seq_stride = sizeof *copy;
    int32_t st = infer_forward_base(ctx, &b, logits, logits_cap);
    free(copy);
    return st;
}

static int32_t mock_kv_copy_blocks(orch_engine_ctx *ctx, const int32_t *src,
                                   const int32_t *dst, uint32_t n) {
    if (!ctx) return ORCH_ERR_INVALID_ARGUMENT;
    int32_t st = enter(ctx, CALL_KV_COPY_BLOCKS);
    if (st) return st;
    const engine_kv_view kv = kv_view(ctx);
    if ((st = engine_kv_copy_check(src, dst, n, &kv, ENGINE_ERRBUF(ctx))) != ORCH_OK)
        return st;
    const size_t per_block = (size_t)ctx->kv_block_size * ctx->kv_per_slot;
    for (uint32_t i = 0; i < n; i++) {
        memcpy(ctx->kv_tokens + (size_t)dst[i] * per_block,
               ctx->kv_tokens + (size_t)src[i] * per_block, per_block * sizeof(int32_t));
    }
    engine_kv_copy_written(src, dst, n, &kv);
    return ORCH_OK;
}

/* ------------------------------------------------------------------------- */
/* ABI 1.4: LoRA adapters (see "LoRA adapters" at the top)                    */
/* ------------------------------------------------------------------------- */

/* Release one adapter (NULL is a no-op). */
static void adapter_free(mock_adapter *a) {
    if (!a) return;
    free(a->tensors);
    free(a->params);
    free(a->grads);
    free(a->adam_m);
    free(a->adam_v);
    free(a);
}

static void stream_free(struct mock_stream *f) {
    if (!f) return;
    free(f->tokens);
    free(f->targets);
    free(f);
}

static void adapters_free(orch_engine_ctx *ctx) {
    for (uint32_t i = 0; i < ctx->n_streams; i++) stream_free(ctx->streams[i]);
    free(ctx->streams);
    ctx->streams = NULL;
    ctx->n_streams = 0;
    for (uint32_t i = 0; i < ctx->n_adapters; i++) adapter_free(ctx->adapters[i]);
    free(ctx->adapters);
    ctx->adapters = NULL;
    ctx->n_adapters = 0;
}

/* The adapter called id, or NULL with last_error set (fn names the call). */
static mock_adapter *adapter_find(orch_engine_ctx *ctx, uint32_t id, const char *fn) {
    for (uint32_t i = 0; i < ctx->n_adapters; i++)
        if (ctx->adapters[i]->id == id) return ctx->adapters[i];
    fail(ctx, ORCH_ERR_INVALID_ARGUMENT, "%s: adapter_id %u: no such adapter", fn, id);
    return NULL;
}

/* The base weights a target bit adapts, per layer, in table order. */
static uint32_t target_suffixes(const orch_engine_ctx *ctx, uint32_t bit,
                                const char *out[3]) {
    int llama = ctx->model.arch == ORCH_ARCH_LLAMA;
    switch (bit) {
    case ORCH_LORA_TARGET_ATTN_QKV:
        if (!llama) {
            out[0] = "attn.c_attn";
            return 1;
        }
        out[0] = "self_attn.q_proj";
        out[1] = "self_attn.k_proj";
        out[2] = "self_attn.v_proj";
        return 3;
    case ORCH_LORA_TARGET_ATTN_OUT:
        out[0] = llama ? "self_attn.o_proj" : "attn.c_proj";
        return 1;
    case ORCH_LORA_TARGET_MLP_UP:
        if (!llama) {
            out[0] = "mlp.c_fc";
            return 1;
        }
        out[0] = "mlp.gate_proj";
        out[1] = "mlp.up_proj";
        return 2;
    default: out[0] = llama ? "mlp.down_proj" : "mlp.c_proj"; return 1;
    }
}

static int32_t mock_adapter_create(orch_engine_ctx *ctx, const orch_lora_desc *desc,
                                   uint32_t *out_id) {
    if (!ctx) return ORCH_ERR_INVALID_ARGUMENT;
    if (!desc)
        return fail(ctx, ORCH_ERR_INVALID_ARGUMENT, "adapter_create: desc is NULL");
    if (!out_id)
        return fail(ctx, ORCH_ERR_INVALID_ARGUMENT, "adapter_create: out_id is NULL");
    if (desc->struct_size < offsetof(orch_lora_desc, reserved))
        return fail(ctx, ORCH_ERR_INVALID_ARGUMENT,
                    "adapter_create: desc struct_size %u is below the %u bytes of "
                    "ABI 1.4",
                    desc->struct_size, (unsigned)offsetof(orch_lora_desc, reserved));
    if (desc->targets == 0 || (desc->targets & ~ORCH_LORA_TARGET_ALL))
        return fail(ctx, ORCH_ERR_INVALID_ARGUMENT,
                    "adapter_create: targets 0x%x: must be a non-empty set of "
                    "ORCH_LORA_TARGET_* bits (0x1..0xf)",
                    desc->targets);
    if (!(desc->alpha > 0.0f) || !isfinite(desc->alpha))
        return fail(ctx, ORCH_ERR_INVALID_ARGUMENT,
                    "adapter_create: alpha %g must be a finite number > 0",
                    (double)desc->alpha);
    if (ctx->next_adapter_id == UINT32_MAX)
        return fail(ctx, ORCH_ERR_CAPACITY, "adapter_create: adapter ids used up");
    /* The table: layer by layer, target by target, A then B. */
    uint32_t per_layer = 0;
    for (uint32_t bit = 1; bit <= ORCH_LORA_TARGET_MLP_DOWN; bit <<= 1) {
        const char *sfx[3];
        if (desc->targets & bit) per_layer += 2 * target_suffixes(ctx, bit, sfx);
    }
    uint64_t n_tensors = (uint64_t)per_layer * ctx->model.layers;
    mock_adapter *a = calloc(1, sizeof *a);
    engine_tensor *t = a ? calloc((size_t)n_tensors, sizeof *t) : NULL;
    if (!t) {
        free(a);
        return fail(ctx, ORCH_ERR_OUT_OF_MEMORY, "adapter_create: out of memory");
    }
    a->tensors = t;
    uint64_t off = 0;
    uint32_t k = 0;
    for (uint32_t l = 0; l < ctx->model.layers; l++) {
        for (uint32_t bit = 1; bit <= ORCH_LORA_TARGET_MLP_DOWN; bit <<= 1) {
            if (!(desc->targets & bit)) continue;
            const char *sfx[3];
            uint32_t ns = target_suffixes(ctx, bit, sfx);
            for (uint32_t s = 0; s < ns; s++) {
                char base[ORCH_TENSOR_NAME_MAX];
                snprintf(base, sizeof base, "%s.%u.%s.weight",
                         ctx->model.arch == ORCH_ARCH_LLAMA ? "model.layers" : "h", l,
                         sfx[s]);
                const mock_tensor *w = &ctx->tensors[tensor_index(ctx, base)];
                uint64_t out = w->shape[0], in = w->shape[1];
                uint64_t lim = in < out ? in : out;
                if (desc->rank == 0 || desc->rank > lim) {
                    adapter_free(a);
                    return fail(ctx, ORCH_ERR_INVALID_ARGUMENT,
                                "adapter_create: rank %u: must be 1..%llu (min(in, out) "
                                "of %s [%llu,%llu])",
                                desc->rank, (unsigned long long)lim, base,
                                (unsigned long long)out, (unsigned long long)in);
                }
                size_t stem = strlen(base) - strlen(".weight");
                for (int ab = 0; ab < 2; ab++) {
                    engine_tensor *e = &t[k++];
                    snprintf(e->name, sizeof e->name, "%.*s.lora_%c.weight", (int)stem,
                             base, ab ? 'B' : 'A');
                    e->ndim = 2;
                    e->shape[0] = ab ? out : desc->rank;
                    e->shape[1] = ab ? desc->rank : in;
                    e->numel = e->shape[0] * e->shape[1];
                    e->offset = off;
                    off += e->numel;
                }
            }
        }
    }
    a->n_tensors = k;
    a->n_params = off;
    a->rank = desc->rank;
    a->alpha = desc->alpha;
    a->targets = desc->targets;
    a->params = calloc((size_t)off, sizeof(float));
    a->grads = calloc((size_t)off, sizeof(float));
    a->adam_m = calloc((size_t)off, sizeof(float));
    a->adam_v = calloc((size_t)off, sizeof(float));
    mock_adapter **list = realloc(ctx->adapters, (ctx->n_adapters + 1) * sizeof *list);
    if (list) ctx->adapters = list;
    if (!a->params || !a->grads || !a->adam_m || !a->adam_v || !list) {
        adapter_free(a);
        return fail(ctx, ORCH_ERR_OUT_OF_MEMORY,
                    "adapter_create: cannot allocate %llu adapter parameters",
                    (unsigned long long)off);
    }
    /* A uniform in [-1/sqrt(in), 1/sqrt(in)): the element at flat offset k
     * of the adapter's buffer is (2u - 1)/sqrt(in), u = (splitmix64(seed, k)
     * >> 11) / 2^53 (the CPU engine's stream: the same seed gives the same
     * A); B stays zero. */
    for (uint32_t i = 0; i < a->n_tensors; i += 2) {
        const engine_tensor *e = &t[i];
        double bound = 1.0 / sqrt((double)e->shape[1]);
        for (uint64_t j = 0; j < e->numel; j++) {
            uint64_t x = engine_splitmix64_at(desc->seed, e->offset + j);
            double u = (double)(x >> 11) * (1.0 / 9007199254740992.0);
            a->params[e->offset + j] = (float)((2.0 * u - 1.0) * bound);
        }
    }
    a->id = ++ctx->next_adapter_id;
    ctx->adapters[ctx->n_adapters++] = a;
    *out_id = a->id;
    return ORCH_OK;
}

/* ORCH_ERR_STATE when a fine-tuning stream is open on a (ABI 1.5). */
static int32_t adapter_fixed(orch_engine_ctx *ctx, const mock_adapter *a,
                             const char *fn) {
    if (!a->open_streams) return ORCH_OK;
    return fail(ctx, ORCH_ERR_STATE,
                "%s: adapter %u has %u open fine-tuning stream(s); close them first", fn,
                a->id, a->open_streams);
}

static int32_t mock_adapter_destroy(orch_engine_ctx *ctx, uint32_t adapter_id) {
    if (!ctx) return ORCH_ERR_INVALID_ARGUMENT;
    for (uint32_t i = 0; i < ctx->n_adapters; i++) {
        if (ctx->adapters[i]->id != adapter_id) continue;
        int32_t st = adapter_fixed(ctx, ctx->adapters[i], "adapter_destroy");
        if (st) return st;
        adapter_free(ctx->adapters[i]);
        memmove(ctx->adapters + i, ctx->adapters + i + 1,
                (ctx->n_adapters - i - 1) * sizeof *ctx->adapters);
        ctx->n_adapters--;
        return ORCH_OK;
    }
    return fail(ctx, ORCH_ERR_INVALID_ARGUMENT,
                "adapter_destroy: adapter_id %u: no such adapter", adapter_id);
}

static float *adapter_kind_buffer(mock_adapter *a, uint32_t kind) {
    return kind == ORCH_TENSOR_PARAM    ? a->params
           : kind == ORCH_TENSOR_ADAM_M ? a->adam_m
                                        : a->adam_v;
}

static int32_t mock_adapter_tensor_count(orch_engine_ctx *ctx, uint32_t adapter_id,
                                         uint32_t kind, uint32_t *out_count) {
    if (!ctx) return ORCH_ERR_INVALID_ARGUMENT;
    mock_adapter *a = adapter_find(ctx, adapter_id, "adapter_tensor_count");
    if (!a) return ORCH_ERR_INVALID_ARGUMENT;
    int32_t st = engine_check_tensor_count(kind, out_count, ENGINE_ERRBUF(ctx));
    if (st) return st;
    *out_count = a->n_tensors;
    return ORCH_OK;
}

static int32_t mock_adapter_tensor_info(orch_engine_ctx *ctx, uint32_t adapter_id,
                                        uint32_t kind, uint32_t index,
                                        orch_tensor_info *out) {
    if (!ctx) return ORCH_ERR_INVALID_ARGUMENT;
    mock_adapter *a = adapter_find(ctx, adapter_id, "adapter_tensor_info");
    if (!a) return ORCH_ERR_INVALID_ARGUMENT;
    int32_t st =
        engine_check_tensor_info(kind, index, a->n_tensors, out, ENGINE_ERRBUF(ctx));
    if (st) return st;
    engine_tensor_info_fill(&a->tensors[index], out);
    return ORCH_OK;
}

static int32_t mock_adapter_tensor_read(orch_engine_ctx *ctx, uint32_t adapter_id,
                                        uint32_t kind, uint32_t index, void *dst,
                                        uint64_t dst_bytes) {
    if (!ctx) return ORCH_ERR_INVALID_ARGUMENT;
    mock_adapter *a = adapter_find(ctx, adapter_id, "adapter_tensor_read");
    if (!a) return ORCH_ERR_INVALID_ARGUMENT;
    int32_t st = engine_check_tensor_io("adapter_tensor_read", kind, index, a->tensors,
                                        a->n_tensors, dst, dst_bytes, ENGINE_ERRBUF(ctx));
    if (st) return st;
    memcpy(dst, adapter_kind_buffer(a, kind) + a->tensors[index].offset,
           (size_t)dst_bytes);
    return ORCH_OK;
}

static int32_t mock_adapter_tensor_write(orch_engine_ctx *ctx, uint32_t adapter_id,
                                         uint32_t kind, uint32_t index, const void *src,
                                         uint64_t src_bytes) {
    if (!ctx) return ORCH_ERR_INVALID_ARGUMENT;
    mock_adapter *a = adapter_find(ctx, adapter_id, "adapter_tensor_write");
    if (!a) return ORCH_ERR_INVALID_ARGUMENT;
    int32_t st = engine_check_tensor_io("adapter_tensor_write", kind, index, a->tensors,
                                        a->n_tensors, src, src_bytes, ENGINE_ERRBUF(ctx));
    if (st) return st;
    if (kind == ORCH_TENSOR_PARAM && (st = adapter_fixed(ctx, a, "adapter_tensor_write")))
        return st;
    memcpy(adapter_kind_buffer(a, kind) + a->tensors[index].offset, src,
           (size_t)src_bytes);
    return ORCH_OK;
}

static int32_t mock_adapter_grads_zero(orch_engine_ctx *ctx, uint32_t adapter_id) {
    if (!ctx) return ORCH_ERR_INVALID_ARGUMENT;
    mock_adapter *a = adapter_find(ctx, adapter_id, "adapter_grads_zero");
    if (!a) return ORCH_ERR_INVALID_ARGUMENT;
    memset(a->grads, 0, (size_t)a->n_params * sizeof(float));
    return ORCH_OK;
}

static int32_t mock_adapter_grads_io(orch_engine_ctx *ctx, const char *fn,
                                     uint32_t adapter_id, uint64_t offset, uint64_t count,
                                     float *buf, int to_engine) {
    if (!ctx) return ORCH_ERR_INVALID_ARGUMENT;
    mock_adapter *a = adapter_find(ctx, adapter_id, fn);
    if (!a) return ORCH_ERR_INVALID_ARGUMENT;
    int32_t st =
        engine_check_grad_range(fn, offset, count, a->n_params, buf, ENGINE_ERRBUF(ctx));
    if (st) return st;
    if (!count) return ORCH_OK;
    if (to_engine)
        memcpy(a->grads + offset, buf, (size_t)count * sizeof(float));
    else
        memcpy(buf, a->grads + offset, (size_t)count * sizeof(float));
    return ORCH_OK;
}

static int32_t mock_adapter_grads_read(orch_engine_ctx *ctx, uint32_t adapter_id,
                                       uint64_t offset, uint64_t count, float *dst) {
    return mock_adapter_grads_io(ctx, "adapter_grads_read", adapter_id, offset, count,
                                 dst, 0);
}

static int32_t mock_adapter_grads_write(orch_engine_ctx *ctx, uint32_t adapter_id,
                                        uint64_t offset, uint64_t count,
                                        const float *src) {
    /* the buffer is only read on this path */
    return mock_adapter_grads_io(ctx, "adapter_grads_write", adapter_id, offset, count,
                                 (float *)src, 1);
}

/* The sigmoid of z of one (token x, target y, position) row through base +
 * adapter a (loss_tensor entries already initialised). */
static double adapter_row_sigmoid(orch_engine_ctx *ctx, const mock_adapter *a, uint64_t x,
                                  uint64_t y, uint32_t pos) {
    const double scale = (double)a->alpha / (double)a->rank;
    const uint64_t r = a->rank;
    uint64_t idx[4];
    term_entries(ctx, x, y, pos, idx);
    const float *p = ctx->params;
    double z = (double)p[idx[0]] + (double)p[idx[1]] + (double)p[idx[2]] +
               (double)p[idx[3]] + ctx->z_bias;
    for (uint32_t ti = 0; ti + 1 < a->n_tensors; ti += 2) {
        const engine_tensor *ta = &a->tensors[ti], *tb = &a->tensors[ti + 1];
        const float *A = a->params + ta->offset + x % ta->shape[1];
        const float *B = a->params + tb->offset + (y % tb->shape[0]) * r;
        double d = 0.0;
        for (uint64_t k = 0; k < r; k++) d += (double)B[k] * (double)A[k * ta->shape[1]];
        z += scale * d;
    }
    return 1.0 / (1.0 + exp(-z));
}

/* loss_compute through base + adapter a: z gains, per pair (A, B) of the
 * table, (alpha/rank) * sum_k B[y mod out, k] A[k, x mod in]. With grads
 * set, grad_scale * dloss/d(adapter) is added to a->grads (never the base's). */
static float adapter_loss(orch_engine_ctx *ctx, mock_adapter *a, const int32_t *tokens,
                          const int32_t *targets, uint32_t batch, uint32_t seq_len,
                          int with_grads, float grad_scale) {
    const double two_log_v = 2.0 * log((double)ctx->model.vocab_size);
    const double scale = (double)a->alpha / (double)a->rank;
    const uint64_t r = a->rank;
    for (int k = 0; k < 4; k++) param_ensure(ctx, ctx->loss_tensor[k]);
    uint64_t n = (uint64_t)batch * seq_len, counted = 0;
    for (uint64_t i = 0; i < n; i++) counted += targets[i] != -1;
    if (counted == 0) return 0.0f;
    double sum = 0.0;
    for (uint64_t i = 0; i < n; i++) {
        if (targets[i] == -1) continue;
        uint64_t x = (uint64_t)tokens[i], y = (uint64_t)targets[i];
        double s = adapter_row_sigmoid(ctx, a, x, y, (uint32_t)(i % seq_len));
        sum += two_log_v * s;
        if (!with_grads) continue;
        double g = (double)grad_scale * two_log_v * s * (1.0 - s) / (double)counted;
        for (uint32_t ti = 0; ti + 1 < a->n_tensors; ti += 2) {
            const engine_tensor *ta = &a->tensors[ti], *tb = &a->tensors[ti + 1];
            uint64_t ja = ta->offset + x % ta->shape[1];
            uint64_t jb = tb->offset + (y % tb->shape[0]) * r;
            for (uint64_t k = 0; k < r; k++) {
                float gb = (float)(g * scale * (double)a->params[ja + k * ta->shape[1]]);
                float ga = (float)(g * scale * (double)a->params[jb + k]);
                a->grads[jb + k] += gb;
                a->grads[ja + k * ta->shape[1]] += ga;
            }
        }
    }
    return (float)(sum / (double)counted);
}

static int32_t mock_adapter_forward_backward(orch_engine_ctx *ctx, uint32_t adapter_id,
                                             const int32_t *tokens,
                                             const int32_t *targets, uint32_t batch,
                                             uint32_t seq_len, float grad_scale,
                                             float *out_loss) {
    if (!ctx) return ORCH_ERR_INVALID_ARGUMENT;
    mock_adapter *a = adapter_find(ctx, adapter_id, "adapter_forward_backward");
    if (!a) return ORCH_ERR_INVALID_ARGUMENT;
    sleep_ms(ctx->cfg.sleep_ms);
    int32_t st = engine_check_train_call("adapter_forward_backward", tokens, targets,
                                         batch, seq_len, grad_scale, out_loss,
                                         &ctx->train_lim, NULL, ENGINE_ERRBUF(ctx));
    if (st) return st;
    *out_loss = adapter_loss(ctx, a, tokens, targets, batch, seq_len, 1, grad_scale);
    return ORCH_OK;
}

static int32_t mock_adapter_eval_loss(orch_engine_ctx *ctx, uint32_t adapter_id,
                                      const int32_t *tokens, const int32_t *targets,
                                      uint32_t batch, uint32_t seq_len, float *out_loss) {
    if (!ctx) return ORCH_ERR_INVALID_ARGUMENT;
    mock_adapter *a = adapter_find(ctx, adapter_id, "adapter_eval_loss");
    if (!a) return ORCH_ERR_INVALID_ARGUMENT;
    int32_t st = engine_check_train_call("adapter_eval_loss", tokens, targets, batch,
                                         seq_len, 0.0f, out_loss, &ctx->train_lim, NULL,
                                         ENGINE_ERRBUF(ctx));
    if (st) return st;
    *out_loss = adapter_loss(ctx, a, tokens, targets, batch, seq_len, 0, 0.0f);
    return ORCH_OK;
}

/* optimizer_step's AdamW (same order and arithmetic) over one adapter. */
static int32_t mock_adapter_optimizer_step(orch_engine_ctx *ctx, uint32_t adapter_id,
                                           const orch_adamw_params *params,
                                           float *out_grad_norm) {
    if (!ctx) return ORCH_ERR_INVALID_ARGUMENT;
    mock_adapter *a = adapter_find(ctx, adapter_id, "adapter_optimizer_step");
    if (!a) return ORCH_ERR_INVALID_ARGUMENT;
    orch_adamw_params p;
    int32_t st = engine_check_adamw(params, &p, ENGINE_ERRBUF(ctx));
    if (st != ORCH_OK) return st;
    if ((st = adapter_fixed(ctx, a, "adapter_optimizer_step"))) return st;
    double sq = 0.0;
    for (uint64_t i = 0; i < a->n_params; i++)
        sq += (double)a->grads[i] * (double)a->grads[i];
    double norm = sqrt(sq);
    if (!isfinite(norm)) return engine_fail_nonfinite_norm(ENGINE_ERRBUF(ctx));
    const float scale = engine_grad_clip_scale(&p, norm);
    if (scale != 1.0f)
        for (uint64_t i = 0; i < a->n_params; i++) a->grads[i] *= scale;
    const float b1 = p.beta1, b2 = p.beta2;
    const float bc1 = (float)(1.0 - pow((double)b1, (double)p.step));
    const float bc2 = (float)(1.0 - pow((double)b2, (double)p.step));
    for (uint32_t ti = 0; ti < a->n_tensors; ti++) {
        const engine_tensor *t = &a->tensors[ti];
        const float decay = engine_adamw_decay(&p, t->flags);
        float *w = a->params + t->offset, *g = a->grads + t->offset;
        float *m = a->adam_m + t->offset, *v = a->adam_v + t->offset;
        for (uint64_t i = 0; i < t->numel; i++) {
            m[i] = b1 * m[i] + (1.0f - b1) * g[i];
            v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
            float mhat = m[i] / bc1, vhat = v[i] / bc2;
            w[i] *= decay;
            w[i] -= p.lr * mhat / (sqrtf(vhat) + p.eps);
        }
    }
    if (out_grad_norm) *out_grad_norm = (float)norm;
    return ORCH_OK;
}

/* ------------------------------------------------------------------------- */
/* ABI 1.5: token-level fine-tuning streams (see "Streams" at the top)        */
/* ------------------------------------------------------------------------- */

static mock_stream *stream_find(orch_engine_ctx *ctx, uint32_t id, const char *fn) {
    for (uint32_t i = 0; i < ctx->n_streams; i++)
        if (ctx->streams[i]->id == id) return ctx->streams[i];
    fail(ctx, ORCH_ERR_INVALID_ARGUMENT, "%s: stream %u: no such fine-tuning stream", fn,
         id);
    return NULL;
}

static int32_t mock_ft_stream_open(orch_engine_ctx *ctx, const orch_finetune_batch *ft,
                                   uint32_t *out_stream) {
    if (!ctx) return ORCH_ERR_INVALID_ARGUMENT;
    if (!ft || !out_stream)
        return fail(ctx, ORCH_ERR_INVALID_ARGUMENT, "ft_stream_open: %s is NULL",
                    ft ? "out_stream" : "ft");
    int32_t st = engine_check_ft_batch("ft_stream_open", ft, &ctx->train_lim, NULL,
                                       ENGINE_ERRBUF(ctx));
    if (st) return st;
    mock_adapter *a = adapter_find(ctx, ft->adapter_id, "ft_stream_open");
    if (!a) return ORCH_ERR_INVALID_ARGUMENT;
    if (ctx->next_stream_id == UINT32_MAX)
        return fail(ctx, ORCH_ERR_CAPACITY, "ft_stream_open: stream ids used up");
    const uint64_t rows = (uint64_t)ft->batch * ft->seq_len;
    mock_stream *f = calloc(1, sizeof *f);
    mock_stream **list = realloc(ctx->streams, (ctx->n_streams + 1) * sizeof *list);
    if (list) ctx->streams = list;
    if (f) {
        f->tokens = malloc((size_t)rows * sizeof(int32_t));
        f->targets = malloc((size_t)rows * sizeof(int32_t));
    }
    if (!f || !list || !f->tokens || !f->targets) {
        stream_free(f);
        return fail(ctx, ORCH_ERR_OUT_OF_MEMORY, "ft_stream_open: out of memory");
    }
    memcpy(f->tokens, ft->tokens, (size_t)rows * sizeof(int32_t));
    memcpy(f->targets, ft->targets, (size_t)rows * sizeof(int32_t));
    f->adapter_id = a->id;
    f->batch = ft->batch;
    f->seq_len = ft->seq_len;
    f->grad_scale = ft->grad_scale;
    f->rows = rows;
    for (uint64_t i = 0; i < rows; i++) f->counted += f->targets[i] != -1;
    f->id = ++ctx->next_stream_id;
    ctx->streams[ctx->n_streams++] = f;
    a->open_streams++;
    *out_stream = f->id;
    return ORCH_OK;
}

static int32_t mock_ft_stream_close(orch_engine_ctx *ctx, uint32_t stream) {
    if (!ctx) return ORCH_ERR_INVALID_ARGUMENT;
    for (uint32_t i = 0; i < ctx->n_streams; i++) {
        mock_stream *f = ctx->streams[i];
        if (f->id != stream) continue;
        for (uint32_t j = 0; j < ctx->n_adapters; j++)
            if (ctx->adapters[j]->id == f->adapter_id) ctx->adapters[j]->open_streams--;
        stream_free(f);
        memmove(ctx->streams + i, ctx->streams + i + 1,
                (ctx->n_streams - i - 1) * sizeof *ctx->streams);
        ctx->n_streams--;
        return ORCH_OK;
    }
    return fail(ctx, ORCH_ERR_INVALID_ARGUMENT,
                "ft_stream_close: stream %u: no such fine-tuning stream", stream);
}

static void stream_progress(const mock_stream *f, uint64_t done, orch_ft_progress *out) {
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    out->finished = (uint32_t)f->finished;
    out->rows_total = f->rows;
    out->forward_rows = f->forward_rows;
    out->backward_rows = f->backward_rows;
    out->rows_this_step = done;
    out->loss = f->forward_rows == f->rows && f->counted
                    ? (float)(f->loss_sum / (double)f->counted)
                    : 0.0f;
}

/* coserve_step: the inference batch through infer_forward (the mock reads
 * no weights, so there is no pass to share), then the stream's rows: the
 * forward rows add their loss terms in row order (adapter_loss's order);
 * the backward rows are counted, and when the last one is done the
 * gradient is added by adapter_loss itself, so a stream gives exactly
 * adapter_forward_backward's bits. */
static int32_t mock_coserve_step(orch_engine_ctx *ctx, const orch_infer_batch *batch,
                                 float *logits, uint64_t logits_cap, uint32_t stream,
                                 uint32_t ft_rows, orch_ft_progress *progress) {
    if (!ctx) return ORCH_ERR_INVALID_ARGUMENT;
    if (progress && progress->struct_size < sizeof *progress)
        return fail(ctx, ORCH_ERR_INVALID_ARGUMENT,
                    "coserve_step: progress struct_size %u is below %zu",
                    progress->struct_size, sizeof *progress);
    mock_stream *f = NULL;
    if (stream && !(f = stream_find(ctx, stream, "coserve_step")))
        return ORCH_ERR_INVALID_ARGUMENT;
    int32_t st = enter(ctx, CALL_COSERVE_STEP);
    if (st) return st;
    if (batch &&
        (batch->struct_size < offsetof(orch_infer_batch, n_seqs) + sizeof batch->n_seqs ||
         batch->n_seqs > 0) &&
        (st = mock_infer_forward(ctx, batch, logits, logits_cap)) != ORCH_OK)
        return st;
    uint64_t done = 0;
    if (f && !f->finished && ft_rows) {
        mock_adapter *a = adapter_find(ctx, f->adapter_id, "coserve_step");
        if (!a) return ORCH_ERR_INTERNAL; /* cannot happen: destroy is refused */
        for (int k = 0; k < 4; k++) param_ensure(ctx, ctx->loss_tensor[k]);
        const double two_log_v = 2.0 * log((double)ctx->model.vocab_size);
        while (done < ft_rows && f->forward_rows < f->rows) {
            uint64_t i = f->forward_rows++;
            done++;
            if (f->targets[i] == -1) continue;
            f->loss_sum += two_log_v * adapter_row_sigmoid(ctx, a, (uint64_t)f->tokens[i],
                                                           (uint64_t)f->targets[i],
                                                           (uint32_t)(i % f->seq_len));
        }
        uint64_t back = ft_rows - done, left = f->rows - f->backward_rows;
        if (f->forward_rows == f->rows && back) {
            if (back > left) back = left;
            f->backward_rows += back;
            done += back;
            if (f->backward_rows == f->rows) {
                (void)adapter_loss(ctx, a, f->tokens, f->targets, f->batch, f->seq_len, 1,
                                   f->grad_scale);
                f->finished = 1;
            }
        }
    }
    if (progress) {
        if (f)
            stream_progress(f, done, progress);
        else {
            memset(progress, 0, sizeof *progress);
            progress->struct_size = sizeof *progress;
        }
    }
    return ORCH_OK;
}

/* ------------------------------------------------------------------------- */
/* Probe, status strings, the table                                           */
/* ------------------------------------------------------------------------- */

static int32_t mock_probe(char *msg, uint32_t msg_cap) {
    if (msg && msg_cap) snprintf(msg, msg_cap, "mock engine, no numerics");
    return ORCH_OK;
}

static const orch_engine_api mock_api = {
    .abi_major = ORCH_ENGINE_ABI_MAJOR,
    .abi_minor = ORCH_ENGINE_ABI_MINOR,
    .struct_size = sizeof(orch_engine_api),
    .name = "mock",
    .version = MOCK_VERSION,
    .capabilities = ORCH_CAP_TRAIN | ORCH_CAP_INFER | ORCH_CAP_KV_COPY | ORCH_CAP_EVAL |
                    ORCH_CAP_DETERMINISTIC | ORCH_CAP_FAULT_INJECTION | ORCH_CAP_LORA |
                    ORCH_CAP_FT_STREAM,
    .probe = mock_probe,
    .status_string = engine_status_string,
    .context_create = mock_context_create,
    .context_destroy = mock_context_destroy,
    .last_error = mock_last_error,
    .tensor_count = mock_tensor_count,
    .tensor_info = mock_tensor_info,
    .tensor_read = mock_tensor_read,
    .tensor_write = mock_tensor_write,
    .grads_zero = mock_grads_zero,
    .grads_read = mock_grads_read,
    .grads_write = mock_grads_write,
    .forward_backward = mock_forward_backward,
    .optimizer_step = mock_optimizer_step,
    .eval_loss = mock_eval_loss,
    .kv_block_bytes = mock_kv_block_bytes,
    .kv_configure = mock_kv_configure,
    .infer_forward = mock_infer_forward,
    .kv_copy_blocks = mock_kv_copy_blocks,
    .param_read = mock_param_read,
    .param_write = mock_param_write,
    .optimizer_shard = mock_optimizer_shard,
    .moments_read = mock_moments_read,
    .moments_write = mock_moments_write,
    .optimizer_step_range = mock_optimizer_step_range,
    .optimizer_bytes = mock_optimizer_bytes,
    .forward_backward_notify = mock_forward_backward_notify,
    .adapter_create = mock_adapter_create,
    .adapter_destroy = mock_adapter_destroy,
    .adapter_tensor_count = mock_adapter_tensor_count,
    .adapter_tensor_info = mock_adapter_tensor_info,
    .adapter_tensor_read = mock_adapter_tensor_read,
    .adapter_tensor_write = mock_adapter_tensor_write,
    .adapter_grads_zero = mock_adapter_grads_zero,
    .adapter_grads_read = mock_adapter_grads_read,
    .adapter_grads_write = mock_adapter_grads_write,
    .adapter_forward_backward = mock_adapter_forward_backward,
    .adapter_eval_loss = mock_adapter_eval_loss,
    .adapter_optimizer_step = mock_adapter_optimizer_step,
    .ft_stream_open = mock_ft_stream_open,
    .ft_stream_close = mock_ft_stream_close,
    .coserve_step = mock_coserve_step,
};

ORCH_ENGINE_EXPORT const orch_engine_api *orch_engine_get_api(uint32_t abi_major);

/* Returns the table for any abi_major: its frozen fields name our version, so
 * a loader built for another major can report both. */
const orch_engine_api *orch_engine_get_api(uint32_t abi_major) {
    (void)abi_major;
    return &mock_api;
}
