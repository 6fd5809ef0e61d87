/*
 * llama_model.h - an orch LLaMA checkpoint as the model formats see it
 * (shared by the Hugging Face and GGUF import and export): the model's
 * hyperparameters in one struct, read from and written to the config's model
 * section, the parameter table in engine order (orch_engine.h, ABI 1.1:
 * Hugging Face's names and nn.Linear [out, in] layout), the row permutation
 * llama.cpp's RoPE needs in attn_q / attn_k, and the llama3 RoPE frequency
 * factors.
 *
 * Config keys (model section): arch "llama", vocab_size, context, layers,
 * heads, kv_heads, width, mlp_width, layernorm_eps, rope_theta (0 = 10000),
 * tie_embeddings (bool, default false: lm_head.weight is a separate tensor)
 * and rope_scaling {"type": "linear"|"llama3", "factor", "low_freq_factor",
 * "high_freq_factor", "original_context"} (absent or null: none). Writing
 * leaves out rope_scaling when none, and tie_embeddings when asked to (for
 * a config schema without the key). Reading a checkpoint takes an absent
 * tie_embeddings from the config's own engine description
 * (config_model_desc's ORCH_MODEL_FLAG_UNTIED_HEAD), so the head is what the
 * engines load.
 *
 * RoPE layouts: Hugging Face (and orch) rotate element d of a head with
 * d + D/2 ("rotate half"); llama.cpp rotates adjacent pairs (2j, 2j+1). A
 * GGUF file therefore holds the rows of q_proj / k_proj permuted within each
 * head of D rows: GGUF row 2j+s = HF row s*D/2 + j (s in {0, 1}, j < D/2),
 * the reshape(heads, 2, D/2, C).swapaxes(1, 2) of llama.cpp's converter.
 *
 * Memory: no allocation except the cJSON items added to a caller's object.
 * Threads: reentrant. Errors: 0 / -1 with one line in err.
 */
#ifndef ORCH_LLAMA_MODEL_H
#define ORCH_LLAMA_MODEL_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "engine_api/orch_engine.h"

typedef struct llama_model {
    uint32_t vocab, context, layers, heads, kv_heads, width, mlp_width;
    double eps, rope_theta;
    int tied;              /* 1: no lm_head.weight, the head is embed_tokens */
    uint32_t rope_scaling; /* ORCH_ROPE_NONE / _LINEAR / _LLAMA3 */
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    uint32_t rope_original_context;
} llama_model;

#define LLAMA_LAYER_TENSORS 9

/* "linear" / "llama3" / "none" for an ORCH_ROPE_* value. */
const char *llama_rope_name(uint32_t scaling);

/* Sizes in range, heads dividing width, kv_heads dividing heads, an even head
 * size, the rope fields of the scaling type. what prefixes the message. */
int llama_model_check(const llama_model *m, const char *what, char *err, size_t err_cap);

/* Read m from a config's model section (a cJSON object as state.json holds
 * it; defaults as above). what prefixes messages. */
int llama_model_from_json(const cJSON *model, const char *what, llama_model *m, char *err,
                          size_t err_cap);
struct orch_config;
/* Read m from DIR/state.json's config.model; cfg is that config as loaded
 * (its engine description decides a tie the JSON does not state). */
int llama_model_from_ckpt(const char *ckpt_dir, const struct orch_config *cfg,
                          llama_model *m, char *err, size_t err_cap);
/* Add m's keys to the model object (arch first; tie_embeddings unless
 * omit_tie). 0, or -1 out of memory. */
int llama_model_to_json(const llama_model *m, int omit_tie, cJSON *model);

/* The parameter table in engine order: embed_tokens, 9 per layer, norm,
 * lm_head when untied. */
size_t llama_model_tensor_count(const llama_model *m);
/* Tensor i: name (cap >= 64), shape [rows, cols] (cols 0 for a vector) and,
 * for a layer tensor, *layer_k its index 0..8 in the layer (else -1).
 * Returns 0, or -1 for i out of range. */
int llama_model_tensor(const llama_model *m, size_t i, char *name, size_t cap,
                       uint64_t shape[2], int *layer_k);
/* The suffix of layer tensor k ("self_attn.q_proj.weight"), NULL past 8. */
const char *llama_layer_suffix(size_t k);
#define LLAMA_K_Q 1 /* layer_k of q_proj and k_proj */
#define LLAMA_K_K 2

/* dst = the rows of src ([heads*D, cols], D = rows/heads) permuted from the
 * Hugging Face RoPE layout to llama.cpp's (to_gguf) or back. heads: the
 * query heads for q_proj, the kv heads for k_proj. src and dst must not
 * overlap. */
void llama_rope_permute(const float *src, float *dst, uint32_t heads, uint64_t rows,
                        uint64_t cols, int to_gguf);

/* llama.cpp's rope_freqs.weight of a llama3-scaled model: out[i] (i < D/2) =
 * the unscaled inverse frequency over the scaled one (1 for the kept high
 * frequencies, factor for the low ones), as transformers' llama3 rule gives. */
void llama_rope_freq_factors(const llama_model *m, float *out);

#endif
