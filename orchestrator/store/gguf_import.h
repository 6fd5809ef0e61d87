/*
 * gguf_import.h - a GGUF file written for llama.cpp (by `orch export gguf`,
 * convert_hf_to_gguf.py or llama-quantize) as an orch checkpoint directory
 * that generate, eval and serve load and `orch train --init DIR` fine-tunes
 * (the library behind `orch import gguf`).
 *
 * llama: general.architecture "llama" also reads .attention.head_count_kv
 * (dividing the heads), .rope.freq_base (default 10000),
 * .rope.dimension_count (must be the head size), .rope.scaling.type
 * (none, or linear with .rope.scaling.factor; others refused by name), and
 * llama3 scaling as orch writes it: orch.rope.scaling.{type "llama3", factor,
 * low_freq_factor, high_freq_factor, original_context_length} with a
 * rope_freqs.weight that must equal those parameters' factors (a
 * rope_freqs.weight without them is refused: the parameters cannot be
 * recovered). attn_q / attn_k rows are permuted back from llama.cpp's RoPE
 * layout (llama_model.h); output.weight present = an untied head. A llama
 * file whose tokenizer is not GPT-2's (tokenizer.ggml.model gpt2 with pre
 * gpt-2 and <|endoftext|> at 50256) becomes an "hf" checkpoint: the
 * tokenizer.json and tokenizer_config.json gguf_hf_tok.h makes from its
 * keys are written into the checkpoint directory.
 *
 * Accepted: general.architecture with a table in gguf_model.h (gpt2); the
 * hyperparameters ARCH.block_count, .context_length, .embedding_length,
 * .feed_forward_length, .attention.head_count (required; head_count_kv, if
 * present, must equal it) and the norm epsilon (default 1e-5); the GPT-2
 * tokenizer (tokenizer.ggml.model "gpt2" whose first 50257 tokens and merges
 * are exactly orch's GPT-2 vocabulary, any rows past them padding); tensors
 * of type F32, F16, BF16 or Q8_0 (dequantized to F32), named and shaped as
 * the table says; output.weight only as a copy of token_embd.weight (orch
 * ties the head).
 * Refused, one line each: a malformed file (gguf.h), an unsupported
 * architecture or tensor type (named), a missing key or tensor, a tensor of
 * the wrong shape, an unexpected tensor, another vocabulary, an untied head.
 *
 * The config and state.json are made as by gpt2_import (gpt2_import_texts),
 * with the tokenizer gpt2.
 *
 * Memory: nothing is kept. Threads: one import per call.
 * Errors: -1 with one line in err and *err_kind GPT2_IMPORT_ERR_INPUT (the
 * input is at fault: exit 2) or ..._RUNTIME (memory, writing: exit 1). A
 * failed import leaves no output directory (ckpt_write_dir).
 */
#ifndef ORCH_GGUF_IMPORT_H
#define ORCH_GGUF_IMPORT_H

#include <stddef.h>
#include <stdint.h>

typedef struct gguf_import_opts {
    const char *input;       /* FILE.gguf (required) */
    const char *out_dir;     /* checkpoint directory to create (must not exist) */
    const char *vocab_dir;   /* GPT-2 vocabulary; NULL: the tokenizer.h search */
    const char *base_config; /* orch config for train/data/engine, or NULL */
} gguf_import_opts;

typedef struct gguf_import_result {
    char arch[32];
    uint32_t layers, heads, kv_heads;
    int tied; /* llama: no output.weight */
    uint64_t width, mlp_width, vocab, context, params;
    uint64_t n_f32, n_f16, n_bf16, n_q8_0; /* tensors of each type read */
    char tokenizer[8];                     /* "gpt2" or "hf" */
} gguf_import_result;

int gguf_import(const gguf_import_opts *o, gguf_import_result *r, int *err_kind,
                char *err, size_t err_cap);

#endif
