/*
 * orch_engine.h - the orch engine ABI: the one header shared by the orchestrator
 * and every numeric engine (mock, cpu, cuda, or any third-party .so).
 *
 * An engine is a shared library that exports exactly one symbol,
 * ORCH_ENGINE_ENTRY_SYMBOL ("orch_engine_get_api"), returning a const table of
 * function pointers (orch_engine_api). Everything else in the library is hidden
 * (-fvisibility=hidden).
 *
 * Versioning
 *   - abi_major must equal ORCH_ENGINE_ABI_MAJOR exactly; a mismatch is refused.
 *   - abi_minor grows when members are APPENDED to a struct. Nothing is ever
 *     reordered or removed inside a major version.
 *     1.0: GPT-2. 1.1: ORCH_ARCH_LLAMA and the orch_model_desc members after
 *     rope_theta (flags, rope scaling). 1.2: ZeRO-1, the flat parameter and
 *     moment access and the ranged optimizer step appended to orch_engine_api
 *     (see "Sharded optimizer state" below). 1.3: forward_backward_notify
 *     (gradient-ready callback, to overlap the all-reduce with the backward).
 *     1.4: LoRA adapters and the co-serving pass (see "LoRA adapters" below).
 *   - Every struct that crosses the boundary starts with (or contains) a
 *     struct_size field. A reader checks struct_size covers a member before using
 *     it, and a function-pointer member must also be non-NULL before it is called
 *     (see ORCH_API_HAS). Structs passed *to* an engine carry the caller's size, so
 *     an engine built against a newer minor treats absent trailing members as 0.
 *   - The leading fields of orch_engine_api (abi_major, abi_minor, struct_size,
 *     name) are frozen forever, across majors, so any loader can read and report
 *     them.
 *
 * Errors
 *   - Fallible calls return int32_t holding an orch_status. ORCH_OK is 0.
 *   - Every context keeps a last-error string (engine-owned, UTF-8, valid until the
 *     next call on that context) that explains the most recent failure.
 *     Functions that have no context (probe, context_create) take a caller buffer.
 *   - On failure, out-parameters are left untouched and engine state is unchanged
 *     unless the function says otherwise.
 *   - Engines never call exit(), abort() or print to stdout; they return a status.
 *
 * Memory
 *   - Contexts are opaque, created by context_create and released by
 *     context_destroy (which accepts NULL).
 *   - All data crosses through caller-owned host buffers with explicit sizes. The
 *     engine never returns memory for the caller to free, and never keeps a pointer
 *     to a caller buffer after the call returns.
 *   - Only fixed-width integers, float, UTF-8 strings and plain structs cross: no
 *     FILE*, errno, long, size_t, or JSON.
 *
 * Threads
 *   - orch_engine_get_api, probe and status_string are thread-safe and may be
 *     called at any time, from any thread.
 *   - A context is used by one thread at a time (the caller serialises). Different
 *     contexts may be used concurrently from different threads.
 *   - An engine may run its own worker threads inside a call (the `threads`
 *     option); they are idle when the call returns.
 *
 * Model tensors
 *   The engine publishes its state as named tensor tables, one per kind
 *   (orch_tensor_kind): parameters, AdamW first moments, AdamW second moments.
 *   The three tables have the same names, shapes and order. Checkpoint files are
 *   written by the orchestrator from these tables, by name, so a checkpoint
 *   written through one engine loads through another.
 *   GPT-2 names and shapes (row-major, nn.Linear layout [out, in]); C=width,
 *   V=vocab_size, T=context, M=mlp_width, i=layer index:
 *     wte.weight [V,C]  wpe.weight [T,C]
 *     h.i.ln_1.weight [C]  h.i.ln_1.bias [C]
 *     h.i.attn.c_attn.weight [3C,C]  h.i.attn.c_attn.bias [3C]   (q,k,v stacked)
 *     h.i.attn.c_proj.weight [C,C]   h.i.attn.c_proj.bias [C]
 *     h.i.ln_2.weight [C]  h.i.ln_2.bias [C]
 *     h.i.mlp.c_fc.weight [M,C]   h.i.mlp.c_fc.bias [M]
 *     h.i.mlp.c_proj.weight [C,M] h.i.mlp.c_proj.bias [C]
 *     ln_f.weight [C]  ln_f.bias [C]
 *   The LM head is tied to wte.weight. Any vocab padding an engine uses
 *   internally is invisible here.
 *   LLaMA names and shapes (ORCH_ARCH_LLAMA, ABI 1.1; Hugging Face's names and
 *   nn.Linear layout [out, in]); D = width/heads (head size), H = heads,
 *   KV = kv_heads, M = mlp_width:
 *     model.embed_tokens.weight [V,C]
 *     model.layers.i.input_layernorm.weight [C]
 *     model.layers.i.self_attn.q_proj.weight [H*D,C]
 *     model.layers.i.self_attn.k_proj.weight [KV*D,C]
 *     model.layers.i.self_attn.v_proj.weight [KV*D,C]
 *     model.layers.i.self_attn.o_proj.weight [C,H*D]
 *     model.layers.i.post_attention_layernorm.weight [C]
 *     model.layers.i.mlp.gate_proj.weight [M,C]
 *     model.layers.i.mlp.up_proj.weight [M,C]
 *     model.layers.i.mlp.down_proj.weight [C,M]
 *     model.norm.weight [C]
 *     lm_head.weight [V,C]   only with ORCH_MODEL_FLAG_UNTIED_HEAD; else the
 *                            head is tied to model.embed_tokens.weight
 *   The LLaMA block: h = x + o_proj(attn(rope(q), rope(k), v)) on
 *   RMSNorm(x)*input_layernorm; out = h + down_proj(silu(gate_proj(n)) *
 *   up_proj(n)) with n = RMSNorm(h)*post_attention_layernorm; RMSNorm(x) =
 *   x / sqrt(mean(x^2) + layernorm_eps); no biases. Query head j attends with
 *   key/value head j / (H/KV) (grouped-query attention). RoPE is Hugging
 *   Face's "rotate half" form: within a head, element d < D/2 pairs with
 *   d + D/2, rotated by angle pos * inv_freq[d], inv_freq[d] =
 *   rope_theta^(-2d/D), adjusted by rope_scaling (ORCH_ROPE_*) exactly as
 *   transformers' rope init functions do ("linear": inv_freq / factor;
 *   "llama3": wavelengths above original_context/low_freq_factor divided by
 *   factor, below original_context/high_freq_factor kept, smooth in between).
 *   Initialisation: N(0,0.02) matrices, o_proj and down_proj
 *   N(0,0.02/sqrt(2*layers)), RMSNorm weights 1; 1-D tensors carry NO_DECAY.
 *   The flat gradient buffer (grads_read / grads_write) is the concatenation of
 *   all parameter tensors in table order; its length is the sum of their numel.
 *   The flat parameter and moment buffers of ABI 1.2 have the same layout.
 *
 * Sharded optimizer state (ABI 1.2, ZeRO-1)
 *   A data-parallel caller with N processes gives each context a shard
 *   [offset, offset+count) of the flat buffer (optimizer_shard). From then on
 *   the context keeps AdamW moments for that range only (memory falls as
 *   1/N; optimizer_bytes reports it), optimizer_step_range updates parameters
 *   inside the shard from the gradients there, with the clipping scale taken
 *   from the GLOBAL gradient norm the caller computed over all shards, and
 *   the caller all-gathers parameters (param_read / param_write) and the
 *   reduced gradients (grads_write). The whole-buffer calls that need moments
 *   outside the shard (optimizer_step; tensor_read/tensor_write of
 *   ORCH_TENSOR_ADAM_M/ADAM_V) then return ORCH_ERR_STATE; moments_read /
 *   moments_write move moment ranges inside the shard (checkpoints: the
 *   caller gathers the shards). optimizer_shard(ctx, 0, total) restores the
 *   unsharded state (moments outside the old shard start at zero).
 *
 * Gradient-ready notification (ABI 1.3)
 *   forward_backward_notify is forward_backward that tells the caller, while
 *   the backward runs, which ranges of the flat gradient buffer are final for
 *   this call, so a data-parallel caller can start reducing them before the
 *   backward ends. The reported ranges are disjoint and together cover the
 *   whole buffer exactly once; typical order is the reverse of the forward
 *   (final norm and head, layers last to first, embeddings last). The callback
 *   runs on the caller's thread, inside the call; during it the caller may call
 *   grads_read on the same context (and nothing else on it); the engine never
 *   touches a reported range again during the call. Gradients are the same bits
 *   as forward_backward gives.
 *
 * LoRA adapters (ABI 1.4, ORCH_CAP_LORA)
 *   An adapter adds to a target weight W [out,in] the low-rank update
 *   (alpha/rank) * B A, A [rank,in], B [out,rank], without changing W:
 *   y = x W^T + (alpha/rank) * (x A^T) B^T (+ bias). Targets
 *   (ORCH_LORA_TARGET_*), per layer: GPT-2 h.i.attn.c_attn (ATTN_QKV),
 *   h.i.attn.c_proj (ATTN_OUT), h.i.mlp.c_fc (MLP_UP), h.i.mlp.c_proj
 *   (MLP_DOWN); LLaMA q_proj, k_proj, v_proj (ATTN_QKV), o_proj (ATTN_OUT),
 *   gate_proj, up_proj (MLP_UP), down_proj (MLP_DOWN). An adapter's tensor
 *   table (kinds PARAM, ADAM_M, ADAM_V) lists, layer by layer and target by
 *   target in the order above, "<base name minus .weight>.lora_A.weight"
 *   [rank,in] then "...lora_B.weight" [out,rank], f32, no flags (PEFT's
 *   tensor names without its "base_model.model." prefix, and for GPT-2
 *   without "transformer."). Initialisation (PEFT's default): A uniform in
 *   [-1/sqrt(in), 1/sqrt(in)) from desc->seed, B zero, so a new adapter
 *   leaves the model's output unchanged. Base weights are frozen under an
 *   adapter: adapter calls never read or write base gradients or moments.
 *   Adapter ids are >= 1 (0 is "the base model" in orch_seq_input.adapter_id)
 *   and are not reused by a context. An adapter's flat gradient buffer is its
 *   PARAM table concatenated in order (adapter_grads_read/write).
 *   Inference: each sequence of an infer_forward batch names its adapter (0 =
 *   none); a batch may mix adapters; the logits equal those of the merged
 *   weight W + (alpha/rank) B A (up to float rounding).
 *   Co-serving: coserve_forward runs one inference batch and fine-tuning
 *   micro-batches (each on its own adapter) through ONE pass over the base
 *   weights; the inference part gives the same logits as infer_forward, the
 *   fine-tuning part adds the same gradients as adapter_forward_backward.
 *
 * Token-level fine-tuning (ABI 1.5, ORCH_CAP_FT_STREAM)
 *   A fine-tuning micro-batch can also be run a few rows at a time across
 *   calls (FlexLLM's token-level fine-tuning), so that a co-serving scheduler
 *   can give it exactly the tokens an iteration has left. ft_stream_open
 *   copies the micro-batch and returns a stream id (>= 1, not reused by the
 *   context). Its rows are r = b * seq_len + t, rows_total = batch * seq_len.
 *   Each coserve_step does, beside its inference batch and in the same pass
 *   over the base weights, up to ft_rows rows of the stream's work: forward
 *   rows in increasing r (row r attends to rows of its own b up to r), then,
 *   once every forward row is done, backward rows in decreasing r. A step may
 *   finish the forward and start the backward. Forward and backward rows
 *   count alike in ft_rows. When the last backward row is done the gradients
 *   of (grad_scale * mean loss) are ADDED to the adapter's gradients (before
 *   that the adapter's gradients are untouched) and the stream is finished;
 *   further steps on it do no fine-tuning work. The loss and gradients equal
 *   adapter_forward_backward's on the same micro-batch up to float rounding
 *   (the sums are split differently). While a stream is open its adapter's
 *   parameters must not change: adapter_tensor_write of PARAM,
 *   adapter_optimizer_step and adapter_destroy of that adapter return
 *   ORCH_ERR_STATE and change nothing. A stream holds its own activations
 *   (other calls may run between its steps) until ft_stream_close, which
 *   may come at any point (a cancelled job: the adapter's gradients stay
 *   untouched unless the stream had finished).
 *
 * Inference and the KV cache
 *   The engine owns a pool of fixed-size KV blocks (kv_configure). Which block
 *   belongs to which sequence is the caller's business: each forward names, per
 *   sequence, the block table mapping logical block j (positions
 *   j*block_size .. j*block_size+block_size-1) to a pool block id. The engine
 *   writes K/V of the new tokens into those blocks and attends over positions
 *   0 .. start_pos+n_tokens-1 through the table. Blocks may be shared read-only
 *   between sequences (prefix caching); a block written by one sequence in a
 *   forward must not be referenced by another sequence of the same forward (copy it
 *   first with kv_copy_blocks). Engines may detect and reject such misuse.
 */
