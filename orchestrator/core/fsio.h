/*
 * fsio.h - the orchestrator's one file-system layer: creating directories,
 * reading a whole file with a size cap, writing files atomically (temp file
 * in the same directory, write, fsync, rename over the target, fsync the
 * parent directory), appending, removing files and trees, plus the few
 * primitives those are made of, and a test-only fault hook on every one of
 * them.
 *
 * Every file the orchestrator writes (checkpoints, `latest`, shards, corpora,
 * safetensors, config.json, metrics.jsonl) and every file or directory it
 * creates, renames or removes goes through here, so there is one place that
 * decides durability and one place a fault can be injected. Only reads may
 * bypass this layer. (The one exception is the KJV text, which the `bible`
 * child process writes into an fsio temp file; creating, fsyncing and
 * renaming that file still go through here.)
 *
 * Memory: fsio_read_file returns a malloc'd buffer the caller frees;
 * fsio_opendir returns a DIR the caller closedir()s.
 * Threads: every function is thread-safe (no shared state but the fault
 * hook's counters); two threads must not use one fsio_atomic_file at once.
 * Errors: 0 on success, -1 with a one-line message in err ("PATH: what
 * failed: reason", the reason being strerror's text starting in lower case,
 * e.g. "no such file or directory") and errno set; nothing is printed. On
 * failure the target of an atomic write is untouched and its temp file
 * removed.
 */
#ifndef ORCH_FSIO_H
#define ORCH_FSIO_H

#include <dirent.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>

/* mkdir -p DIR (mode 0755). An existing directory is fine; an existing
 * non-directory along the path is an error naming it. Only the missing
 * components are created (one fault site each). */
int fsio_mkdir_p(const char *dir, char *err, size_t err_cap);

/* mkdir DIR (mode 0755); an existing DIR is an error (EEXIST), so a caller
 * that must start from a fresh directory knows it got one. */
int fsio_mkdir(const char *dir, char *err, size_t err_cap);

/* Open PATH for reading (*fd, caller closes) only when it is a regular file:
 * opened with O_NONBLOCK so a FIFO never blocks the caller, checked with
 * fstat, then switched back to blocking reads. *st (may be NULL) gets the
 * file's stat. Errors: "PATH: no such file or directory" (errno ENOENT) and
 * the like, or "PATH: not a regular file" (errno EISDIR for a directory,
 * EINVAL otherwise). Nothing is left open on failure. */
int fsio_open_regular(const char *path, int *fd, struct stat *st, char *err,
                      size_t err_cap);

/* Read all of PATH into a malloc'd, NUL-terminated buffer (*out, caller
 * frees; *len may be NULL). PATH must be a regular file ("PATH: not a regular
 * file" otherwise: a FIFO or device never blocks the caller); a file larger
 * than max_bytes is refused ("PATH: file larger than N bytes"); a missing file
 * says "PATH: no such file or directory". On failure *out is untouched.
 * A read: no fault site. */
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
 * the file system or kernel cannot; callers then fall back to two renames
 * (and treat any other errno as a failure). */
int fsio_exchange(const char *a, const char *b, char *err, size_t err_cap);

/* Create or truncate PATH, write data, fsync and close (not atomic: for files
 * inside a directory that is itself renamed into place afterwards). An
 * existing PATH that is not a regular file is refused without blocking. */
int fsio_write_file(const char *path, const void *data, size_t len, char *err,
                    size_t err_cap);

/* Atomically replace PATH with data (temp file "PATH.tmp.PID.N" beside it). */
int fsio_write_atomic(const char *path, const void *data, size_t len, char *err,
                      size_t err_cap);

/* A file written in pieces and then atomically renamed over its target.
 * open -> write* -> commit, or abort at any point. Writing through fp
 * directly (fprintf) also works; those bytes meet the fault hook only when
 * the commit flushes them. */
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

/* 1 when NAME (a bare file name) is a temp name of fsio_atomic_open,
 * "TARGET.tmp.PID.N", with *pid set; 0 otherwise. For cleaning up after a
 * process that died mid-write. */
int fsio_tmp_name_pid(const char *name, long *pid);

/* Open PATH for appending (created 0644 when missing; truncated first when
 * truncate is set): returns the fd (O_APPEND, close-on-exec; the caller
 * closes it) or -1. An existing PATH that is not a regular file (a FIFO, a
 * device) is refused ("PATH: not a regular file") without blocking. Write to
 * it with fsio_write_all. */
int fsio_open_append(const char *path, int truncate, char *err, size_t err_cap);

/* unlink PATH (not a directory). A missing PATH is an error (ENOENT). */
int fsio_unlink(const char *path, char *err, size_t err_cap);

