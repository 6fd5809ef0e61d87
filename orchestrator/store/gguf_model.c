/*
 * gguf_model.c - the per-architecture tables of orch <-> GGUF names, keys and
 * shapes (see gguf_model.h).
 */
#include "orchestrator/store/gguf_model.h"

#include <stdio.h>
#include <string.h>

static const gguf_tensor_map gpt2_pre[] = {
    { "wte.weight", "token_embd.weight", { GGUF_DIM_VOCAB, GGUF_DIM_WIDTH }, 0, 0, 0 },
    { "wpe.weight",
      "position_embd.weight",
      { GGUF_DIM_CONTEXT, GGUF_DIM_WIDTH },
      1,
      0,
      0 },
};

static const gguf_tensor_map gpt2_layer[] = {
    { "h.%u.ln_1.weight", "blk.%u.attn_norm.weight", { GGUF_DIM_WIDTH }, 1, 0, 0 },
    { "h.%u.ln_1.bias", "blk.%u.attn_norm.bias", { GGUF_DIM_WIDTH }, 1, 0, 0 },
    { "h.%u.attn.c_attn.weight",
      "blk.%u.attn_qkv.weight",
      { GGUF_DIM_QKV, GGUF_DIM_WIDTH },
      0,
      0,
      0 },
    { "h.%u.attn.c_attn.bias", "blk.%u.attn_qkv.bias", { GGUF_DIM_QKV }, 1, 0, 0 },
    { "h.%u.attn.c_proj.weight",
      "blk.%u.attn_output.weight",
      { GGUF_DIM_WIDTH, GGUF_DIM_WIDTH },
      0,
      0,
      0 },
    { "h.%u.attn.c_proj.bias", "blk.%u.attn_output.bias", { GGUF_DIM_WIDTH }, 1, 0, 0 },
    { "h.%u.ln_2.weight", "blk.%u.ffn_norm.weight", { GGUF_DIM_WIDTH }, 1, 0, 0 },
    { "h.%u.ln_2.bias", "blk.%u.ffn_norm.bias", { GGUF_DIM_WIDTH }, 1, 0, 0 },
    { "h.%u.mlp.c_fc.weight",
      "blk.%u.ffn_up.weight",
      { GGUF_DIM_MLP, GGUF_DIM_WIDTH },
      0,
      0,
      0 },
    { "h.%u.mlp.c_fc.bias", "blk.%u.ffn_up.bias", { GGUF_DIM_MLP }, 1, 0, 0 },
    { "h.%u.mlp.c_proj.weight",
      "blk.%u.ffn_down.weight",
      { GGUF_DIM_WIDTH, GGUF_DIM_MLP },
      0,
      0,
      0 },
    { "h.%u.mlp.c_proj.bias", "blk.%u.ffn_down.bias", { GGUF_DIM_WIDTH }, 1, 0, 0 },
};

static const gguf_tensor_map gpt2_post[] = {
    { "ln_f.weight", "output_norm.weight", { GGUF_DIM_WIDTH }, 1, 0, 0 },
    { "ln_f.bias", "output_norm.bias", { GGUF_DIM_WIDTH }, 1, 0, 0 },
};

static const gguf_tensor_map llama_pre[] = {
    { "model.embed_tokens.weight",
      "token_embd.weight",
      { GGUF_DIM_VOCAB, GGUF_DIM_WIDTH },
      0,
      0,
      0 },
};

#define LW(o, g, d0, d1, f32, rope) \
    { "model.layers.%u." o, "blk.%u." g, { d0, d1 }, f32, rope, 0 }
