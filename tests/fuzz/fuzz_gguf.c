/*
 * fuzz_gguf.c - libFuzzer harness of the GGUF reader (store/gguf.h): the
 * input is a whole file, opened from memory (gguf_open_memory) and, as a
 * file in a scratch directory, through the mmap path (gguf_open); both must
 * agree.
 *
 * Checked besides the sanitizers: an opened file keeps the promises of
 * gguf.h (keys and tensor names non-empty, unique and found by the lookups;
 * numel the product of ne; nbytes what the type's blocks take; data inside
 * the input, aligned, no two tensors overlapping); every string and array
 * element is read, every tensor's bytes are read (F32/F16/BF16/Q8_0 through
 * gguf_to_f32) so ASan sees any pointer outside the input; the typed getters
 * never fail without a message; a refusal names the file.
 *
 * Memory: everything is freed per input (leaks are findings).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/store/gguf.h"
#include "tests/fuzz/fuzz_util.h"

#define NAME "fuzz.gguf"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_kvs(const gguf_file *f) {
    volatile uint8_t sum = 0;
    for (size_t i = 0; i < gguf_kv_count(f); i++) {
        const gguf_kv *kv = gguf_kv_get(f, i);
        FUZZ_CHECK(kv && kv->key && kv->key[0], "kv %zu has no key", i);
        FUZZ_CHECK(gguf_find_kv(f, kv->key) == kv, "find('%s') is another kv", kv->key);
        if (kv->type == GGUF_STRING ||
            (kv->type == GGUF_ARRAY && kv->arr_type == GGUF_STRING)) {
            for (uint64_t k = 0; k < kv->n; k++)
                for (uint64_t c = 0; c < kv->strs[k].len; c++)
                    sum ^= (uint8_t)kv->strs[k].p[c];
        } else if (kv->type == GGUF_ARRAY && kv->arr_type != GGUF_F32 &&
                   kv->arr_type != GGUF_F64 && kv->arr_type != GGUF_BOOL) {
            for (uint64_t k = 0; k < kv->n; k++) sum ^= (uint8_t)gguf_arr_int(kv, k);
        }
        char err[512] = "";
        uint64_t u;
        double d;
        gguf_str s;
        if (gguf_get_uint(f, kv->key, UINT32_MAX, &u, err, sizeof err) < 0)
            FUZZ_CHECK(err[0], "get_uint failed without a message");
        err[0] = 0;
        if (gguf_get_float(f, kv->key, &d, err, sizeof err) < 0)
            FUZZ_CHECK(err[0], "get_float failed without a message");
        err[0] = 0;
        if (gguf_get_str(f, kv->key, &s, err, sizeof err) < 0)
            FUZZ_CHECK(err[0], "get_str failed without a message");
    }
    (void)sum;
}

static void check_tensors(const gguf_file *f, const uint8_t *lo, const uint8_t *hi) {
    for (size_t i = 0; i < gguf_tensor_count(f); i++) {
        const gguf_tensor *t = gguf_tensor_get(f, i);
        FUZZ_CHECK(t && t->name && t->name[0], "tensor %zu has no name", i);
        FUZZ_CHECK(gguf_find_tensor(f, t->name) == t, "find('%s') is another tensor",
                   t->name);
        FUZZ_CHECK(t->ndim >= 1 && t->ndim <= GGUF_MAX_DIMS, "ndim %u", t->ndim);
        uint64_t n = 1;
        for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) n *= t->ne[d];
        FUZZ_CHECK(n == t->numel, "numel %llu, product %llu",
                   (unsigned long long)t->numel, (unsigned long long)n);
        FUZZ_CHECK(gguf_type_nbytes(t->type, t->numel) == t->nbytes, "nbytes of '%s'",
                   t->name);
        const uint8_t *p = t->data;
        FUZZ_CHECK(p >= lo && p <= hi && t->nbytes <= (uint64_t)(hi - p),
                   "tensor '%s' outside the input", t->name);
        FUZZ_CHECK(t->offset % gguf_alignment(f) == 0, "unaligned '%s'", t->name);
        for (size_t k = 0; k < i; k++) {
            const gguf_tensor *u = gguf_tensor_get(f, k);
            FUZZ_CHECK(u->offset + u->nbytes <= t->offset ||
                           t->offset + t->nbytes <= u->offset,
                       "'%s' and '%s' overlap", u->name, t->name);
        }
        float *tmp = malloc((size_t)t->numel * sizeof *tmp + 1);
        FUZZ_CHECK(tmp != NULL, "out of memory");
        if (gguf_to_f32(t->type, p, tmp, t->numel) != 0) {
            volatile uint8_t sum = 0;
            for (uint64_t b = 0; b < t->nbytes; b++) sum ^= p[b];
            (void)sum;
        }
        free(tmp);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    gguf_file *f = NULL;
    char err[1024] = "";
    int rc = gguf_open_memory(data, size, NAME, &f, err, sizeof err);
    size_t n_t = 0, n_kv = 0;
    if (rc == 0) {
        check_kvs(f);
        check_tensors(f, data, data + size);
        n_t = gguf_tensor_count(f);
        n_kv = gguf_kv_count(f);
        gguf_close(f);
    } else {
        FUZZ_CHECK(strncmp(err, NAME ": ", strlen(NAME) + 2) == 0,
                   "error does not name the file: %s", err);
    }
    char path[8192];
    fuzz_write_scratch(NAME, data, size, path, sizeof path);
    gguf_file *g = NULL;
    char err2[sizeof err + sizeof path] = "";
    int rc2 = gguf_open(path, &g, err2, sizeof err2);
    FUZZ_CHECK(rc2 == rc, "memory %d, file %d ('%s' / '%s')", rc, rc2, err, err2);
    if (rc2 == 0) {
        FUZZ_CHECK(gguf_tensor_count(g) == n_t && gguf_kv_count(g) == n_kv,
                   "counts differ");
        gguf_close(g);
    } else if (strlen(err) < sizeof err - 1 && strlen(err2) < sizeof err2 - 1) {
        size_t pl = strlen(path);
        FUZZ_CHECK(strncmp(err2, path, pl) == 0 &&
                       strcmp(err2 + pl, err + strlen(NAME)) == 0,
                   "different errors: '%s' / '%s'", err, err2);
    }
    return 0;
}