#ifndef ORCH_ENGINE_H
#define ORCH_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ORCH_ENGINE_ABI_MAJOR    1u
#define ORCH_ENGINE_ABI_MINOR    5u
#define ORCH_ENGINE_ENTRY_SYMBOL "orch_engine_get_api"

#if defined(_WIN32)
#define ORCH_ENGINE_EXPORT __declspec(dllexport)
#else
#define ORCH_ENGINE_EXPORT __attribute__((visibility("default")))
#endif

/* ------------------------------------------------------------------------- */
/* Status codes                                                               */
/* ------------------------------------------------------------------------- */
typedef enum orch_status {
    ORCH_OK = 0,
    ORCH_ERR_INVALID_ARGUMENT = 1, /* bad pointer, size, id, range */
    ORCH_ERR_OUT_OF_MEMORY = 2,    /* host or device allocation failed */
    ORCH_ERR_UNSUPPORTED = 3,      /* feature/arch/dtype not provided */
    ORCH_ERR_STATE = 4,            /* call out of order (e.g. no KV pool yet) */
    ORCH_ERR_CAPACITY = 5,         /* batch/pool/buffer too small */
    ORCH_ERR_DEVICE = 6,           /* device or driver failure, no device */
    ORCH_ERR_NUMERIC = 7,          /* NaN/Inf where a finite value is required */
    ORCH_ERR_INTERNAL = 8,         /* engine bug or injected fault */
    ORCH_STATUS_COUNT_V1 = 9       /* number of codes defined by ABI 1.0 */
} orch_status;

