/*
 * fuzz_safetensors.c - libFuzzer harness of the safetensors reader
 * (store/safetensors.h): the input is a whole file, opened from memory
 * (safetensors_open_memory) and, as a file in a scratch directory, through
 * the mmap path (safetensors_open); both must agree.
 *
 * Checked besides the sanitizers: an opened file keeps the promises of
 * safetensors.h (names non-empty, unique and found by safetensors_find,
 * numel the product of the shape, nbytes = numel x dtype size, every
 * tensor's data inside the data buffer, the tensors tiling it exactly); every
 * tensor's bytes are read (F32/F16/BF16 through safetensors_to_f32) so ASan
 * sees any pointer outside the input; a refusal has a message that names
 * the file.
 *
 * Memory: everything is freed per input (leaks are findings).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/store/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

#define NAME "fuzz.safetensors"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_tensor(const safetensors_file *f, const safetensors_tensor *t,
                         const uint8_t *lo, const uint8_t *hi) {
    FUZZ_CHECK(t->name && t->name[0], "empty tensor name");
    FUZZ_CHECK(safetensors_find(f, t->name) == t, "find('%s') is another tensor",
               t->name);
    FUZZ_CHECK(t->ndim <= SAFETENSORS_MAX_DIMS, "ndim %u", t->ndim);
    uint64_t numel = 1;
    for (uint32_t d = 0; d < t->ndim; d++) numel *= t->shape[d];
    FUZZ_CHECK(numel == t->numel, "numel %llu, shape product %llu",
               (unsigned long long)t->numel, (unsigned long long)numel);
    size_t es = safetensors_dtype_size(t->dtype);
    FUZZ_CHECK(es > 0 && t->nbytes == t->numel * es, "nbytes %llu",
               (unsigned long long)t->nbytes);
    const uint8_t *p = t->data;
    FUZZ_CHECK(p >= lo && p <= hi && t->nbytes <= (uint64_t)(hi - p),
               "tensor '%s' outside the data buffer", t->name);
    if (t->dtype == SAFETENSORS_F32 || t->dtype == SAFETENSORS_F16 ||
        t->dtype == SAFETENSORS_BF16) {
        float *tmp = malloc((size_t)t->numel * sizeof *tmp + 1);
        FUZZ_CHECK(tmp != NULL, "out of memory");
        FUZZ_CHECK(safetensors_to_f32(t->dtype, p, tmp, t->numel) == 0, "to_f32");
        free(tmp);
    } else {
        volatile uint8_t sum = 0;
        for (uint64_t i = 0; i < t->nbytes; i++) sum ^= p[i];
        (void)sum;
    }
}

static void check_file(const safetensors_file *f, const uint8_t *data, size_t size) {
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | data[i];
    const uint8_t *lo = data + 8 + hlen, *hi = data + size;
    size_t n = safetensors_count(f);
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        const safetensors_tensor *t = safetensors_get(f, i);
        FUZZ_CHECK(t != NULL, "tensor %zu missing", i);
        check_tensor(f, t, lo, hi);
        total += t->nbytes;
    }
    FUZZ_CHECK(safetensors_get(f, n) == NULL, "tensor past the count");
    FUZZ_CHECK(total == (uint64_t)(hi - lo), "tensors cover %llu of %llu bytes",
               (unsigned long long)total, (unsigned long long)(hi - lo));
    static const char *const keys[] = { "format", "vocab_size", "", "__metadata__" };
    for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
        const char *v = safetensors_metadata(f, keys[k]);
        if (v) (void)strlen(v);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    safetensors_file *f = NULL;
    char err[1024] = "";
    int rc = safetensors_open_memory(data, size, NAME, &f, err, sizeof err);
    size_t count = 0;
    if (rc == 0) {
        check_file(f, data, size);
        count = safetensors_count(f);
        safetensors_close(f);
    } else {
        FUZZ_CHECK(strncmp(err, NAME ": ", strlen(NAME) + 2) == 0,
                   "error does not name the file: %s", err);
    }

    /* The same bytes through the file and mmap path: the same verdict. */
    char path[8192];
    fuzz_write_scratch(NAME, data, size, path, sizeof path);
    safetensors_file *g = NULL;
    char err2[sizeof err + sizeof path] = "";
    int rc2 = safetensors_open(path, &g, err2, sizeof err2);
    FUZZ_CHECK(rc2 == rc, "memory %d, file %d ('%s' / '%s')", rc, rc2, err, err2);
    if (rc2 == 0) {
        FUZZ_CHECK(safetensors_count(g) == count, "count %zu / %zu", count,
                   safetensors_count(g));
        safetensors_close(g);
    } else if (strlen(err) < sizeof err - 1 && strlen(err2) < sizeof err2 - 1) {
        size_t pl = strlen(path); /* not truncated: compare */
        FUZZ_CHECK(strncmp(err2, path, pl) == 0 &&
                       strcmp(err2 + pl, err + strlen(NAME)) == 0,
                   "different errors: '%s' / '%s'", err, err2);
    }
    return 0;
}
