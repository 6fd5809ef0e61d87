/*
 * gguf_model.h - how an orch model maps onto llama.cpp's GGUF conventions,
 * per architecture: the general.architecture name, the metadata keys of the
 * hyperparameters, and the tensor name table (orch name, GGUF name, the
 * orch shape in symbolic dimensions). Shared by gguf_export.c and
 * gguf_import.c; adding an architecture (llama) is one more table here.
 *
 * Tensor layout: orch stores a linear layer as [out, in] row-major (the
 * nn.Linear layout) and ggml names dimensions fastest first, so a tensor of
 * orch shape [a, b] is the GGUF tensor ne = {b, a} with the same bytes, and
 * a vector [a] is ne = {a}. No tensor is transposed.
 *
 * gpt2 (llama.cpp's LLM_ARCH_GPT2, as convert_hf_to_gguf.py writes it):
 *   wte.weight token_embd.weight, wpe.weight position_embd.weight,
 *   h.N.ln_1.{weight,bias} blk.N.attn_norm.*, h.N.attn.c_attn.* blk.N.attn_qkv.*,
 *   h.N.attn.c_proj.* blk.N.attn_output.*, h.N.ln_2.* blk.N.ffn_norm.*,
 *   h.N.mlp.c_fc.* blk.N.ffn_up.*, h.N.mlp.c_proj.* blk.N.ffn_down.*,
 *   ln_f.* output_norm.*. The head is tied to token_embd (llama.cpp uses
 *   token_embd when output.weight is absent).
 *
 * llama (LLM_ARCH_LLAMA): model.embed_tokens.weight token_embd.weight,
 *   model.layers.N.input_layernorm blk.N.attn_norm, self_attn.{q,k,v,o}_proj
 *   blk.N.attn_{q,k,v,output}, post_attention_layernorm blk.N.ffn_norm,
 *   mlp.{gate,up,down}_proj blk.N.ffn_{gate,up,down} (all .weight),
 *   model.norm.weight output_norm.weight, lm_head.weight output.weight (only
 *   when the head is untied). attn_q / attn_k rows are permuted per head to
 *   llama.cpp's RoPE layout (llama_model.h: rope GGUF_ROPE_Q / _K).
 *
 * Memory: everything here is static and read-only.
 * Threads: any. Errors: lookups return NULL.
 */
#ifndef ORCH_GGUF_MODEL_H
#define ORCH_GGUF_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "orchestrator/core/config.h"

/* Symbolic sizes of a tensor's orch dimensions. */
typedef enum gguf_dim {
    GGUF_DIM_NONE = 0,
    GGUF_DIM_VOCAB,   /* model.vocab_size */
    GGUF_DIM_CONTEXT, /* model.context */
    GGUF_DIM_WIDTH,   /* model.width */
    GGUF_DIM_QKV,     /* 3 * model.width */
    GGUF_DIM_MLP,     /* model.mlp_width */
    GGUF_DIM_KV       /* model.kv_heads * width / heads */
} gguf_dim;

/* Row permutation between orch's and llama.cpp's RoPE layout. */
enum { GGUF_ROPE_NONE = 0, GGUF_ROPE_Q = 1, GGUF_ROPE_K = 2 };

typedef struct gguf_tensor_map {
    const char *orch; /* printf format with %u for the layer when per-layer */
    const char *gguf; /* likewise */
    gguf_dim dim[2];  /* orch shape [dim[0]] or [dim[0], dim[1]] */
    int keep_f32;     /* stays F32 in every file type (llama.cpp's choice) */
    int rope;         /* GGUF_ROPE_*: rows permuted per (q or kv) head */
    int untied_only;  /* present only with an untied head (last of post) */
} gguf_tensor_map;

typedef struct gguf_arch {
    const char *orch_name;                     /* model.arch */
    const char *gguf_name;                     /* general.architecture */
    const char *eps_key;                       /* after "ARCH.": the norm epsilon key */
    const gguf_tensor_map *pre, *layer, *post; /* engine table order */
    size_t n_pre, n_layer, n_post;
} gguf_arch;

/* By orch model.arch / by general.architecture; NULL when not supported. */
const gguf_arch *gguf_arch_by_orch(const char *name);
const gguf_arch *gguf_arch_by_gguf(const char *name);
/* Comma-separated GGUF names of the supported architectures ("gpt2, llama"). */
const char *gguf_arch_list(void);

/* Tensor i of the full table (pre, layers x layer, post; the untied_only
 * entries only when untied) for a model of `layers` layers: its map entry
 * and the expanded names (caps >= 64). Returns the entry, or NULL past the
 * end. */
const gguf_tensor_map *gguf_arch_tensor(const gguf_arch *a, uint32_t layers, int untied,
                                        size_t i, char *orch_name, char *gguf_name,
                                        size_t cap);
/* Number of tensors of a model with `layers` layers. */
size_t gguf_arch_tensor_count(const gguf_arch *a, uint32_t layers, int untied);
/* The size of a symbolic dimension for model m (0 for GGUF_DIM_NONE). */
uint64_t gguf_dim_size(const config_model *m, gguf_dim d);

#endif