/* ------------------------------------------------------------------------- */
/* Enumerations (stored in uint32_t fields)                                    */
/* ------------------------------------------------------------------------- */
typedef enum orch_arch {
    ORCH_ARCH_GPT2 = 1, /* learned positions, LayerNorm, GELU(tanh), tied head */
    ORCH_ARCH_LLAMA = 2 /* ABI 1.1: RoPE, RMSNorm, SwiGLU, GQA, optional untied head */
} orch_arch;

/* RoPE frequency scaling of ORCH_ARCH_LLAMA (orch_model_desc.rope_scaling,
 * ABI 1.1). Hugging Face's rope_scaling.rope_type of the same name. */
typedef enum orch_rope_scaling {
    ORCH_ROPE_NONE = 0,   /* inv_freq as given by rope_theta */
    ORCH_ROPE_LINEAR = 1, /* inv_freq / rope_factor */
    ORCH_ROPE_LLAMA3 = 2  /* Llama 3.1: factor, low/high_freq_factor, original_context */
} orch_rope_scaling;

/* orch_model_desc.flags (ABI 1.1). */
#define ORCH_MODEL_FLAG_UNTIED_HEAD (1u << 0) /* llama: separate lm_head.weight */

typedef enum orch_dtype {
    ORCH_DTYPE_F32 = 0,
    ORCH_DTYPE_F16 = 1,
    ORCH_DTYPE_BF16 = 2,
    ORCH_DTYPE_I32 = 3
} orch_dtype;

typedef enum orch_tensor_kind {
    ORCH_TENSOR_PARAM = 0,  /* model parameters */
    ORCH_TENSOR_ADAM_M = 1, /* AdamW first moments, same table as PARAM */
    ORCH_TENSOR_ADAM_V = 2  /* AdamW second moments, same table as PARAM */
} orch_tensor_kind;

/* Capability bits (orch_engine_api.capabilities). */
#define ORCH_CAP_TRAIN           (1ull << 0) /* forward_backward/optimizer/grads */
#define ORCH_CAP_INFER           (1ull << 1) /* kv_configure/infer_forward */
#define ORCH_CAP_KV_COPY         (1ull << 2) /* kv_copy_blocks */
#define ORCH_CAP_EVAL            (1ull << 3) /* eval_loss */
#define ORCH_CAP_DETERMINISTIC   (1ull << 4) /* same inputs+threads: same bits */
#define ORCH_CAP_GPU             (1ull << 5) /* runs on an accelerator */
#define ORCH_CAP_FAULT_INJECTION (1ull << 6) /* honours fault-injection options */
#define ORCH_CAP_LORA            (1ull << 7) /* ABI 1.4: adapters (train + infer) */
#define ORCH_CAP_COSERVE         (1ull << 8) /* ABI 1.4: coserve_forward */
#define ORCH_CAP_FT_STREAM       (1ull << 9) /* ABI 1.5: ft_stream_*, coserve_step */

