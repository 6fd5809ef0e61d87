/*
 * fsio.h - the orchestrator's one file-system layer: creating directories,
 * reading a whole file with a size cap, and writing files atomically (temp
 * file in the same directory, write, fsync, rename over the target, fsync the
 * parent directory), plus the few primitives those are made of.
 *
 * Every file the orchestrator writes (checkpoints, shards, corpora,
 * safetensors, config.json, metrics.jsonl) goes through here, so there is one
 * place that decides durability and one place a fault can be injected.
 *
 * Memory: fsio_read_file returns a malloc'd buffer the caller frees.
 * Threads: every function is thread-safe (no shared state); two threads must
 * not use one fsio_atomic_file at once.
 * Errors: 0 on success, -1 with a one-line message in err ("PATH: what
 * failed: reason", the reason being strerror's text starting in lower case,
 * e.g. "no such file or directory") and errno set; nothing is printed. On
 * failure the target of an atomic write is untouched and its temp file
 * removed.
 */
#ifndef ORCH_FSIO_H
#define ORCH_FSIO_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* mkdir -p DIR (mode 0755). An existing directory is fine; an existing
 * non-directory along the path is an error naming it. */
int fsio_mkdir_p(const char *dir, char *err, size_t err_cap);

/* mkdir DIR (mode 0755); an existing DIR is an error (EEXIST), so a caller
 * that must start from a fresh directory knows it got one. */
int fsio_mkdir(const char *dir, char *err, size_t err_cap);

/* Read all of PATH into a malloc'd, NUL-terminated buffer (*out, caller
 * frees; *len may be NULL). PATH must be a regular file ("PATH: not a regular
 * file" otherwise: a FIFO or device never blocks the caller); a file larger
 * than max_bytes is refused ("PATH: file larger than N bytes"); a missing file
 * says "PATH: no such file or directory". On failure *out is untouched. */
int fsio_read_file(const char *path, size_t max_bytes, char **out, size_t *len, char *err,
                   size_t err_cap);

/* Write all n bytes to fd (retrying short writes and EINTR). */
int fsio_write_all(int fd, const void *buf, size_t n, const char *path, char *err,
                   size_t err_cap);

/* fsync PATH (a file, or a directory when is_dir; file systems that cannot
 * fsync a directory are accepted). */
int fsio_fsync_path(const char *path, int is_dir, char *err, size_t err_cap);

/* fsync the directory that contains PATH ("." for a bare name; trailing
 * slashes of PATH are ignored, so "a/b/" means "a"). */
int fsio_fsync_parent(const char *path, char *err, size_t err_cap);

/* rename(from, to) with an error naming both. */
int fsio_rename(const char *from, const char *to, char *err, size_t err_cap);

/* Atomically swap two existing paths (renameat2 RENAME_EXCHANGE), e.g. a new
 * directory with the one it replaces. -1 with errno EINVAL or ENOSYS where
 * the file system or kernel cannot; callers then fall back to two renames. */
int fsio_exchange(const char *a, const char *b, char *err, size_t err_cap);

/* Create or truncate PATH, write data, fsync and close (not atomic: for files
 * inside a directory that is itself renamed into place afterwards). */
int fsio_write_file(const char *path, const void *data, size_t len, char *err,
                    size_t err_cap);

/* Atomically replace PATH with data (temp file "PATH.tmp.PID.N" beside it). */
int fsio_write_atomic(const char *path, const void *data, size_t len, char *err,
                      size_t err_cap);

/* A file written in pieces and then atomically renamed over its target.
 * open -> write* (or fprintf to fp) -> commit, or abort at any point. */
typedef struct fsio_atomic_file {
    FILE *fp;            /* buffered stream on the temp file */
    char path[4096];     /* the target */
    char tmp_path[4160]; /* the temp file beside it */
} fsio_atomic_file;

int fsio_atomic_open(fsio_atomic_file *f, const char *path, char *err, size_t err_cap);
int fsio_atomic_write(fsio_atomic_file *f, const void *buf, size_t n, char *err,
                      size_t err_cap);
/* Flush, fsync, close, rename over the target, fsync its directory. On
 * failure the temp file is removed and the target untouched. */
int fsio_atomic_commit(fsio_atomic_file *f, char *err, size_t err_cap);
/* Close and remove the temp file (safe after a failed open or commit). */
void fsio_atomic_abort(fsio_atomic_file *f);

#endif
