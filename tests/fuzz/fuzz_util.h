/*
 * fuzz_util.h - what the libFuzzer harnesses of tests/fuzz/ share: a check
 * that stops the run with a message (libFuzzer then saves the input as a
 * crash), a NUL-terminated copy of the input, a per-process scratch
 * directory (removed at exit) for the readers that take a path, and a
 * well-formed UTF-8 test.
 *
 * Header-only (static functions): each harness is one .c file linked against
 * the orchestrator objects built for fuzzing (make fuzz).
 * Threads: libFuzzer runs a harness on one thread; so do these helpers.
 * Memory: fuzz_cstr returns malloc'd text (free it); fuzz_scratch_dir returns
 * a static buffer.
 * Errors: FUZZ_CHECK aborts; the file helpers abort when the scratch
 * directory cannot be written (a broken machine, not a finding).
 */
#ifndef ORCH_FUZZ_UTIL_H
#define ORCH_FUZZ_UTIL_H

#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "orchestrator/core/utf8.h"

/* The harness's own invariant: on failure print it and abort (a crash). */
#define FUZZ_CHECK(cond, ...)                                                       \
    do {                                                                            \
        if (!(cond)) {                                                              \
            fprintf(stderr, "FUZZ_CHECK failed at %s:%d: %s: ", __FILE__, __LINE__, \
                    #cond);                                                         \
            fprintf(stderr, __VA_ARGS__);                                           \
            fputc('\n', stderr);                                                    \
            abort();                                                                \
        }                                                                           \
    } while (0)

/* The input as a NUL-terminated string (bytes after an embedded NUL stay
 * in the copy but the C string ends there). */
static inline char *fuzz_cstr(const uint8_t *data, size_t size) {
    char *s = malloc(size + 1);
    if (!s) abort();
    if (size) memcpy(s, data, size);
    s[size] = '\0';
    return s;
}

static char fuzz_dir_[4096];

static void fuzz_scratch_cleanup_(void) {
    if (!fuzz_dir_[0]) return;
    DIR *d = opendir(fuzz_dir_);
    if (d) {
        struct dirent *e;
        char p[8192];
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
            snprintf(p, sizeof p, "%s/%s", fuzz_dir_, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(fuzz_dir_);
}

/* A fresh directory for this process: $FUZZ_SCRATCH, else /dev/shm when
 * writable (no disk I/O per input), else $TMPDIR or /tmp. Removed at exit
 * (not after a crash: libFuzzer _exits). */
static inline const char *fuzz_scratch_dir(void) {
    if (fuzz_dir_[0]) return fuzz_dir_;
    const char *base = getenv("FUZZ_SCRATCH");
    if (!base || !*base) base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : NULL;
    if (!base) base = getenv("TMPDIR");
    if (!base || !*base) base = "/tmp";
    snprintf(fuzz_dir_, sizeof fuzz_dir_, "%s/orch-fuzz-XXXXXX", base);
    if (!mkdtemp(fuzz_dir_)) {
        perror("fuzz: mkdtemp");
        abort();
    }
    atexit(fuzz_scratch_cleanup_);
    return fuzz_dir_;
}

/* Write size bytes to the file name inside the scratch directory; path
 * (cap bytes) receives its full name. */
static inline void fuzz_write_scratch(const char *name, const void *data, size_t size,
                                      char *path, size_t cap) {
    snprintf(path, cap, "%s/%s", fuzz_scratch_dir(), name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        perror(path);
        abort();
    }
    const char *p = data;
    while (size > 0) {
        ssize_t w = write(fd, p, size);
        if (w <= 0) {
            perror(path);
            abort();
        }
        p += w;
        size -= (size_t)w;
    }
    close(fd);
}

/* 1 when s[0..n) is well-formed UTF-8 (utf8.h's rules). */
static inline int fuzz_utf8_ok(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        size_t l = utf8_char_len(s + i, n - i);
        if (l == 0) return 0;
        i += l;
    }
    return 1;
}

#endif
