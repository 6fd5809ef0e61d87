/*
 * util.h - small helpers shared by every orchestrator module: error reporting
 * for the CLI, a monotonic clock, checked allocation and string helpers.
 *
 * Thread rules: every function here is thread-safe.
 * Errors: library code never prints; it returns a status and fills a caller
 * buffer. Only CLI code (cmd_*.c, main.c) calls util_die/util_error.
 */
#ifndef ORCH_UTIL_H
#define ORCH_UTIL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Exit statuses of the orch binary (documented in README and --help). */
#define ORCH_EXIT_OK      0
#define ORCH_EXIT_FAILURE 1 /* runtime failure */
#define ORCH_EXIT_USAGE   2 /* bad arguments, config, input file or engine */

/* Print "orch: error: <message>" as one line to stderr. */
void util_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Print "orch: warning: <message>" as one line to stderr. */
void util_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* snprintf into buf (if buf != NULL and cap > 0); always NUL-terminates. */
void util_set_err(char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* prefix followed by 2*n_bytes lowercase hex digits from the kernel's
 * random source (getrandom), into out (cap must hold them and the NUL), for
 * object ids ("file-...", "ftjob-..."). Returns 0, or -1 when no random
 * bytes can be had. Thread-safe. */
int util_random_id(char *out, size_t cap, const char *prefix, size_t n_bytes);

/* Seconds from a monotonic clock. */
double util_now(void);

/* Allocation that returns NULL on failure (never aborts); zeroed. Free with
 * free(). */
void *util_calloc(size_t n, size_t size);

/* pthread_create with SIGINT, SIGTERM and SIGUSR1 blocked in the new thread,
 * so those signals always reach the thread that handles them (the main one).
 * Returns 0, or the pthread_create error number (nothing started). */
int util_thread_start_nosignals(pthread_t *thread, void *(*fn)(void *), void *arg);

/* Directory holding the running executable (from /proc/self/exe), without a
 * trailing slash, into buf. Returns 0, or -1 when it cannot be found. */
int util_exe_dir(char *buf, size_t cap);

/* Parse helpers: return 0 on success, -1 if s is not entirely a number in
 * range. */
int util_parse_u64(const char *s, uint64_t *out);
int util_parse_i64(const char *s, int64_t *out);
int util_parse_double(const char *s, double *out);

/* Read all of f into a malloc'd, NUL-terminated buffer (caller frees); *len
 * gets the byte count (embedded NULs allowed). Returns NULL on a read error or
 * out of memory (errno says which). */
char *util_read_stream(FILE *f, size_t *len);

/* The whole of stdin when path is "-" (util_read_stream), else of the
 * regular file PATH (fsio_read_file, at most UTIL_READ_FILE_MAX bytes).
 * NULL with errno set on failure: ENOENT etc. from open, EISDIR for a
 * directory, EINVAL for a FIFO or device, EFBIG for a file over the limit. */
#define UTIL_READ_FILE_MAX ((size_t)1 << 30)
char *util_read_file(const char *path, size_t *len);

#endif
