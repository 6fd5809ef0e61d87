/*
 * util.c - shared helpers: CLI error lines, monotonic time, allocation,
 * executable directory, number parsing, flag values, reading a file or
 * stdin. See util.h.
 */
#include "orchestrator/core/util.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "orchestrator/core/fsio.h"

static void vline(const char *kind, const char *fmt, va_list ap) {
    char msg[2048];
    vsnprintf(msg, sizeof msg, fmt, ap);
    /* Keep the report to one line. */
    for (char *p = msg; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
    fprintf(stderr, "orch: %s: %s\n", kind, msg);
}

void util_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vline("error", fmt, ap);
    va_end(ap);
}

void util_warn(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vline("warning", fmt, ap);
    va_end(ap);
}

void util_set_err(char *buf, size_t cap, const char *fmt, ...) {
    if (!buf || cap == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, cap, fmt, ap);
    va_end(ap);
}

int util_random_id(char *out, size_t cap, const char *prefix, size_t n_bytes) {
    size_t plen = strlen(prefix);
    if (n_bytes > 64 || plen + 2 * n_bytes + 1 > cap) return -1;
    unsigned char r[64];
    size_t got = 0;
    while (got < n_bytes) {
        ssize_t n = getrandom(r + got, n_bytes - got, 0);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        got += (size_t)n;
    }
    memcpy(out, prefix, plen);
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < n_bytes; i++) {
        out[plen + 2 * i] = hex[r[i] >> 4];
        out[plen + 2 * i + 1] = hex[r[i] & 15];
    }
    out[plen + 2 * n_bytes] = '\0';
    return 0;
}

double util_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void *util_calloc(size_t n, size_t size) {
    if (n == 0 || size == 0) return calloc(1, 1);
    return calloc(n, size);
}

int util_thread_start_nosignals(pthread_t *thread, void *(*fn)(void *), void *arg) {
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    int rc = pthread_create(thread, NULL, fn, arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}

int util_exe_dir(char *buf, size_t cap) {
    char path[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
    if (n <= 0) return -1;
    path[n] = '\0';
    char *slash = strrchr(path, '/');
    if (!slash) return -1;
    *slash = '\0';
    if (strlen(path) + 1 > cap) return -1;
    memcpy(buf, path, strlen(path) + 1);
    return 0;
}

int util_parse_u64(const char *s, uint64_t *out) {
    if (!s || !*s || *s == '-') return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end) return -1;
    *out = (uint64_t)v;
    return 0;
}

int util_parse_i64(const char *s, int64_t *out) {
    if (!s || !*s) return -1;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (errno || *end) return -1;
    *out = (int64_t)v;
    return 0;
}

int util_parse_double(const char *s, double *out) {
    if (!s || !*s) return -1;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (errno || *end) return -1;
    *out = v;
    return 0;
}

char *util_read_stream(FILE *f, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf) return NULL;
    for (;;) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
        if (n == cap) {
            cap *= 2;
            char *nb = realloc(buf, cap + 1);
            if (!nb) {
                free(buf);
                errno = ENOMEM;
                return NULL;
            }
            buf = nb;
        }
    }
    if (ferror(f)) {
        free(buf);
        if (!errno) errno = EIO;
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

char *util_read_file(const char *path, size_t *len) {
    if (strcmp(path, "-") == 0) return util_read_stream(stdin, len);
    char *buf = NULL;
    if (fsio_read_file(path, UTIL_READ_FILE_MAX, &buf, len, NULL, 0) != 0) return NULL;
    return buf;
}
