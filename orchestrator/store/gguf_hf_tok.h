/*
 * gguf_hf_tok.h - llama.cpp's tokenizer metadata (tokenizer.ggml.*) derived
 * from a Hugging Face tokenizer.json, for `orch export gguf` of a checkpoint
 * whose tokenizer is "hf" (tokenizer.json in the checkpoint directory).
 *
 * Two BPE forms map onto GGUF exactly:
 *   ByteLevel (GPT-2, Llama 3, Qwen 2/3, SmolLM): tokenizer.ggml.model
 *     "gpt2", .pre from the pre-tokenizer: plain ByteLevel (use_regex) "gpt-2",
 *     Split with Llama 3's pattern then ByteLevel "llama-bpe", Split with
 *     Qwen 2's pattern then ByteLevel "qwen2"; .tokens as spelled in the vocab
 *     (already the byte-to-unicode spelling), .merges "a b" in rank order.
 *   Metaspace + byte_fallback (Llama 2, Mistral, TinyLlama): .model "llama"
 *     (SentencePiece-style), .tokens with their "\u2581", .scores from the
 *     merge ranks (the token a merge of rank r makes scores -r, so llama.cpp's
 *     highest-score-first merging follows the BPE ranks; other tokens 0 when
 *     one character or a byte, else -1e9), .add_space_prefix from the
 *     Prepend normalizer / Metaspace prepend_scheme.
 * Both: .token_type (1 normal, 2 unknown, 3 control = special added tokens,
 * 4 user-defined = other added tokens, 5 unused = vocabulary rows past the
 * tokenizer, 6 byte = "<0xXX>" in the llama form), .bos_token_id /
 * .eos_token_id / .unknown_token_id where known (tokenizer_config.json's
 * bos_token / eos_token, else generation_config.json's ids),
 * .add_bos_token (tokenizer_config.json's add_bos_token, else whether the
 * post-processor's template starts with a special token),
 * tokenizer.chat_template when tokenizer_config.json has one.
 * Anything else (another model type, a pre-tokenizer without a llama.cpp
 * name, more tokens than the model's vocabulary) is refused with one line
 * naming the field.
 *
 * Memory: nothing is kept. Threads: reentrant.
 * Errors: -1 with one line in err and *kind 2 (the tokenizer files are at
 * fault) or 1 (out of memory, writer failure).
 */
#ifndef ORCH_GGUF_HF_TOK_H
#define ORCH_GGUF_HF_TOK_H

#include <stddef.h>
#include <stdint.h>

#include "orchestrator/store/gguf.h"

int gguf_hf_tok_add(gguf_writer *w, const char *dir, uint32_t vocab_size, int *kind,
                    char *err, size_t err_cap);

/* The reverse, for `orch import gguf` of a llama file whose tokenizer is not
 * GPT-2's: tokenizer.json and tokenizer_config.json texts (malloc'd, the
 * caller frees) from the file's tokenizer.ggml.* keys, for the two forms
 * above: "gpt2" with .pre gpt-2 / llama-bpe / qwen2 (vocab = the normal
 * tokens, added_tokens = control (special) and user-defined ones, merges in
 * order, the pre-tokenizer and ByteLevel decoder of that name), or "llama"
 * with .scores (Llama 2's normalizer, byte_fallback, merges made from the
 * scores as transformers' SentencePiece converter does: every split of a
 * token into two tokens, ordered by the token's score, highest first;
 * tokens scored at or below -1e8 make none). tokenizer_config.json holds
 * bos_token / eos_token / unk_token (by content), add_bos_token and
 * chat_template. Unused rows (type 5) are left out. Another model or pre
 * name is refused naming the key and its value.
 * Errors: -1 with one line in err and *kind 2 (the file's keys) or 1 (out of
 * memory). */
int gguf_hf_tok_files(const gguf_file *f, const char *path, char **tokenizer_json,
                      char **tokenizer_config, int *kind, char *err, size_t err_cap);

#endif
