/*
 * hf_export.h - an orch GPT-2 checkpoint as a Hugging Face model directory
 * that transformers loads as GPT2LMHeadModel (the library behind `orch export
 * hf`).
 *
 * Input: a run directory (its newest verified checkpoint) or a checkpoint
 * directory (ckpt_model_open). Only model.arch "gpt2" (kv_heads == heads).
 *
 * Output directory (must not exist; written as OUT.tmp-PID beside it and
 * renamed into place, so a failed export leaves nothing):
 *   config.json            model_type "gpt2", architectures
 *                          ["GPT2LMHeadModel"], n_embd, n_layer, n_head,
 *                          n_positions = n_ctx, n_inner (null when 4*n_embd),
 *                          vocab_size, layer_norm_epsilon, activation_function
 *                          "gelu_new", dropouts 0, tie_word_embeddings true,
 *                          torch_dtype, bos/eos 50256 (gpt2 tokenizer only)
 *   generation_config.json bos/eos 50256 (gpt2 tokenizer; {} for byte)
 *   model.safetensors      "__metadata__" {"format": "pt"}; HF's names as
 *                          GPT2LMHeadModel.save_pretrained writes them:
 *                          transformer.{wte,wpe}.weight,
 *                          transformer.h.N.{ln_1,attn.c_attn,attn.c_proj,ln_2,
 *                          mlp.c_fc,mlp.c_proj}.{weight,bias},
 *                          transformer.ln_f.{weight,bias}; the Conv1D weights
 *                          transposed to [in, out]; no lm_head.weight (tied)
 *                          and no attn.bias mask buffers
 *   vocab.json, merges.txt GPT-2's encoder.json and vocab.bpe, byte for byte
 *                          (the same formats), from opts->vocab_dir or the
 *                          tokenizer.h search
 *   tokenizer_config.json  tokenizer_class "GPT2Tokenizer", <|endoftext|> as
 *                          bos/eos/unk, model_max_length = context
 *   special_tokens_map.json
 * LLaMA (model.arch "llama"): config.json for LlamaForCausalLM
 * (hf_llama_config: hidden_size, intermediate_size, num_hidden_layers,
 * num_attention_heads, num_key_value_heads, head_dim, rms_norm_eps,
 * rope_theta, rope_scaling, max_position_embeddings, vocab_size,
 * tie_word_embeddings, hidden_act "silu", no biases, torch_dtype),
 * model.safetensors with orch's own names and [out, in] layout (which are
 * Hugging Face's for llama: nothing is renamed or transposed; lm_head.weight
 * only when untied), generation_config.json; the tokenizer: gpt2's files as
 * above, or for an "hf" checkpoint copies of its tokenizer.json,
 * tokenizer_config.json, generation_config.json, special_tokens_map.json.
 * A byte-tokenizer checkpoint exports the weights and the two configs only:
 * Hugging Face has no tokenizer for orch's byte vocabulary, and
 * r->no_tokenizer is set (the command line says so on stderr).
 *
 * Dtypes: opts->type "f32" (default; bit-exact), "f16" or "bf16" (round to
 * nearest even), every tensor alike.
 *
 * Memory: nothing is kept. Threads: one export per call, no shared state.
 * Errors: -1 with one line in err and *err_kind GPT2_IMPORT_ERR_INPUT (bad
 * options or checkpoint, output exists: exit 2) or ..._RUNTIME (out of
 * memory, write failure: exit 1).
 */
#ifndef ORCH_HF_EXPORT_H
#define ORCH_HF_EXPORT_H

#include <stddef.h>
#include <stdint.h>

typedef struct hf_export_opts {
    const char *ckpt;      /* run or checkpoint directory (required) */
    const char *out;       /* directory to create (required, must not exist) */
    const char *type;      /* "f32" (default) | "f16" | "bf16" */
    const char *vocab_dir; /* GPT-2 vocabulary; NULL: the tokenizer.h search */
} hf_export_opts;

typedef struct hf_export_result {
    char ckpt_dir[4096]; /* the checkpoint directory used */
    char warn[1024];     /* ckpt_find_latest's warning, or "" */
    uint32_t layers;
    uint64_t tensors, params;
    int no_tokenizer; /* 1: byte tokenizer, no tokenizer files written */
    int llama;        /* 1: written as LlamaForCausalLM */
} hf_export_result;

int hf_export(const hf_export_opts *o, hf_export_result *r, int *err_kind, char *err,
              size_t err_cap);

#endif
