/*
 * gpt2_import.h - converting GPT-2 weights in the Hugging Face layout
 * (model.safetensors of GPT2Model / GPT2LMHeadModel) into an orch checkpoint
 * directory that generate, eval and serve load and that `orch train --init
 * DIR` fine-tunes (the library behind `orch import hf` and its old name
 * `orch import-gpt2`).
 *
 * Input: a Hugging Face model directory (config.json plus model.safetensors,
 * else the shards that model.safetensors.index.json's "weight_map" names:
 * plain file names in the directory; every tensor listed must be in the shard
 * it names and every shard tensor listed, no tensor in two shards), or one
 * safetensors file (config.json beside it is read when present).
 *
 * Mapping: names lose an optional "transformer." prefix; Conv1D weights
 * (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj), stored [in, out], are
 * transposed to orch's nn.Linear layout [out, in]; wte, wpe, ln_1, ln_2, ln_f
 * and every bias are copied; the attention-mask buffers attn.bias and
 * attn.masked_bias are skipped; lm_head.weight is skipped (the head is tied to
 * wte). F16 and BF16 are widened to F32 (safetensors_to_f32). Any other
 * tensor is an error. Tensors are written in engine table order
 * (orch_engine.h): wte, wpe, h.0.* ... h.N.*, ln_f.
 *
 * Shape: vocab, context and width from wte/wpe, layers from the h.N names,
 * mlp width from h.0.mlp.c_fc.bias. Heads (not in the shapes): opts->heads,
 * else n_head of the Hugging Face config.json (opts->hf_config, else
 * config.json next to the input when it exists), else width/64 (every
 * released GPT-2 has 64-wide heads). layer_norm_epsilon from that config.json
 * too (default 1e-5). The config.json shape (n_embd, n_layer, n_positions,
 * vocab_size, n_inner: null = 4*n_embd), where given, must match the weights';
 * model_type other than "gpt2", activation_function other than "gelu_new" /
 * "gelu_pytorch_tanh", tie_word_embeddings false, scale_attn_weights false,
 * scale_attn_by_inverse_layer_idx or add_cross_attention true are refused by
 * name (orch's GPT-2 does not implement them).
 *
 * Config: the model section from the weights; train/data/engine from
 * opts->base_config when given (data.tokenizer set to the tokenizer), else
 * micro_batch 4, seq_len min(context, 1024), max_steps 1000, lr 6e-5,
 * data/finetune/{train,val}_*.bin and engine cpu. The tokenizer is
 * opts->tokenizer, else gpt2 for a vocabulary of 50257+ tokens, else byte.
 * state.json: {"format":1,"step":0,"tokenizer":T,"imported_from":INPUT,
 * "config":{...}}; no optimizer state.
 *
 * LLaMA family (ABI 1.1 names, hf_llama.h): when config.json is of the LLaMA
 * family (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM) it gives
 * the whole shape (its rules and refusals: hf_llama.h); the tensors are
 * orch's own names (model.embed_tokens.weight, model.layers.N.self_attn.
 * {q,k,v,o}_proj.weight, mlp.{gate,up,down}_proj.weight, the two norms,
 * model.norm.weight, lm_head.weight when the head is untied), each of the
 * config's shape in the nn.Linear layout orch uses too (copied, F16/BF16
 * widened); rotary_emb.inv_freq buffers are skipped; with a tied head an
 * lm_head.weight is accepted only when it equals the embedding. The model
 * section is llama_model_to_json's. The tokenizer: opts->tokenizer, else
 * "hf" when tokenizer.json is in the config's directory (tokenizer.json,
 * tokenizer_config.json, generation_config.json and special_tokens_map.json
 * are copied into the checkpoint directory, where tokenizer kind "hf" finds
 * them), else the import is refused naming the missing file. With "hf",
 * state.json's "tokenizer" is "hf" (what generate/serve open) and the
 * config's data.tokenizer (the tokenizer of training shards) is "hf" where
 * the config schema knows it, else "byte". opts->heads,
 * when given, must equal num_attention_heads.
 *
 * Memory: everything is released before returning; opts strings are borrowed.
 * Threads: one import per call, no shared state.
 * Errors: -1 with one line in err and *err_kind GPT2_IMPORT_ERR_INPUT (bad
 * options, unreadable or foreign input, inconsistent shapes: exit 2) or
 * GPT2_IMPORT_ERR_RUNTIME (out of memory, the output exists or cannot be
 * written: exit 1). Messages name the input file where it is at fault. A
 * failed import leaves no output directory behind (ckpt_write_dir).
 */
#ifndef ORCH_GPT2_IMPORT_H
#define ORCH_GPT2_IMPORT_H

#include <stddef.h>
#include <stdint.h>

typedef enum gpt2_import_err_kind {
    GPT2_IMPORT_ERR_RUNTIME = 1,
    GPT2_IMPORT_ERR_INPUT = 2
} gpt2_import_err_kind;

typedef struct gpt2_import_opts {
    const char *input;       /* MODEL.safetensors (required) */
    const char *out_dir;     /* checkpoint directory to create; must not exist */
    uint32_t heads;          /* 0: from the HF config, else width/64 */
    const char *hf_config;   /* HF config.json; NULL: next to input if present */
    const char *tokenizer;   /* "gpt2" | "byte" | "hf" | NULL (see above) */
    const char *base_config; /* orch config for train/data/engine, or NULL */
    const char *config_out;  /* also write the resulting config here, or NULL */
} gpt2_import_opts;

typedef struct gpt2_import_result {
    uint32_t layers, heads;
    uint64_t width, mlp_width, vocab, context;
    uint64_t params; /* elements of every tensor written */
    double layernorm_eps;
    char tokenizer[8]; /* "gpt2", "byte" or "hf" */
    char arch[8];      /* "gpt2" or "llama" */
    uint32_t kv_heads;
    int tied; /* llama: 1 when the head is tied to the embedding */
} gpt2_import_result;

int gpt2_import(const gpt2_import_opts *o, gpt2_import_result *r, int *err_kind,
                char *err, size_t err_cap);

/* The Hugging Face names of one GPT-2 layer's tensors, in engine order:
 * suffix k (k < GPT2_HF_LAYER_TENSORS) after "h.N.", and in *conv1d whether
 * it is a Conv1D weight, stored [in, out] by Hugging Face and [out, in] by
 * orch (also used by hf_export.c). NULL for k out of range. */
#define GPT2_HF_LAYER_TENSORS 12
const char *gpt2_hf_layer_tensor(size_t k, int *conv1d);

struct llama_model;
/* The shape of an imported GPT-2 (also used by gguf_import.c); with llama
 * set, the model section is that llama model's (the other shape fields are
 * then unused). */
typedef struct gpt2_import_model {
    uint64_t vocab, context, width, mlp_width;
    uint32_t layers, heads;
    double eps;
    const char *tokenizer; /* "gpt2" | "byte" | "hf" */
    const struct llama_model *llama;
} gpt2_import_model;

/* The state.json and config texts of an imported model (both malloc'd, the
 * caller frees): the config as described above (base_config may be NULL),
 * "imported_from": input. Returns 0, or a gpt2_import_err_kind with err
 * (a bad base config is ERR_INPUT; *state_text and *cfg_text are NULL). */
int gpt2_import_texts(const gpt2_import_model *m, const char *input,
                      const char *base_config, char **state_text, char **cfg_text,
                      char *err, size_t err_cap);

#endif