/* LoRA target matrices (orch_lora_desc.targets, ABI 1.4). */
#define ORCH_LORA_TARGET_ATTN_QKV (1u << 0) /* gpt2 c_attn; llama q/k/v_proj */
#define ORCH_LORA_TARGET_ATTN_OUT (1u << 1) /* gpt2 attn.c_proj; llama o_proj */
#define ORCH_LORA_TARGET_MLP_UP   (1u << 2) /* gpt2 c_fc; llama gate/up_proj */
#define ORCH_LORA_TARGET_MLP_DOWN (1u << 3) /* gpt2 mlp.c_proj; llama down_proj */
#define ORCH_LORA_TARGET_ALL      0xfu

/* Tensor flags (orch_tensor_info.flags). */
#define ORCH_TENSOR_FLAG_NO_DECAY (1u << 0) /* AdamW weight decay skips it */

/* ------------------------------------------------------------------------- */
/* Plain structs                                                              */
/* ------------------------------------------------------------------------- */

/* Model description. Caller fills it (struct_size = sizeof). Zero in a reserved
 * or absent field means "default". */
typedef struct orch_model_desc {
    uint32_t struct_size;
    uint32_t arch; /* orch_arch */
    uint32_t vocab_size;
    uint32_t context; /* maximum sequence length (positions) */
    uint32_t layers;
    uint32_t heads;
    uint32_t kv_heads;   /* 0 = heads; llama: must divide heads; gpt2: = heads */
    uint32_t width;      /* embedding width C; heads must divide it */
    uint32_t mlp_width;  /* 0 = 4*width */
    float layernorm_eps; /* 0 = 1e-5 (the RMSNorm epsilon for llama) */
    float rope_theta;    /* llama: 0 = 10000; gpt2: must be 0 */
    /* ---- ABI 1.1 (these took reserved words: an ABI 1.0 engine ignores them,
     * so a caller sends llama only to an engine of minor >= 1). Zero =
     * default; gpt2 requires all of them 0. ---- */
    uint32_t flags;                 /* ORCH_MODEL_FLAG_* */
    uint32_t rope_scaling;          /* orch_rope_scaling */
    float rope_factor;              /* LINEAR, LLAMA3: > 0 (1 = no change) */
    float rope_low_freq_factor;     /* LLAMA3: > 0 */
    float rope_high_freq_factor;    /* LLAMA3: > low_freq_factor */
    uint32_t rope_original_context; /* LLAMA3: original_max_position_embeddings */
    uint32_t reserved[3];
} orch_model_desc;

/* Context options. Caller fills it (struct_size = sizeof). */
typedef struct orch_engine_options {
    uint32_t struct_size;
    uint32_t threads; /* worker threads; 0 = all cores */
    uint64_t seed;    /* seed of the engine's weight initialisation */
    /* Engine-specific "key=value" pairs separated by commas or semicolons, e.g.
     * "math=tf32" or "fault=infer_forward:3". May be NULL. Unknown keys are an
     * ORCH_ERR_INVALID_ARGUMENT from context_create. Copied; not kept. */
    const char *options;
} orch_engine_options;

/* One tensor of a table. Filled by the engine. */
#define ORCH_TENSOR_NAME_MAX 64
#define ORCH_TENSOR_MAX_DIMS 4
typedef struct orch_tensor_info {
    uint32_t struct_size;
    uint32_t dtype; /* orch_dtype; f32 for every GPT-2 tensor */
    uint32_t ndim;
    uint32_t flags; /* ORCH_TENSOR_FLAG_* */
    uint64_t shape[ORCH_TENSOR_MAX_DIMS];
    uint64_t numel;
    uint64_t offset; /* element offset of this tensor in the flat buffer */
    char name[ORCH_TENSOR_NAME_MAX]; /* NUL-terminated UTF-8 */
} orch_tensor_info;

/* AdamW hyper-parameters, passed on every optimizer_step. */
typedef struct orch_adamw_params {
    uint32_t struct_size;
    uint32_t reserved0;
    uint64_t step; /* 1-based step number t, for bias correction */
    float lr;
    float beta1;
    float beta2;
    float eps;
    float weight_decay; /* decoupled; skipped for ORCH_TENSOR_FLAG_NO_DECAY */
    float grad_clip;    /* clip global L2 norm to this; <= 0: no clipping */
} orch_adamw_params;

/* Which logits infer_forward returns for a sequence. */
typedef enum orch_logits_mode {
    ORCH_LOGITS_LAST = 0, /* one row: the last new token (default) */
    ORCH_LOGITS_ALL = 1,  /* n_tokens rows: every new token */
    ORCH_LOGITS_NONE = 2  /* no rows (e.g. a prefill chunk that is not last) */
} orch_logits_mode;

/* One sequence of an inference batch. */
typedef struct orch_seq_input {
    const int32_t *tokens;      /* n_tokens new token ids, 0 <= id < vocab */
    uint32_t n_tokens;          /* >= 1 */
    uint32_t start_pos;         /* position of tokens[0]; KV of 0..start_pos-1
                                   is already in the blocks */
    const int32_t *block_table; /* pool block ids, logical order */
    uint32_t n_blocks;          /* must cover start_pos + n_tokens positions */
    uint32_t logits_mode;       /* orch_logits_mode */
    uint32_t adapter_id;        /* ABI 1.4: LoRA adapter of this sequence, 0 =
                                   base model (engines without ORCH_CAP_LORA
                                   require 0) */
    uint32_t reserved0;
} orch_seq_input;

