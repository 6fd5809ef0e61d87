/*
 * safetensors.h - reader and writer of the safetensors file format (the
 * Hugging Face weight format), used for checkpoints and GPT-2 import.
 *
 * Layout: 8-byte little-endian header length N, then N bytes of UTF-8 JSON
 *   {"NAME": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
 *    "__metadata__": {"key": "string value", ...}}
 * padded with spaces so the data starts 8-byte aligned, then the data buffer.
 * Offsets are relative to the start of the data buffer. Supported dtypes:
 * F32, F16, BF16, I32 (F64, I64, I16, I8, U8, BOOL, ... are read as opaque
 * sized types as well, so foreign files open; see safetensors_dtype).
 *
 * Reader: safetensors_open maps the file read-only (mmap) and validates
 * everything before returning: header length against the file size, JSON
 * syntax, that the header starts with '{', every entry's dtype, shape and
 * data_offsets (end - begin == numel * dtype size, in range, no overlap, no
 * holes: the entries tile the data buffer exactly, as the format requires),
 * no duplicate names, metadata values are strings. Every failure gives one
 * clear line naming the file and the problem.
 *
 * Writer: the header comes first in the file, so a writer is used in two
 * phases: declare every tensor (name, dtype, shape) and metadata, then stream
 * the data of each tensor, in declaration order, in as many chunks as the
 * caller likes (e.g. one tensor at a time through one reusable buffer). The
 * file is written through fsio_atomic_* (a temp file beside PATH) and, on
 * safetensors_writer_finish, fsynced, renamed onto PATH and its directory
 * fsynced. The SHA-256 of every byte written is computed on the way and
 * returned by finish (checkpoint checksums).
 *
 * Memory: a safetensors_file owns its mapping and parsed table; pointers it
 * returns (names, tensor data, metadata) are valid until safetensors_close.
 * A writer owns its temp file until finish/abort; both free the writer.
 * Threads: a safetensors_file is immutable after open and may be read from
 * any number of threads; a writer is used by one thread at a time.
 * Errors: functions return 0 / -1 (or NULL) and fill err; they never print.
 * Data is little-endian on disk; this code assumes a little-endian host.
 */
#ifndef ORCH_SAFETENSORS_H
#define ORCH_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

typedef enum safetensors_dtype {
    SAFETENSORS_F32 = 0,
    SAFETENSORS_F16 = 1,
    SAFETENSORS_BF16 = 2,
    SAFETENSORS_I32 = 3,
    /* Read-only (foreign files): accepted by the reader, sized, not converted. */
    SAFETENSORS_F64 = 4,
    SAFETENSORS_I64 = 5,
    SAFETENSORS_I16 = 6,
    SAFETENSORS_I8 = 7,
    SAFETENSORS_U8 = 8,
    SAFETENSORS_BOOL = 9,
    SAFETENSORS_DTYPE_COUNT = 10
} safetensors_dtype;

/* The numeric values of F32/F16/BF16/I32 equal orch_dtype's (engine ABI). */

#define SAFETENSORS_MAX_DIMS 8

/* Bytes of one element of dtype (0 for an unknown value). */
size_t safetensors_dtype_size(int dtype);
/* "F32", "F16", ... ("?" for an unknown value). */
const char *safetensors_dtype_name(int dtype);
/* Parse "F32" etc.; returns the dtype or -1. */
int safetensors_dtype_parse(const char *s);

/* Widen n little-endian elements of an F32, F16 or BF16 tensor at src to
 * float (subnormals, infinities and NaNs kept). Returns 0, or -1 for any
 * other dtype (nothing written). src and dst may not overlap. */
int safetensors_to_f32(int dtype, const void *src, float *dst, uint64_t n);
/* One IEEE half or bfloat16 value as float. */
float safetensors_f16_to_f32(uint16_t h);
float safetensors_bf16_to_f32(uint16_t h);

typedef struct safetensors_tensor {
    const char *name; /* NUL-terminated UTF-8, owned by the file */
    int dtype;        /* safetensors_dtype */
    uint32_t ndim;    /* 0 = scalar */
    uint64_t shape[SAFETENSORS_MAX_DIMS];
    uint64_t numel;   /* product of shape (1 for a scalar) */
    uint64_t nbytes;  /* numel * dtype size */
    const void *data; /* nbytes bytes inside the mapping (may be unaligned
                            for foreign files; memcpy to read) */
} safetensors_tensor;

typedef struct safetensors_file safetensors_file;

/* Map and validate PATH. Returns 0 and *out, or -1 with
 * "PATH: PROBLEM" in err. */
int safetensors_open(const char *path, safetensors_file **out, char *err, size_t err_cap);
/* The same checks over len bytes at buf, a whole file already in memory
 * (tests, fuzzing). name (may be NULL: "<memory>") stands for PATH in errors.
 * The file borrows buf: keep it unchanged until safetensors_close, which does
 * not free it; tensor data points into it. */
int safetensors_open_memory(const void *buf, size_t len, const char *name,
                            safetensors_file **out, char *err, size_t err_cap);
/* Unmap and free. NULL is a no-op. */
void safetensors_close(safetensors_file *f);

/* Number of tensors; tensor i in header order (NULL if out of range). */
size_t safetensors_count(const safetensors_file *f);
const safetensors_tensor *safetensors_get(const safetensors_file *f, size_t i);
/* Tensor named `name`, or NULL. */
const safetensors_tensor *safetensors_find(const safetensors_file *f, const char *name);
/* Value of "__metadata__"[key], or NULL. */
const char *safetensors_metadata(const safetensors_file *f, const char *key);

/* ---- writer ---- */
typedef struct safetensors_writer safetensors_writer;

/* Start a writer for PATH (nothing is created until begin_data). */
int safetensors_writer_create(const char *path, safetensors_writer **out, char *err,
                              size_t err_cap);
/* Add a "__metadata__" string entry (before begin_data). */
int safetensors_writer_add_metadata(safetensors_writer *w, const char *key,
                                    const char *value, char *err, size_t err_cap);
/* Declare the next tensor (before begin_data). Names must be unique and
 * non-empty; "__metadata__" is reserved. */
int safetensors_writer_declare(safetensors_writer *w, const char *name, int dtype,
                               uint32_t ndim, const uint64_t *shape, char *err,
                               size_t err_cap);
/* Create the temp file and write the header. */
int safetensors_writer_begin_data(safetensors_writer *w, char *err, size_t err_cap);
/* Append `bytes` bytes of data. The bytes go to the declared tensors in order;
 * a chunk may span tensors. Writing past the declared total is an error. */
int safetensors_writer_write(safetensors_writer *w, const void *data, size_t bytes,
                             char *err, size_t err_cap);
/* Check every declared byte was written, fsync, close, rename the temp file
 * onto PATH. sha256_out (32 bytes, may be NULL) receives the file's SHA-256.
 * Frees w whether it succeeds or not (on failure the temp file is removed). */
int safetensors_writer_finish(safetensors_writer *w, uint8_t sha256_out[32], char *err,
                              size_t err_cap);
/* Drop everything: remove the temp file, free w. NULL is a no-op. */
void safetensors_writer_abort(safetensors_writer *w);

#endif
