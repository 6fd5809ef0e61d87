/*
 * sha256.h - SHA-256 for checkpoint checksums, a thin wrapper over OpenSSL's
 * libcrypto (EVP). Streaming API plus whole-buffer and whole-file helpers. The
 * checksum files use the `sha256sum -c` text format so users can verify a
 * checkpoint with coreutils.
 *
 * Memory: sha256_init allocates an EVP context that sha256_final or
 * sha256_discard releases; every init must be paired with one of them.
 * Threads: a sha256_ctx is used by one thread at a time; the functions are
 * reentrant. Errors: sha256_file returns 0 / -1 with a message in err; the
 * streaming calls cannot fail except on allocation failure, which is reported
 * by sha256_final returning -1 (digest zeroed).
 */
#ifndef ORCH_SHA256_H
#define ORCH_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct sha256_ctx {
    void *evp;  /* EVP_MD_CTX*, NULL after final/discard or a failed init */
    int failed; /* an OpenSSL call failed */
} sha256_ctx;

void sha256_init(sha256_ctx *c);
void sha256_update(sha256_ctx *c, const void *data, size_t len);
/* Writes the digest and releases the context. Returns 0, or -1 (digest zeroed)
 * if any step failed. */
int sha256_final(sha256_ctx *c, uint8_t out[32]);
/* Releases the context without a digest (abort paths). Safe to repeat. */
void sha256_discard(sha256_ctx *c);

/* One-shot digest of a buffer. Returns 0 or -1. */
int sha256_buffer(const void *data, size_t len, uint8_t out[32]);

/* Digest of a whole file. Returns 0, or -1 with "PATH: REASON" in err. */
int sha256_file(const char *path, uint8_t out[32], char *err, size_t err_cap);

/* 64 lowercase hex digits + NUL into hex[65]. */
void sha256_hex(const uint8_t digest[32], char hex[65]);

#endif
