/*
 * gguf.h - reader and writer of the GGUF file format (version 3, the weight
 * format of llama.cpp / ggml), used by `orch export gguf` and `orch import
 * gguf` (gguf_export.h, gguf_import.h).
 *
 * Layout (all little-endian):
 *   "GGUF" magic, u32 version (3), u64 tensor count, u64 key/value count;
 *   key/value pairs: string key, u32 value type, value (an array is u32
 *   element type, u64 count, the elements; a string is u64 length + bytes,
 *   not NUL-terminated);
 *   tensor infos: string name, u32 n_dims (1..4), n_dims x u64 ne (ne[0] is
 *   the fastest-varying dimension: a row-major [rows, cols] matrix has
 *   ne = {cols, rows}), u32 ggml type, u64 offset (from the start of the
 *   data section, a multiple of the alignment);
 *   padding to general.alignment (u32 key, default 32), then the data.
 * Tensor types: F32, F16, BF16, Q8_0 (blocks of 32 values: one f16 scale d
 * then 32 int8 q, value = d * q) are converted here; the other ggml types are
 * sized (so files holding them open and their tensors can be named) but not
 * converted.
 *
 * Reader: gguf_open maps the file read-only and validates everything before
 * returning: magic, version (2 or 3), that every count, string length and
 * array length fits in the bytes that remain (no allocation is sized by an
 * unchecked number), value types, no nested arrays, no duplicate keys or
 * tensor names, keys and names non-empty without NUL bytes, general.alignment
 * a power of two (when present, a u32), every tensor's n_dims, dims (the
 * element count fits 2^62, ne[0] a multiple of the type's block size), a
 * known type, an aligned offset and data inside the file, no two tensors
 * overlapping. Every failure is one line naming the file and the problem.
 *
 * Writer: key/values and tensor declarations first (kept in memory), then
 * begin_data writes the header and streams each tensor's bytes in declaration
 * order (padding between tensors is inserted by the writer). Written through
 * fsio_atomic_* (temp file beside PATH, fsync, rename) on finish.
 *
 * Memory: a gguf_file owns its mapping and tables; every pointer it returns
 * (keys, strings, tensor data) is valid until gguf_close. A writer copies
 * what it is given; finish/abort free it.
 * Threads: a gguf_file is immutable after open and may be read from any
 * thread; a writer is used by one thread at a time.
 * Errors: 0 / -1 (or NULL) with one line in err; nothing is printed.
 * This code assumes a little-endian host (as the safetensors code does).
 */
#ifndef ORCH_GGUF_H
#define ORCH_GGUF_H

#include <stddef.h>
#include <stdint.h>

#define GGUF_VERSION           3
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS          4

/* Value types of key/value pairs. */
typedef enum gguf_vtype {
    GGUF_U8 = 0,
    GGUF_I8 = 1,
    GGUF_U16 = 2,
    GGUF_I16 = 3,
    GGUF_U32 = 4,
    GGUF_I32 = 5,
    GGUF_F32 = 6,
    GGUF_BOOL = 7,
    GGUF_STRING = 8,
    GGUF_ARRAY = 9,
    GGUF_U64 = 10,
    GGUF_I64 = 11,
    GGUF_F64 = 12,
    GGUF_VTYPE_COUNT = 13
} gguf_vtype;

/* ggml tensor types (the numbers are ggml's). */
typedef enum gguf_ttype {
    GGUF_TYPE_F32 = 0,
    GGUF_TYPE_F16 = 1,
    GGUF_TYPE_Q4_0 = 2,
    GGUF_TYPE_Q8_0 = 8,
    GGUF_TYPE_BF16 = 30
} gguf_ttype;

#define GGUF_Q8_0_BLOCK 32
#define GGUF_Q8_0_BYTES 34 /* f16 scale + 32 int8 */

/* "F32", "Q8_0", ... or NULL for a number ggml does not define. */
const char *gguf_type_name(uint32_t type);
/* Elements per block and bytes per block; 0 / 0 for a type this code cannot
 * size. */
void gguf_type_size(uint32_t type, uint32_t *block, uint32_t *bytes);
/* "u32", "string", "array", ... ("?" for an unknown value). */
const char *gguf_vtype_name(uint32_t vtype);

/* Conversions. n is a multiple of GGUF_Q8_0_BLOCK for Q8_0. */
uint16_t gguf_f32_to_f16(float f); /* round to nearest even, inf/NaN kept */
float gguf_f16_to_f32(uint16_t h);
/* Q8_0 as ggml's reference quantizer: d = max|x| / 127, q = round(x / d). */
void gguf_quantize_q8_0(const float *src, uint8_t *dst, uint64_t n);
/* F32, F16, BF16 or Q8_0 data to float: 0, or -1 for another type. */
int gguf_to_f32(uint32_t type, const void *src, float *dst, uint64_t n);
/* Bytes of n elements of type (n a multiple of the block size); 0 when the
 * type cannot be sized. */
uint64_t gguf_type_nbytes(uint32_t type, uint64_t n);