/* An inference batch. seq_stride = sizeof(orch_seq_input) of the caller, so
 * the element struct can grow by appending. */
typedef struct orch_infer_batch {
    uint32_t struct_size;
    uint32_t n_seqs;
    uint32_t seq_stride;
    uint32_t reserved0;
    const orch_seq_input *seqs;
} orch_infer_batch;

/* A LoRA adapter to create (ABI 1.4). Caller fills it (struct_size = sizeof). */
typedef struct orch_lora_desc {
    uint32_t struct_size;
    uint32_t rank;    /* >= 1 and <= min(in, out) of every target matrix */
    float alpha;      /* > 0; the update is scaled by alpha / rank */
    uint32_t targets; /* ORCH_LORA_TARGET_* bits, at least one */
    uint64_t seed;    /* seed of A's initialisation */
    uint32_t reserved[4];
} orch_lora_desc;

/* One fine-tuning micro-batch of a coserve_forward call (ABI 1.4): tokens and
 * targets [batch, seq_len] row-major as for forward_backward (target -1 is
 * ignored), on adapter `adapter_id` (>= 1). */
typedef struct orch_finetune_batch {
    uint32_t struct_size;
    uint32_t adapter_id;
    const int32_t *tokens;
    const int32_t *targets;
    uint32_t batch;
    uint32_t seq_len;
    float grad_scale; /* as forward_backward's */
    uint32_t reserved0;
} orch_finetune_batch;

/* Progress of a fine-tuning stream after coserve_step (ABI 1.5). */
typedef struct orch_ft_progress {
    uint32_t struct_size;    /* set by the caller: sizeof(orch_ft_progress) */
    uint32_t finished;       /* 1 once the last backward row is done */
    uint64_t rows_total;     /* batch * seq_len */
    uint64_t forward_rows;   /* forward rows done, 0..rows_total */
    uint64_t backward_rows;  /* backward rows done, 0..rows_total */
    uint64_t rows_this_step; /* rows of work done by this call */
    float loss;              /* mean loss; valid once forward_rows == rows_total */
    uint32_t reserved0;
} orch_ft_progress;

/* Gradient-ready callback of forward_backward_notify (ABI 1.3): elements
 * [offset, offset+count) of the flat gradient buffer are final. */
typedef void (*orch_grad_ready_fn)(void *user, uint64_t offset, uint64_t count);

typedef struct orch_engine_ctx orch_engine_ctx; /* opaque */