/* rm -rf PATH: never follows symlinks (a symlink is removed, not its
 * target); a missing PATH is fine. Removes what it can and reports the first
 * failure. */
int fsio_rm_rf(const char *path, char *err, size_t err_cap);

/* opendir DIR, for listing what to remove or replace in it (a fault site;
 * plain reads of a directory may use opendir directly). */
DIR *fsio_opendir(const char *dir, char *err, size_t err_cap);

/* ------------------------------------------------------------------------- */
/* Fault injection (tests only)                                               */
/* ------------------------------------------------------------------------- */
/*
 * Every primitive above that creates, writes, fsyncs, closes, renames,
 * makes, removes or lists-for-removal calls an internal hook first (reads do
 * not). Unarmed, the hook is one atomic load. Armed, it counts the calls
 * ("sites", SQLite-style): a test runs an operation once armed with site 0
 * to learn how many sites N it has (fsio_fault_sites), then once for each
 * k in 1..N with site k failing, and checks what the failure left behind.
 *
 * Modes (what happens at site k):
 *   FSIO_FAULT_FAIL   the k-th call of any kind fails with errno `err`
 *                     (ENOSPC, EIO, ...) instead of being made; a close is
 *                     made and then reported as failed.
 *   FSIO_FAULT_FSYNC  only fsyncs are counted; the k-th fails with `err`.
 *   FSIO_FAULT_SHORT  only writes are counted; the k-th writes the first
 *                     half of its bytes, then fails with `err` (ENOSPC): a
 *                     short write followed by a full disk.
 *   FSIO_FAULT_CRASH  the k-th call of any kind is replaced by
 *                     _exit(FSIO_FAULT_CRASH_CODE), after one line on stderr.
 * The fault fires once; later calls are made normally (and still counted).
 *
 * How it is armed, and the trade-off: only by a function call
 * (fsio_fault_arm) from test code linked with the orchestrator objects, or,
 * for crash tests of the real binary, by the environment variable
 *   ORCH_FSIO_FAULT=MODE:K     MODE one of enospc, eio, fsync (EIO at the
 *                              K-th fsync), short (ENOSPC after half of the
 *                              K-th write), crash
 *   ORCH_FSIO_FAULT=count      count the sites; at exit print
 *                              "fsio-fault: N sites" on stderr
 * read once at program start; a fault armed this way says so when it
 * fires ("fsio-fault: failure at site K (write PATH)" on stderr, also before
 * a crash), so a test knows which call it hit.
 *
 * The variable is TEST-ONLY, yet honoured in every build, because the crash
 * tests must run the binary users run (a separate test build would test a
 * different program). The cost in safety is nil: whoever sets a process's
 * environment can already make its writes fail or kill it (ulimit -f, a
 * full disk, LD_PRELOAD, a signal), and a fault only does what a full disk,
 * an I/O error or a crash would do (fail a call, after at most half a write,
 * or exit). No file, config key, command-line flag or HTTP request can arm
 * it; the cost in speed is one getenv at start-up.
 *
 * Threads: arm and disarm while no other thread is in fsio; counting is
 * atomic, so the armed hook itself is thread-safe.
 */
typedef enum fsio_op {
    FSIO_OP_CREATE, /* open creating or truncating a file for writing */
    FSIO_OP_WRITE,
    FSIO_OP_FSYNC,
    FSIO_OP_CLOSE,
    FSIO_OP_RENAME, /* rename and exchange */
    FSIO_OP_MKDIR,
    FSIO_OP_REMOVE, /* unlink and rmdir */
    FSIO_OP_OPENDIR,
    FSIO_OP_COUNT
} fsio_op;

typedef enum fsio_fault_mode {
    FSIO_FAULT_FAIL,
    FSIO_FAULT_FSYNC,
    FSIO_FAULT_SHORT,
    FSIO_FAULT_CRASH
} fsio_fault_mode;

#define FSIO_FAULT_CRASH_CODE 86

/* Arm: reset the counter and the fired record; site 0 only counts. */
void fsio_fault_arm(uint64_t site, int err, fsio_fault_mode mode);
/* Stop counting and failing; the count and the fired record stay readable. */
void fsio_fault_disarm(void);
/* Sites counted since the last arm (for the mode's kind of call). */
uint64_t fsio_fault_sites(void);
/* 1 when the fault armed last has fired, with the call it replaced (op and
 * path; both may be NULL); 0 otherwise. */
int fsio_fault_fired(fsio_op *op, char *path, size_t path_cap);
/* "create", "write", "fsync", "close", "rename", "mkdir", "remove", "opendir". */
const char *fsio_op_name(fsio_op op);

#endif
