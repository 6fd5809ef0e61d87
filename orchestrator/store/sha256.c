/*
 * sha256.c - SHA-256 through OpenSSL's EVP interface (libcrypto). See sha256.h.
 */
#include "orchestrator/store/sha256.h"

#include <errno.h>
#include <stdlib.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <string.h>
#include <unistd.h>

#include "orchestrator/core/fsio.h"
#include "orchestrator/core/util.h"

void sha256_init(sha256_ctx *c) {
    c->failed = 0;
    EVP_MD_CTX *m = EVP_MD_CTX_new();
    if (!m || EVP_DigestInit_ex(m, EVP_sha256(), NULL) != 1) {
        EVP_MD_CTX_free(m);
        c->evp = NULL;
        c->failed = 1;
        return;
    }
    c->evp = m;
}

void sha256_update(sha256_ctx *c, const void *data, size_t len) {
    if (!c->evp || len == 0) return;
    if (EVP_DigestUpdate((EVP_MD_CTX *)c->evp, data, len) != 1) c->failed = 1;
}

int sha256_final(sha256_ctx *c, uint8_t out[32]) {
    unsigned int n = 0;
    int ok = c->evp && !c->failed &&
             EVP_DigestFinal_ex((EVP_MD_CTX *)c->evp, out, &n) == 1 && n == 32;
    sha256_discard(c);
    if (!ok) memset(out, 0, 32);
    return ok ? 0 : -1;
}

void sha256_discard(sha256_ctx *c) {
    EVP_MD_CTX_free((EVP_MD_CTX *)c->evp);
    c->evp = NULL;
}

int sha256_buffer(const void *data, size_t len, uint8_t out[32]) {
    sha256_ctx c;
    sha256_init(&c);
    sha256_update(&c, data, len);
    return sha256_final(&c, out);
}

int sha256_file(const char *path, uint8_t out[32], char *err, size_t err_cap) {
    int fd;
    if (fsio_open_regular(path, &fd, NULL, err, err_cap) != 0) return -1;
    enum { CHUNK = 1 << 20 };
    unsigned char *buf = malloc(CHUNK);
    if (!buf) {
        close(fd);
        util_set_err(err, err_cap, "%s: out of memory", path);
        return -1;
    }
    sha256_ctx c;
    sha256_init(&c);
    int rc = 0;
    for (;;) {
        ssize_t n = read(fd, buf, CHUNK);
        if (n < 0) {
            if (errno == EINTR) continue;
            util_set_err(err, err_cap, "%s: read: %s", path, strerror(errno));
            rc = -1;
            break;
        }
        if (n == 0) break;
        sha256_update(&c, buf, (size_t)n);
    }
    free(buf);
    close(fd);
    if (rc != 0) {
        sha256_discard(&c);
        return -1;
    }
    if (sha256_final(&c, out) != 0) {
        util_set_err(err, err_cap, "%s: SHA-256 failed (libcrypto)", path);
        return -1;
    }
    return 0;
}

void sha256_hex(const uint8_t digest[32], char hex[65]) {
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        hex[2 * i] = digits[digest[i] >> 4];
        hex[2 * i + 1] = digits[digest[i] & 15];
    }
    hex[64] = '\0';
}