/* ------------------------------------------------------------------------- */
/* The function table                                                         */
/* ------------------------------------------------------------------------- */
typedef struct orch_engine_api {
    /* ---- frozen forever ---- */
    uint32_t abi_major;   /* ORCH_ENGINE_ABI_MAJOR of the engine */
    uint32_t abi_minor;   /* ORCH_ENGINE_ABI_MINOR of the engine */
    uint32_t struct_size; /* sizeof(orch_engine_api) of the engine */
    uint32_t reserved0;
    const char *name; /* short engine name, e.g. "cpu"; static storage */

    /* ---- ABI 1.0 ---- */
    const char *version;   /* engine build version string; static storage */
    uint64_t capabilities; /* ORCH_CAP_* bits */

    /* Can this engine run on this machine? Writes a NUL-terminated one-line
     * explanation into msg (truncated to msg_cap) on success (e.g. "2 cores")
     * and failure (e.g. "no CUDA device"). Returns ORCH_OK or
     * ORCH_ERR_DEVICE/ORCH_ERR_UNSUPPORTED. Thread-safe. */
    int32_t (*probe)(char *msg, uint32_t msg_cap);

    /* Static English text for a status code; never NULL (unknown codes give
     * "unknown status"). Thread-safe. */
    const char *(*status_string)(int32_t status);

    /* Create a context for `model`. Parameters are initialised from opts->seed
     * (GPT-2: N(0,0.02) weights, residual projections N(0,0.02/sqrt(2*layers)),
     * zero biases, LayerNorm weight 1); moments and gradients start at zero.
     * On success *out_ctx receives the context (owned by the caller; release
     * with context_destroy). On failure *out_ctx is untouched and err (if not
     * NULL) receives a NUL-terminated message truncated to err_cap. */
    int32_t (*context_create)(const orch_model_desc *model,
                              const orch_engine_options *opts, orch_engine_ctx **out_ctx,
                              char *err, uint32_t err_cap);

    /* Release everything the context holds. NULL is a no-op. */
    void (*context_destroy)(orch_engine_ctx *ctx);

    /* Message of the last failed call on ctx ("" if none). Engine-owned, valid
     * until the next call on ctx. Never NULL for a valid ctx. */
    const char *(*last_error)(const orch_engine_ctx *ctx);

    /* Number of tensors in the table of `kind` (orch_tensor_kind). */
    int32_t (*tensor_count)(orch_engine_ctx *ctx, uint32_t kind, uint32_t *out_count);

    /* Describe tensor `index` of table `kind` into *out (caller sets
     * out->struct_size; the engine fills at most that many bytes). */
    int32_t (*tensor_info)(orch_engine_ctx *ctx, uint32_t kind, uint32_t index,
                           orch_tensor_info *out);

    /* Copy tensor `index` of `kind` into dst (dst_bytes must equal numel times
     * the dtype size) / from src. Row-major, dtype as in tensor_info. */
    int32_t (*tensor_read)(orch_engine_ctx *ctx, uint32_t kind, uint32_t index, void *dst,
                           uint64_t dst_bytes);
    int32_t (*tensor_write)(orch_engine_ctx *ctx, uint32_t kind, uint32_t index,
                            const void *src, uint64_t src_bytes);

    /* ---- training (ORCH_CAP_TRAIN) ---- */

    /* Set every gradient to zero. */
    int32_t (*grads_zero)(orch_engine_ctx *ctx);

    /* Copy `count` f32 gradient elements starting at element `offset` of the
     * flat gradient buffer into dst / from src. offset+count must not exceed
     * the total parameter count. */
    int32_t (*grads_read)(orch_engine_ctx *ctx, uint64_t offset, uint64_t count,
                          float *dst);
    int32_t (*grads_write)(orch_engine_ctx *ctx, uint64_t offset, uint64_t count,
                           const float *src);

    /* Forward + backward of next-token cross-entropy over a micro-batch.
     * tokens and targets are [batch, seq_len] row-major; a target of -1 is
     * ignored. *out_loss receives the mean loss over non-ignored targets.
     * Gradients of (grad_scale * mean loss) are ADDED to the gradient buffer
     * (use grad_scale = 1/grad_accum to average micro-batches). */
    int32_t (*forward_backward)(orch_engine_ctx *ctx, const int32_t *tokens,
                                const int32_t *targets, uint32_t batch, uint32_t seq_len,
                                float grad_scale, float *out_loss);

    /* AdamW step over all parameters using the current gradients: the global
     * L2 norm of the gradients is computed first and written to
     * *out_grad_norm (may be NULL); if grad_clip > 0 and the norm exceeds it,
     * the gradient buffer is scaled in place by grad_clip/norm before the
     * update (as torch.nn.utils.clip_grad_norm_ does). Gradients are not
     * zeroed.
     * A non-finite norm returns ORCH_ERR_NUMERIC and changes nothing. */
    int32_t (*optimizer_step)(orch_engine_ctx *ctx, const orch_adamw_params *params,
                              float *out_grad_norm);

    /* ---- evaluation (ORCH_CAP_EVAL) ---- */

    /* Mean cross-entropy like forward_backward, without touching gradients. */
    int32_t (*eval_loss)(orch_engine_ctx *ctx, const int32_t *tokens,
                         const int32_t *targets, uint32_t batch, uint32_t seq_len,
                         float *out_loss);

    /* ---- inference (ORCH_CAP_INFER) ---- */

    /* Bytes of engine memory one KV block of block_size positions takes (all
     * layers, K and V of kv_heads heads), so the caller can size the pool from a budget. */
    int32_t (*kv_block_bytes)(orch_engine_ctx *ctx, uint32_t block_size,
                              uint64_t *out_bytes);

    /* Allocate the KV pool: num_blocks blocks of block_size positions each.
     * Replaces any previous pool (its contents are lost). */
    int32_t (*kv_configure)(orch_engine_ctx *ctx, uint32_t block_size,
                            uint32_t num_blocks);

    /* Run one forward over a batch of sequences (see the header comment).
     * Logit rows are written to `logits` in batch order, per sequence as its
     * logits_mode asks, each row vocab_size f32; logits_cap is the capacity of
     * `logits` in floats. Errors: token id out of range, start_pos+n_tokens over
     * context, block id outside the pool, too few blocks, logits_cap too small,
     * a block written by one sequence and referenced by another. On error no
     * logits are written; KV blocks of the batch may have been written. */
    int32_t (*infer_forward)(orch_engine_ctx *ctx, const orch_infer_batch *batch,
                             float *logits, uint64_t logits_cap);

    /* Copy the contents of block src[i] to block dst[i] for i < n
     * (copy-on-write). src and dst ranges must not overlap as sets. */
    int32_t (*kv_copy_blocks)(orch_engine_ctx *ctx, const int32_t *src,
                              const int32_t *dst, uint32_t n);

    /* ---- ABI 1.2: flat parameter access and ZeRO-1 (ORCH_CAP_TRAIN) ----
     * Ranges are element ranges [offset, offset+count) of the flat buffers
     * (see the header comment); offset+count must not exceed the total
     * parameter count and a buffer pointer may be NULL only when count is 0.
     * Violations return ORCH_ERR_INVALID_ARGUMENT and change nothing. */

    /* Copy `count` f32 parameter elements starting at element `offset` of the
     * flat parameter buffer into dst / from src (param_write behaves like
     * tensor_write of the tensors it covers: an engine that keeps derived
     * copies of its weights refreshes them). */
    int32_t (*param_read)(orch_engine_ctx *ctx, uint64_t offset, uint64_t count,
                          float *dst);
    int32_t (*param_write)(orch_engine_ctx *ctx, uint64_t offset, uint64_t count,
                           const float *src);

    /* Keep AdamW moments for the flat range [offset, offset+count) only
     * (count >= 1). Moments inside both the old and the new range keep their
     * values, the others are released (or, for newly covered elements, start
     * at zero). (0, total) is the unsharded default. */
    int32_t (*optimizer_shard)(orch_engine_ctx *ctx, uint64_t offset, uint64_t count);

    /* Copy `count` f32 moments (kind ORCH_TENSOR_ADAM_M or ORCH_TENSOR_ADAM_V)
     * starting at flat element `offset` into dst / from src. The range must lie
     * inside the shard (ORCH_ERR_STATE otherwise). */
    int32_t (*moments_read)(orch_engine_ctx *ctx, uint32_t kind, uint64_t offset,
                            uint64_t count, float *dst);
    int32_t (*moments_write)(orch_engine_ctx *ctx, uint32_t kind, uint64_t offset,
                             uint64_t count, const float *src);

    /* AdamW step (params as for optimizer_step) of the elements
     * [offset, offset+count) only, which must lie inside the shard
     * (ORCH_ERR_STATE otherwise), from the gradients in that range.
     * global_grad_norm is the L2 norm of the WHOLE gradient (all shards of all
     * processes), computed by the caller; clipping scales by
     * grad_clip/global_grad_norm when grad_clip > 0 and the norm exceeds it,
     * exactly as optimizer_step with that norm would (the gradients of the
     * range may be left scaled, as optimizer_step leaves them). A negative or non-finite norm returns ORCH_ERR_NUMERIC and
     * changes nothing. Per-tensor weight decay flags apply per element, so a
     * range may start and end inside a tensor. */
    int32_t (*optimizer_step_range)(orch_engine_ctx *ctx, const orch_adamw_params *params,
                                    uint64_t offset, uint64_t count,
                                    float global_grad_norm);

    /* Bytes of host plus device memory the AdamW moments take now (0 before
     * training allocated them), so a caller can check the 1/N of a shard. */
    int32_t (*optimizer_bytes)(orch_engine_ctx *ctx, uint64_t *out_bytes);

    /* ---- ABI 1.3: gradient-ready notification (ORCH_CAP_TRAIN) ---- */

    /* forward_backward (same arguments, same gradients) that calls
     * ready(user, offset, count) as ranges of the flat gradient buffer become
     * final (see the header comment). ready may be NULL (then it is exactly
     * forward_backward). On failure some ranges may have been reported and
     * the gradient buffer is unspecified. */
    int32_t (*forward_backward_notify)(orch_engine_ctx *ctx, const int32_t *tokens,
                                       const int32_t *targets, uint32_t batch,
                                       uint32_t seq_len, float grad_scale,
                                       float *out_loss, orch_grad_ready_fn ready,
                                       void *user);

    /* ---- ABI 1.4: LoRA adapters (ORCH_CAP_LORA) ----
     * Errors: an unknown adapter id is ORCH_ERR_INVALID_ARGUMENT; every call
     * that fails changes nothing. */

    /* Create an adapter (see the header comment); *out_id receives its id. A
     * rank, alpha or target set the model cannot take is
     * ORCH_ERR_INVALID_ARGUMENT with a message naming the field. */
    int32_t (*adapter_create)(orch_engine_ctx *ctx, const orch_lora_desc *desc,
                              uint32_t *out_id);

    /* Release an adapter, its moments and gradients. */
    int32_t (*adapter_destroy)(orch_engine_ctx *ctx, uint32_t adapter_id);

    /* The adapter's tensor tables, as tensor_count/info/read/write are for
     * the base model (kinds PARAM, ADAM_M, ADAM_V). Writing PARAM refreshes
     * whatever the engine derived from it. */
    int32_t (*adapter_tensor_count)(orch_engine_ctx *ctx, uint32_t adapter_id,
                                    uint32_t kind, uint32_t *out_count);
    int32_t (*adapter_tensor_info)(orch_engine_ctx *ctx, uint32_t adapter_id,
                                   uint32_t kind, uint32_t index, orch_tensor_info *out);
    int32_t (*adapter_tensor_read)(orch_engine_ctx *ctx, uint32_t adapter_id,
                                   uint32_t kind, uint32_t index, void *dst,
                                   uint64_t dst_bytes);
    int32_t (*adapter_tensor_write)(orch_engine_ctx *ctx, uint32_t adapter_id,
                                    uint32_t kind, uint32_t index, const void *src,
                                    uint64_t src_bytes);

    /* The adapter's gradients: zero, and ranges of its flat buffer. */
    int32_t (*adapter_grads_zero)(orch_engine_ctx *ctx, uint32_t adapter_id);
    int32_t (*adapter_grads_read)(orch_engine_ctx *ctx, uint32_t adapter_id,
                                  uint64_t offset, uint64_t count, float *dst);
    int32_t (*adapter_grads_write)(orch_engine_ctx *ctx, uint32_t adapter_id,
                                   uint64_t offset, uint64_t count, const float *src);

    /* forward_backward through base + adapter: gradients of
     * (grad_scale * mean loss) are ADDED to the adapter's gradients only. */
    int32_t (*adapter_forward_backward)(orch_engine_ctx *ctx, uint32_t adapter_id,
                                        const int32_t *tokens, const int32_t *targets,
                                        uint32_t batch, uint32_t seq_len,
                                        float grad_scale, float *out_loss);

    /* eval_loss through base + adapter. */
    int32_t (*adapter_eval_loss)(orch_engine_ctx *ctx, uint32_t adapter_id,
                                 const int32_t *tokens, const int32_t *targets,
                                 uint32_t batch, uint32_t seq_len, float *out_loss);

    /* AdamW step of the adapter's tensors from its gradients, with clipping
     * of the adapter's gradient norm, as optimizer_step does for the base. */
    int32_t (*adapter_optimizer_step)(orch_engine_ctx *ctx, uint32_t adapter_id,
                                      const orch_adamw_params *params,
                                      float *out_grad_norm);

    /* ---- ABI 1.4: co-serving (ORCH_CAP_COSERVE) ---- */

    /* One pass over the base weights for an inference batch (may be NULL or
     * have 0 sequences; logits as infer_forward writes them) and n_finetune
     * fine-tuning micro-batches ft[0..n_finetune-1] (stride ft_stride =
     * sizeof(orch_finetune_batch) of the caller); out_losses[i] receives the
     * mean loss of ft[i] (may be NULL when n_finetune is 0). Results equal
     * infer_forward followed by adapter_forward_backward on each ft[i]. */
    int32_t (*coserve_forward)(orch_engine_ctx *ctx, const orch_infer_batch *batch,
                               float *logits, uint64_t logits_cap,
                               const orch_finetune_batch *ft, uint32_t n_finetune,
                               uint32_t ft_stride, float *out_losses);

    /* ---- ABI 1.5: token-level fine-tuning (ORCH_CAP_FT_STREAM) ---- */

    /* Open a stream for one micro-batch (checked as coserve_forward checks
     * ft[i]; ft->struct_size as there). Tokens and targets are copied. The
     * adapter must exist. *out_stream receives the id. ORCH_ERR_CAPACITY
     * when the engine cannot hold another stream's activations. */
    int32_t (*ft_stream_open)(orch_engine_ctx *ctx, const orch_finetune_batch *ft,
                              uint32_t *out_stream);

    /* Release a stream (finished or not) and its activations. */
    int32_t (*ft_stream_close)(orch_engine_ctx *ctx, uint32_t stream);

    /* One pass over the base weights: the inference batch (may be NULL or
     * have 0 sequences; logits as infer_forward writes them) and up to
     * ft_rows rows of work of `stream` (0: none; see the header comment).
     * progress (may be NULL; progress->struct_size set by the caller) receives
     * the stream's state after the call. On failure the stream is left as
     * it was before the call when the engine can; otherwise it reports
     * ORCH_ERR_STATE on its next step and must be closed. */
    int32_t (*coserve_step)(orch_engine_ctx *ctx, const orch_infer_batch *batch,
                            float *logits, uint64_t logits_cap, uint32_t stream,
                            uint32_t ft_rows, orch_ft_progress *progress);
    /* ---- later minors append here ---- */
} orch_engine_api;