static const gguf_tensor_map llama_layer[] = {
    LW("input_layernorm.weight", "attn_norm.weight", GGUF_DIM_WIDTH, GGUF_DIM_NONE, 1, 0),
    LW("self_attn.q_proj.weight", "attn_q.weight", GGUF_DIM_WIDTH, GGUF_DIM_WIDTH, 0,
       GGUF_ROPE_Q),
    LW("self_attn.k_proj.weight", "attn_k.weight", GGUF_DIM_KV, GGUF_DIM_WIDTH, 0,
       GGUF_ROPE_K),
    LW("self_attn.v_proj.weight", "attn_v.weight", GGUF_DIM_KV, GGUF_DIM_WIDTH, 0, 0),
    LW("self_attn.o_proj.weight", "attn_output.weight", GGUF_DIM_WIDTH, GGUF_DIM_WIDTH, 0,
       0),
    LW("post_attention_layernorm.weight", "ffn_norm.weight", GGUF_DIM_WIDTH,
       GGUF_DIM_NONE, 1, 0),
    LW("mlp.gate_proj.weight", "ffn_gate.weight", GGUF_DIM_MLP, GGUF_DIM_WIDTH, 0, 0),
    LW("mlp.up_proj.weight", "ffn_up.weight", GGUF_DIM_MLP, GGUF_DIM_WIDTH, 0, 0),
    LW("mlp.down_proj.weight", "ffn_down.weight", GGUF_DIM_WIDTH, GGUF_DIM_MLP, 0, 0),
};
#undef LW

static const gguf_tensor_map llama_post[] = {
    { "model.norm.weight", "output_norm.weight", { GGUF_DIM_WIDTH }, 1, 0, 0 },
    { "lm_head.weight", "output.weight", { GGUF_DIM_VOCAB, GGUF_DIM_WIDTH }, 0, 0, 1 },
};

#define N(a) (sizeof a / sizeof a[0])

static const gguf_arch arches[] = {
    { "gpt2", "gpt2", "attention.layer_norm_epsilon", gpt2_pre, gpt2_layer, gpt2_post,
      N(gpt2_pre), N(gpt2_layer), N(gpt2_post) },
    { "llama", "llama", "attention.layer_norm_rms_epsilon", llama_pre, llama_layer,
      llama_post, N(llama_pre), N(llama_layer), N(llama_post) },
};

const gguf_arch *gguf_arch_by_orch(const char *name) {
    for (size_t i = 0; i < N(arches); i++)
        if (strcmp(arches[i].orch_name, name) == 0) return &arches[i];
    return NULL;
}

const gguf_arch *gguf_arch_by_gguf(const char *name) {
    for (size_t i = 0; i < N(arches); i++)
        if (strcmp(arches[i].gguf_name, name) == 0) return &arches[i];
    return NULL;
}

const char *gguf_arch_list(void) { return "gpt2, llama"; }

size_t gguf_arch_tensor_count(const gguf_arch *a, uint32_t layers, int untied) {
    size_t n = a->n_pre + (size_t)layers * a->n_layer + a->n_post;
    if (!untied)
        for (size_t k = 0; k < a->n_post; k++) n -= a->post[k].untied_only ? 1 : 0;
    return n;
}

const gguf_tensor_map *gguf_arch_tensor(const gguf_arch *a, uint32_t layers, int untied,
                                        size_t i, char *orch_name, char *gguf_name,
                                        size_t cap) {
    const gguf_tensor_map *m;
    if (i >= gguf_arch_tensor_count(a, layers, untied)) return NULL;
    unsigned layer = 0;
    if (i < a->n_pre) {
        m = &a->pre[i];
    } else if (i - a->n_pre < (size_t)layers * a->n_layer) {
        size_t k = i - a->n_pre;
        layer = (unsigned)(k / a->n_layer);
        m = &a->layer[k % a->n_layer];
    } else if (i - a->n_pre - (size_t)layers * a->n_layer < a->n_post) {
        m = &a->post[i - a->n_pre - (size_t)layers * a->n_layer];
    } else {
        return NULL;
    }
    /* The formats are literals of the tables above: one %u at most. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
    snprintf(orch_name, cap, m->orch, layer);
    snprintf(gguf_name, cap, m->gguf, layer);
#pragma GCC diagnostic pop
    return m;
}

uint64_t gguf_dim_size(const config_model *m, gguf_dim d) {
    switch (d) {
    case GGUF_DIM_VOCAB: return m->vocab_size;
    case GGUF_DIM_CONTEXT: return m->context;
    case GGUF_DIM_WIDTH: return m->width;
    case GGUF_DIM_QKV: return 3 * (uint64_t)m->width;
    case GGUF_DIM_MLP: return m->mlp_width;
    case GGUF_DIM_KV: return m->heads ? (uint64_t)m->kv_heads * (m->width / m->heads) : 0;
    default: return 0;
    }
}