/* ---- reader ---- */
typedef struct gguf_str {
    const char *p; /* not NUL-terminated; inside the file */
    uint64_t len;
} gguf_str;

typedef struct gguf_kv {
    const char *key;      /* NUL-terminated copy */
    uint32_t type;        /* gguf_vtype */
    uint32_t arr_type;    /* element type when type == GGUF_ARRAY */
    uint64_t n;           /* elements (1 for a scalar) */
    const void *data;     /* scalar or first element (unaligned: memcpy);
                          for strings use strs */
    const gguf_str *strs; /* type STRING (1) or ARRAY of STRING (n); else NULL */
} gguf_kv;

typedef struct gguf_tensor {
    const char *name; /* NUL-terminated copy */
    uint32_t ndim;
    uint64_t ne[GGUF_MAX_DIMS]; /* unused dims are 1 */
    uint32_t type;
    uint64_t numel, nbytes, offset;
    const void *data; /* nbytes bytes inside the file (aligned to the file's
                         alignment relative to the data section) */
} gguf_tensor;

typedef struct gguf_file gguf_file;

int gguf_open(const char *path, gguf_file **out, char *err, size_t err_cap);
/* The same checks over a file already in memory (tests, fuzzing); the file
 * borrows buf until gguf_close. name (NULL: "<memory>") stands for PATH. */
int gguf_open_memory(const void *buf, size_t len, const char *name, gguf_file **out,
                     char *err, size_t err_cap);
void gguf_close(gguf_file *f); /* NULL is a no-op */

uint32_t gguf_version(const gguf_file *f);
uint32_t gguf_alignment(const gguf_file *f);
size_t gguf_kv_count(const gguf_file *f);
const gguf_kv *gguf_kv_get(const gguf_file *f, size_t i);
const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key);
size_t gguf_tensor_count(const gguf_file *f);
const gguf_tensor *gguf_tensor_get(const gguf_file *f, size_t i);
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name);

/* Typed lookups. Return 1 and the value when key is present with a fitting
 * type, 0 when absent, -1 (err: "FILE: KEY: PROBLEM") when of another type or
 * out of range. get_uint accepts any integer type with a value in
 * [0, max]; get_float F32 or F64; get_str a STRING. */
int gguf_get_uint(const gguf_file *f, const char *key, uint64_t max, uint64_t *v,
                  char *err, size_t err_cap);
int gguf_get_float(const gguf_file *f, const char *key, double *v, char *err,
                   size_t err_cap);
int gguf_get_str(const gguf_file *f, const char *key, gguf_str *v, char *err,
                 size_t err_cap);
/* Element i of an integer array as int64 (the caller checks i < n and that
 * arr_type is an integer type). */
int64_t gguf_arr_int(const gguf_kv *kv, uint64_t i);

/* ---- writer ---- */
typedef struct gguf_writer gguf_writer;

/* Start a writer for PATH (nothing is created until begin_data). The
 * general.alignment key is written first, with GGUF_DEFAULT_ALIGNMENT. */
int gguf_writer_create(const char *path, gguf_writer **out, char *err, size_t err_cap);
/* Key/values (before begin_data; keys unique and non-empty). */
int gguf_writer_add_u32(gguf_writer *w, const char *key, uint32_t v, char *err,
                        size_t err_cap);
int gguf_writer_add_f32(gguf_writer *w, const char *key, float v, char *err,
                        size_t err_cap);
int gguf_writer_add_bool(gguf_writer *w, const char *key, int v, char *err,
                         size_t err_cap);
int gguf_writer_add_str(gguf_writer *w, const char *key, const char *v, char *err,
                        size_t err_cap);
/* Array of n strings (lens[i] bytes at strs[i]; lens NULL: NUL-terminated). */
int gguf_writer_add_str_array(gguf_writer *w, const char *key, const char *const *strs,
                              const size_t *lens, uint64_t n, char *err, size_t err_cap);
int gguf_writer_add_i32_array(gguf_writer *w, const char *key, const int32_t *v,
                              uint64_t n, char *err, size_t err_cap);
int gguf_writer_add_f32_array(gguf_writer *w, const char *key, const float *v, uint64_t n,
                              char *err, size_t err_cap);
/* Declare the next tensor: ne[0..ndim) in ggml order, type a sized type with
 * ne[0] a multiple of its block. Names unique and non-empty. */
int gguf_writer_declare(gguf_writer *w, const char *name, uint32_t type, uint32_t ndim,
                        const uint64_t *ne, char *err, size_t err_cap);
/* Create the temp file and write the header, key/values and tensor infos. */
int gguf_writer_begin_data(gguf_writer *w, char *err, size_t err_cap);
/* Append bytes of tensor data (chunks may span tensors). */
int gguf_writer_write(gguf_writer *w, const void *data, size_t bytes, char *err,
                      size_t err_cap);
/* Check every declared byte was written, then fsync and rename onto PATH.
 * Frees w either way (on failure the temp file is removed). */
int gguf_writer_finish(gguf_writer *w, char *err, size_t err_cap);
void gguf_writer_abort(gguf_writer *w); /* NULL is a no-op */

#endif