/* The one exported symbol. Returns the engine's table if it can serve
 * `abi_major`. An engine that cannot should still return its own table (whose
 * frozen leading fields name its version, so the loader can report both
 * versions) or NULL. The table is static and valid while the library is
 * loaded. Thread-safe. */
typedef const orch_engine_api *(*orch_engine_get_api_fn)(uint32_t abi_major);

/* True when `api` (of size api->struct_size) has a non-NULL `member`. */
#define ORCH_API_HAS(api, member)                                                       \
    ((api)->struct_size >= offsetof(orch_engine_api, member) + sizeof((api)->member) && \
     (api)->member != NULL)

/* ------------------------------------------------------------------------- */
/* Layout pins (LP64). Changing any of these breaks every engine binary.      */
/* ------------------------------------------------------------------------- */
#ifdef __cplusplus
#define ORCH_ABI_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#else
#define ORCH_ABI_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif
#if defined(__LP64__) || defined(_LP64)
ORCH_ABI_STATIC_ASSERT(offsetof(orch_engine_api, abi_major) == 0, "abi_major");
ORCH_ABI_STATIC_ASSERT(offsetof(orch_engine_api, abi_minor) == 4, "abi_minor");
ORCH_ABI_STATIC_ASSERT(offsetof(orch_engine_api, struct_size) == 8, "struct_size");
ORCH_ABI_STATIC_ASSERT(offsetof(orch_engine_api, name) == 16, "name");
ORCH_ABI_STATIC_ASSERT(offsetof(orch_engine_api, version) == 24, "version");
ORCH_ABI_STATIC_ASSERT(offsetof(orch_engine_api, capabilities) == 32, "caps");
ORCH_ABI_STATIC_ASSERT(offsetof(orch_engine_api, probe) == 40, "probe");
ORCH_ABI_STATIC_ASSERT(offsetof(orch_engine_api, kv_copy_blocks) == 40 + 8 * 18,
                       "function members of ABI 1.0");
