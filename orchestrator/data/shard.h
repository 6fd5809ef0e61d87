/*
 * shard.h - versioned token shard files, a read-only dataset over a set of
 * shards (mmap), and corpus preparation (text file -> train/val shards).
 *
 * Shard file format, version 1 (all integers little-endian):
 *   offset size
 *        0    8  magic "ORCHTOK\0"
 *        8    4  format version (1)
 *       12    4  header size in bytes (64)
 *       16    4  token width in bytes: 2 when vocab_size <= 65536, else 4
 *       20    4  vocab size
 *       24   16  tokenizer name, NUL-padded ("byte", "gpt2", ...)
 *       40    8  token count N
 *       48    8  checksum of the payload (64-bit, see shard.c)
 *       56    8  checksum of bytes 0..55 of the header
 *       64  N*w  tokens (unsigned, width w)
 * The file size must be exactly 64 + N*w.
 *
 * Thread rules: shard_write_file and shard_prepare_corpus may run
 * concurrently on different paths. A dataset is immutable after
 * dataset_open; dataset_read and the getters may be called from any number
 * of threads at once. dataset_close must not race with reads.
 * Errors: functions return 0 / -1 and fill err with a one-line message that
 * names the file and gives a hint; they never print or exit.
 */
#ifndef ORCH_SHARD_H
#define ORCH_SHARD_H

#include <stddef.h>
#include <stdint.h>

#define SHARD_MAGIC              "ORCHTOK" /* 8 bytes with the NUL */
#define SHARD_VERSION            1u
#define SHARD_HEADER_SIZE        64u
#define SHARD_TOKENIZER_NAME_MAX 15 /* longest tokenizer name stored */

/* Write n token ids to path atomically (fsio_atomic_*: a temp file beside
   it, fsync, rename, fsync of the parent directory). Every id must lie in
   [0, vocab_size). Token width is chosen from vocab_size. Returns 0 / -1. */
int shard_write_file(const char *path, const char *tokenizer_name, uint32_t vocab_size,
                     const int32_t *ids, uint64_t n, char *err, size_t err_cap);

/* Header of one shard as read and validated from disk. */
/* The 64-bit checksum of n bytes used for the payload (header bytes 48..55)
 * and for header bytes 0..55 (bytes 56..63). Pure function, thread-safe. */
uint64_t shard_checksum(const unsigned char *p, size_t n);

typedef struct shard_info {
    uint32_t version;
    uint32_t token_width;
    uint32_t vocab_size;
    char tokenizer[SHARD_TOKENIZER_NAME_MAX + 1];
    uint64_t n_tokens;
    uint64_t payload_checksum;
} shard_info;

/* Read and validate one shard file's header and size (and, when
   verify_payload, its payload checksum). Returns 0 / -1. */
int shard_read_info(const char *path, int verify_payload, shard_info *info, char *err,
                    size_t err_cap);

/* --- dataset: all shards matching a glob, read as one token sequence ---- */

typedef struct dataset dataset;

/* Flags for dataset_open_flags. */
#define DATASET_VERIFY_CHECKSUM 1u /* check every payload checksum at open */

/* Open every file matching glob_pattern (glob(3), sorted by name), mmap each
   and validate header, version, token width, size and payload checksum.
   Refuses: no match ("PATTERN: no such file or directory (...)" when the
   pattern's directory, or a plain path, does not exist; "no token shards
   match PATTERN" when the directory exists), corrupt/truncated/foreign files, unknown versions,
   shards with different tokenizers or vocab sizes, an empty total. The
   pattern may also be a single plain path. *out is owned by the caller
   (dataset_close). Same as dataset_open_flags(..., DATASET_VERIFY_CHECKSUM). */
int dataset_open(const char *glob_pattern, dataset **out, char *err, size_t err_cap);
/* As dataset_open; flags 0 skips the payload checksum (headers and sizes
   are always checked), for very large datasets. */
int dataset_open_flags(const char *glob_pattern, unsigned flags, dataset **out, char *err,
                       size_t err_cap);
void dataset_close(dataset *ds); /* NULL is fine */

uint64_t dataset_total_tokens(const dataset *ds);
uint32_t dataset_vocab_size(const dataset *ds);
const char *dataset_tokenizer_name(const dataset *ds); /* valid while ds lives */
size_t dataset_shard_count(const dataset *ds);
/* Path of shard i (i < dataset_shard_count), valid while ds lives. */
const char *dataset_shard_path(const dataset *ds, size_t i);

/* Copy tokens [global_offset, global_offset + n) into dst as int32, across
   shard boundaries. Returns 0, or -1 (dst untouched) if the range does not
   lie inside [0, dataset_total_tokens). Thread-safe. */
int dataset_read(const dataset *ds, uint64_t global_offset, uint64_t n, int32_t *dst);

/* --- corpus preparation ------------------------------------------------- */

/* Progress callback: bytes of input tokenized so far out of total. Called
   from the calling thread, at most every ~64 KiB of input and once at the
   end (done == total). */
typedef void (*shard_progress_fn)(void *user, uint64_t done_bytes, uint64_t total_bytes);

typedef struct shard_prepare_opts {
    const char *tokenizer;       /* "byte" | "gpt2" (required unless tok) */
    const char *vocab_dir;       /* GPT-2 vocabulary dir, NULL = default search */
    const struct tokenizer *tok; /* optional: an open tokenizer to use instead
                                    of opening `tokenizer` (not freed) */
    const char *input;           /* text file (required) */
    const char *out_dir;         /* created if missing (required) */
    double val_fraction;         /* in [0, 0.5]; 0 = no validation shard.
                                Callers wanting the default use 0.01. */
    uint64_t shard_tokens;       /* max tokens per shard; 0 = 100,000,000 */
    shard_progress_fn progress;  /* may be NULL */
    void *progress_user;
} shard_prepare_opts;

typedef struct shard_prepare_result {
    uint64_t input_bytes;
    uint64_t train_bytes, val_bytes; /* split of the input */
    uint64_t train_tokens, val_tokens;
    uint32_t train_shards, val_shards;
    uint32_t vocab_size;
    double seconds; /* wall time of the whole preparation */
} shard_prepare_result;

/* Tokenize opts->input and write out_dir/train_000.bin, train_001.bin, ...
   and out_dir/val_000.bin .... The validation part is the last val_fraction
   of the input bytes, moved forward to the next line boundary (start of a
   line), so no line is split; with val_fraction > 0 and a corpus of at least
   two lines, both parts are non-empty. Each part is tokenized separately.
   Shards are written atomically; stale train_NNN.bin / val_NNN.bin files
   from an earlier run with more shards are removed. Returns 0 / -1. */
int shard_prepare_corpus(const shard_prepare_opts *opts, shard_prepare_result *result,
                         char *err, size_t err_cap);

#endif
