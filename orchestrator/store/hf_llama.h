/*
 * hf_llama.h - Hugging Face's LLaMA family config.json <-> orch's llama
 * model (llama_model.h), for `orch import hf` (gpt2_import.c) and `orch
 * export hf` (hf_export.c), and the tokenizer files that travel with a
 * checkpoint whose tokenizer is "hf".
 *
 * A config.json is LLaMA-family when model_type is "llama", "mistral" or
 * "qwen2", or architectures[0] is LlamaForCausalLM, MistralForCausalLM or
 * Qwen2ForCausalLM. Read: hidden_size, intermediate_size,
 * num_hidden_layers, num_attention_heads, vocab_size,
 * max_position_embeddings (all required), num_key_value_heads (default the
 * heads), rms_norm_eps (1e-6, transformers' default), rope_theta (10000),
 * tie_word_embeddings (false), rope_scaling (null; rope_type or type
 * "default", "linear" with factor, "llama3" with factor, low_freq_factor,
 * high_freq_factor, original_max_position_embeddings). Refused, one line
 * naming the field and the value: another architecture, hidden_act other
 * than "silu", attention_bias or mlp_bias true, head_dim other than
 * hidden_size / num_attention_heads, another rope scaling type, a sliding
 * window in use (Mistral's sliding_window not null, Qwen2's
 * use_sliding_window true), a field of the wrong type.
 *
 * Memory: hf_llama_config returns a cJSON document the caller deletes.
 * Threads: reentrant. Errors: as stated per function.
 */
#ifndef ORCH_HF_LLAMA_H
#define ORCH_HF_LLAMA_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "orchestrator/store/llama_model.h"

/* 1 when config j is of the LLaMA family (above), else 0. */
int hf_llama_is_llama(const cJSON *j);

/* Read a LLaMA-family config j (file path for messages) into m. 0, or -1
 * with "PATH: FIELD VALUE ..." in err. */
int hf_llama_read_config(const cJSON *j, const char *path, llama_model *m, char *err,
                         size_t err_cap);

/* The config.json of m for transformers' LlamaForCausalLM (torch_dtype as
 * given; bos/eos ids when >= 0). NULL when out of memory. */
cJSON *hf_llama_config(const llama_model *m, const char *torch_dtype, int bos, int eos);

/* The tokenizer files of an "hf" checkpoint (copied by import into the
 * checkpoint directory, by export into the model directory): NULL-terminated;
 * the first is required. */
extern const char *const hf_llama_tokenizer_files[];

/* Copy the files of hf_llama_tokenizer_files present in src_dir into
 * dst_dir (byte for byte). 0, or -1 with err; *kind 1 when src_dir lacks
 * the required tokenizer.json, 2 on an I/O failure. */
int hf_llama_copy_tokenizer(const char *src_dir, const char *dst_dir, int *kind,
                            char *err, size_t err_cap);

#endif
