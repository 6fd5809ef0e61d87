/*
 * hf_tokenizer.h - Hugging Face tokenizers from a model directory:
 * DIR/tokenizer.json (the `tokenizers` library's file), and when present
 * DIR/tokenizer_config.json and DIR/generation_config.json for BOS/EOS.
 * Used by tokenizer.c as the kind "hf"; callers normally go through
 * tokenizer.h.
 *
 * Supported (anything else in the file is refused with one line naming the
 * field and the value):
 *  - model: BPE (vocab, merges as "a b" strings or [a, b] arrays,
 *    byte_fallback, unk_token, fuse_unk, ignore_merges; dropout null,
 *    continuing_subword_prefix / end_of_word_suffix null or "").
 *  - normalizer: null, Sequence, Prepend, Replace (String or Regex pattern),
 *    NFC, NFD, NFKC, NFKD (ICU).
 *  - pre_tokenizer: null, Sequence, Split (Regex or String pattern, behavior
 *    Isolated or Removed, invert false), ByteLevel (add_prefix_space,
 *    use_regex: GPT-2's pattern), Metaspace (replacement, prepend_scheme
 *    always/first/never or add_prefix_space, split), Digits
 *    (individual_digits).
 *  - decoder: ByteLevel, Metaspace, Sequence of Replace (String pattern),
 *    ByteFallback, Fuse, Strip.
 *  - post_processor: null, ByteLevel, TemplateProcessing, Sequence of those
 *    (only used to tell whether a BOS is added).
 *  - added_tokens: matched in the input text before anything else, leftmost
 *    and longest first, as the library's encode does (so "<|im_start|>" in
 *    text becomes its id); lstrip / rstrip (ASCII white space), normalized
 *    (true: matched in the normalized text). single_word true is refused.
 * Encoding is the library's encode with add_special_tokens=false: no BOS or
 * EOS is added; hf_tokenizer_add_bos says whether the caller should.
 * Decoding concatenates the tokens' decoded bytes (added tokens as their
 * text) and then applies the decoder's whole-text steps (Strip after Fuse,
 * Metaspace's first space). Bytes are returned as they are: where the library
 * would put U+FFFD for an invalid byte sequence, this returns the bytes.
 *
 * Encoding memory grows with the longest stretch of text between added
 * tokens, which is normalized and pre-tokenized whole (as the library does):
 * measured on the 4.3 MB KJV, about 7 bytes per input byte with Llama 3's
 * file and 17 with Llama 2's (no pre-tokenizer: the stretch is one BPE word).
 *
 * Thread rules: immutable after hf_tokenizer_open; all other calls may run
 * in any number of threads at once.
 * Memory: the hf_tokenizer owns its tables; buffers handed out through
 * out-parameters are malloc'd and owned by the caller; pointers returned by
 * getters live as long as the tokenizer.
 * Errors: 0 / -1 with a one-line message in err; never prints or exits.
 */
#ifndef ORCH_HF_TOKENIZER_H
#define ORCH_HF_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef struct hf_tokenizer hf_tokenizer;

/* The same contract as tokenizer_sink_fn (tokenizer.h). */
typedef int (*hf_sink_fn)(void *user, const int32_t *ids, size_t n, size_t bytes_done);

enum { HF_MAX_EOS = 8 };

/* Loads DIR/tokenizer.json (+ the two optional config files). */
int hf_tokenizer_open(const char *dir, hf_tokenizer **out, char *err, size_t err_cap);
void hf_tokenizer_free(hf_tokenizer *h); /* NULL is fine */

/* Highest id + 1 over the model's vocab and the added tokens. */
uint32_t hf_tokenizer_vocab_size(const hf_tokenizer *h);

/* Encodes text[0..len): ids go to sink in batches (bytes_done = input bytes
   fully encoded so far; the last call has bytes_done == len, also for
   len 0). The ids pointer is valid only during the call. A non-zero return
   from sink stops with -1. */
int hf_tokenizer_encode(const hf_tokenizer *h, const char *text, size_t len,
                        hf_sink_fn sink, void *user, char *err, size_t err_cap);

/* Decoded bytes of one token (before the whole-text decoder steps); 0, or
   -1 for an id outside the vocabulary or an id no token has. */
int hf_tokenizer_token_bytes(const hf_tokenizer *h, int32_t id, const char **bytes,
                             size_t *len);

/* Decode ids: *text malloc'd, NUL-terminated (not counted in *len). */
int hf_tokenizer_decode(const hf_tokenizer *h, const int32_t *ids, size_t n, char **text,
                        size_t *len, char *err, size_t err_cap);

/* BOS id or -1: tokenizer_config's bos_token, else generation_config's
   bos_token_id, else the post_processor template's leading special token. */
int32_t hf_tokenizer_bos(const hf_tokenizer *h);
/* 1 if a BOS should be prepended: tokenizer_config's add_bos_token when
   given, else whether the post_processor's TemplateProcessing starts with a
   special token. */
int hf_tokenizer_add_bos(const hf_tokenizer *h);
/* EOS ids (tokenizer_config's eos_token first, then generation_config's
   eos_token_id, an int or a list; duplicates dropped, at most HF_MAX_EOS).
   Returns the count; *ids points into h. */
size_t hf_tokenizer_eos(const hf_tokenizer *h, const int32_t **ids);
/* Id of the token spelled name: an added token's content, else a vocab
   entry (as the file spells it for Metaspace vocabularies, the raw bytes for
   ByteLevel ones). -1 if there is none. */
int32_t hf_tokenizer_token_id(const hf_tokenizer *h, const char *name);

#endif