ORCH_ABI_STATIC_ASSERT(offsetof(orch_engine_api, param_read) == 40 + 8 * 19,
                       "api size 1.0 and 1.1 (first member of 1.2)");
ORCH_ABI_STATIC_ASSERT(offsetof(orch_engine_api, optimizer_bytes) == 40 + 8 * 25,
                       "function members of ABI 1.2");
ORCH_ABI_STATIC_ASSERT(offsetof(orch_engine_api, forward_backward_notify) == 40 + 8 * 26,
                       "api size 1.2 (first member of 1.3)");
ORCH_ABI_STATIC_ASSERT(offsetof(orch_engine_api, adapter_create) == 40 + 8 * 27,
                       "api size 1.3 (first member of 1.4)");
ORCH_ABI_STATIC_ASSERT(offsetof(orch_engine_api, coserve_forward) == 40 + 8 * 39,
                       "function members of ABI 1.4");
ORCH_ABI_STATIC_ASSERT(offsetof(orch_engine_api, ft_stream_open) == 40 + 8 * 40,
                       "api size 1.4 (first member of 1.5)");
ORCH_ABI_STATIC_ASSERT(sizeof(orch_engine_api) == 40 + 8 * 43, "api size 1.5");
ORCH_ABI_STATIC_ASSERT(sizeof(orch_ft_progress) == 48, "ft progress size");
ORCH_ABI_STATIC_ASSERT(sizeof(orch_lora_desc) == 40, "lora desc size");
ORCH_ABI_STATIC_ASSERT(sizeof(orch_finetune_batch) == 40, "finetune batch size");
ORCH_ABI_STATIC_ASSERT(sizeof(orch_model_desc) == 80, "model desc size");
ORCH_ABI_STATIC_ASSERT(offsetof(orch_model_desc, layernorm_eps) == 36, "eps offset");
ORCH_ABI_STATIC_ASSERT(offsetof(orch_model_desc, flags) == 44, "flags offset (1.1)");
ORCH_ABI_STATIC_ASSERT(offsetof(orch_model_desc, rope_original_context) == 64,
                       "rope offset (1.1)");
ORCH_ABI_STATIC_ASSERT(sizeof(orch_engine_options) == 24, "options size");
ORCH_ABI_STATIC_ASSERT(sizeof(orch_tensor_info) == 128, "tensor info size");
ORCH_ABI_STATIC_ASSERT(offsetof(orch_tensor_info, name) == 64, "tensor name offset");
ORCH_ABI_STATIC_ASSERT(sizeof(orch_adamw_params) == 40, "adamw size");
ORCH_ABI_STATIC_ASSERT(sizeof(orch_seq_input) == 40, "seq input size");
ORCH_ABI_STATIC_ASSERT(sizeof(orch_infer_batch) == 24, "batch size");
#endif

#ifdef __cplusplus
}
#endif
#endif /* ORCH_ENGINE_H */
