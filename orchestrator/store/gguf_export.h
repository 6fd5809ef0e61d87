/*
 * gguf_export.h - an orch checkpoint as a GGUF v3 file that llama.cpp loads
 * (the library behind `orch export gguf`).
 *
 * Input: a run directory (its newest verified checkpoint) or a checkpoint
 * directory; its config (state.json) gives the architecture and shape, its
 * model.safetensors the weights (F32, F16 or BF16). The names, metadata keys
 * and layout come from gguf_model.h (gpt2 and llama).
 *
 * Output keys: general.architecture, general.name ("orch"),
 * general.file_type (0 all F32, 1 mostly F16, 7 mostly Q8_0),
 * general.quantization_version 2 (Q8_0 only), general.alignment 32,
 * ARCH.context_length, .embedding_length, .feed_forward_length, .block_count,
 * .attention.head_count, .attention.layer_norm_epsilon; the tokenizer:
 * tokenizer.ggml.model "gpt2", .pre "gpt-2", .tokens (GPT-2's byte-to-unicode
 * spelling, as in encoder.json), .token_type (1 normal, 3 control for
 * <|endoftext|>, 5 unused for padding rows "[PAD<id>]" when model.vocab_size
 * exceeds the 50257 tokens), .merges (vocab.bpe order), .bos_token_id and
 * .eos_token_id (50256), .add_bos_token false; for a checkpoint whose
 * tokenizer is "hf", the keys gguf_hf_tok.h derives from its tokenizer.json.
 * llama (llama_model.h, gguf_model.h): also .attention.head_count_kv,
 * .rope.dimension_count, .rope.freq_base, .vocab_size, the norm epsilon as
 * .attention.layer_norm_rms_epsilon; linear RoPE scaling as
 * .rope.scaling.type "linear" + .rope.scaling.factor; llama3 scaling as the
 * F32 tensor rope_freqs.weight [D/2] of per-frequency factors (how
 * llama.cpp expresses it; no scaling type, which llama.cpp would apply
 * again) plus orch.rope.scaling.{type, factor, low_freq_factor,
 * high_freq_factor, original_context_length} for orch's own import;
 * attn_q / attn_k rows permuted per head to llama.cpp's RoPE pairs;
 * output.weight only for an untied head.
 * Tensor types: vectors and position_embd stay F32; the other matrices take
 * the chosen type (a Q8_0 matrix whose rows are not a multiple of 32 stays
 * F32). The head is tied: no output.weight.
 *
 * Refused with one line: a byte-tokenizer checkpoint (GGUF has no byte
 * vocabulary), an architecture without a table (model.arch names it),
 * gpt2 with kv_heads != heads, tensors missing, extra or of the wrong shape,
 * an hf tokenizer.json GGUF cannot express (gguf_hf_tok.h).
 *
 * Memory: nothing is kept. Threads: one export per call, no shared state.
 * Errors: -1 with one line in err and *err_kind GPT2_IMPORT_ERR_INPUT (bad
 * options or checkpoint: exit 2) or ..._RUNTIME (out of memory, write
 * failure: exit 1). A failed export leaves no output file (fsio atomic).
 */
#ifndef ORCH_GGUF_EXPORT_H
#define ORCH_GGUF_EXPORT_H

#include <stddef.h>
#include <stdint.h>

typedef struct gguf_export_opts {
    const char *ckpt;      /* run or checkpoint directory (required) */
    const char *out;       /* .gguf file to write (required) */
    const char *type;      /* "f32" (default) | "f16" | "q8_0" */
    const char *vocab_dir; /* GPT-2 vocabulary; NULL: the tokenizer.h search */
} gguf_export_opts;

typedef struct gguf_export_result {
    char ckpt_dir[4096]; /* the checkpoint directory used */
    char warn[1024];     /* ckpt_find_latest's warning, or "" */
    uint32_t layers;
    uint64_t tensors, params, bytes; /* bytes: the file's size */
} gguf_export_result;

int gguf_export(const gguf_export_opts *o, gguf_export_result *r, int *err_kind,
                char *err, size_t err_cap);

#endif
