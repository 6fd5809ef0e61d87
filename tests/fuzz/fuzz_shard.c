/*
 * fuzz_shard.c - libFuzzer harness of the token shard reader (data/shard.h):
 * the input is a whole shard file, written to a scratch directory and read
 * with shard_read_info (with and without the payload check) and
 * dataset_open_flags (with and without DATASET_VERIFY_CHECKSUM), then read
 * back token by token. The same bytes are tried a second time with both
 * checksums recomputed, so mutations get past them to the rest of the
 * header and the payload.
 *
 * Checked besides the sanitizers: the header verdicts agree (a header that
 * shard_read_info accepts opens as a dataset unless it holds no tokens, and
 * the reverse), an accepted file is exactly 64 + n x width bytes, a dataset
 * reports the header's counts and names, reads inside it succeed, reads
 * past it fail, and with the payload verified every token is below the
 * vocabulary.
 *
 * Memory: everything is freed per input (leaks are findings).
 */
#include <endian.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/data/shard.h"
#include "tests/fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void put_u64(unsigned char *p, uint64_t v) {
    v = htole64(v);
    memcpy(p, &v, 8);
}

static void check_dataset(const char *path, unsigned flags, int info_ok,
                          const shard_info *info) {
    dataset *ds = NULL;
    char err[8192];
    int rc = dataset_open_flags(path, flags, &ds, err, sizeof err);
    if (info_ok && info->n_tokens > 0)
        FUZZ_CHECK(rc == 0, "shard_read_info accepts, dataset_open refuses: %s", err);
    if (!info_ok || info->n_tokens == 0)
        FUZZ_CHECK(rc != 0, "dataset_open accepts what shard_read_info refuses");
    if (rc != 0) {
        FUZZ_CHECK(err[0] != '\0', "refusal without a message");
        return;
    }
    FUZZ_CHECK(dataset_total_tokens(ds) == info->n_tokens, "total %llu, header %llu",
               (unsigned long long)dataset_total_tokens(ds),
               (unsigned long long)info->n_tokens);
    FUZZ_CHECK(dataset_vocab_size(ds) == info->vocab_size, "vocab");
    FUZZ_CHECK(strcmp(dataset_tokenizer_name(ds), info->tokenizer) == 0, "tokenizer");
    FUZZ_CHECK(dataset_shard_count(ds) == 1 &&
                   strcmp(dataset_shard_path(ds, 0), path) == 0,
               "shard list");
    uint64_t n = info->n_tokens;
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    FUZZ_CHECK(ids != NULL, "out of memory");
    FUZZ_CHECK(dataset_read(ds, 0, n, ids) == 0, "reading all %llu tokens",
               (unsigned long long)n);
    if (flags & DATASET_VERIFY_CHECKSUM)
        for (uint64_t i = 0; i < n; i++)
            FUZZ_CHECK(ids[i] >= 0 && (uint32_t)ids[i] < info->vocab_size,
                       "token %d at %llu outside the vocabulary %u", ids[i],
                       (unsigned long long)i, info->vocab_size);
    int32_t one;
    FUZZ_CHECK(dataset_read(ds, n - 1, 1, &one) == 0 && one == ids[n - 1], "last token");
    FUZZ_CHECK(dataset_read(ds, n, 1, &one) != 0, "read past the end");
    FUZZ_CHECK(dataset_read(ds, 1, UINT64_MAX, &one) != 0, "read of 2^64-1 tokens");
    free(ids);
    dataset_close(ds);
}

static void check_file(const uint8_t *data, size_t size) {
    char path[8192];
    fuzz_write_scratch("train_000.bin", data, size, path, sizeof path);
    shard_info info, info_v;
    char err[8192];
    int ok = shard_read_info(path, 0, &info, err, sizeof err) == 0;
    if (ok) {
        uint64_t want = SHARD_HEADER_SIZE + info.n_tokens * info.token_width;
        FUZZ_CHECK(want == size, "accepted a %zu-byte file for %llu tokens", size,
                   (unsigned long long)info.n_tokens);
        FUZZ_CHECK(info.token_width == 2 || info.token_width == 4, "width %u",
                   info.token_width);
        FUZZ_CHECK(info.tokenizer[0] &&
                       strlen(info.tokenizer) <= SHARD_TOKENIZER_NAME_MAX,
                   "tokenizer name");
    } else {
        FUZZ_CHECK(err[0] != '\0', "refusal without a message");
    }
    int ok_v = shard_read_info(path, 1, &info_v, err, sizeof err) == 0;
    FUZZ_CHECK(!ok_v || ok, "payload check accepts what the header check refuses");
    check_dataset(path, 0, ok, &info);
    check_dataset(path, DATASET_VERIFY_CHECKSUM, ok_v, &info_v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    check_file(data, size);
    if (size < SHARD_HEADER_SIZE) return 0;
    /* Again with both checksums made right. */
    unsigned char *fixed = malloc(size);
    FUZZ_CHECK(fixed != NULL, "out of memory");
    memcpy(fixed, data, size);
    put_u64(fixed + 48,
            shard_checksum(fixed + SHARD_HEADER_SIZE, size - SHARD_HEADER_SIZE));
    put_u64(fixed + 56, shard_checksum(fixed, 56));
    check_file(fixed, size);
    free(fixed);
    return 0;
}
