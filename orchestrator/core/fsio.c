/*
 * fsio.c - directories, capped whole-file reads, atomic writes, appends,
 * removal, and the test-only fault hook every write-side primitive calls;
 * see fsio.h.
 */
#include "orchestrator/core/fsio.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "orchestrator/core/util.h"

/* ------------------------------------------------------------------------- */
/* Fault hook                                                                 */
/* ------------------------------------------------------------------------- */

static struct {
    atomic_int armed;
    atomic_uint_fast64_t count;
    atomic_int fired;
    uint64_t site;
    int err;
    fsio_fault_mode mode;
    int from_env; /* armed by ORCH_FSIO_FAULT: say on stderr when it fires */
    fsio_op fired_op;
    char fired_path[PATH_MAX];
} g_fault;

static const char *const op_names[FSIO_OP_COUNT] = { "create", "write",  "fsync",
                                                     "close",  "rename", "mkdir",
                                                     "remove", "opendir" };

const char *fsio_op_name(fsio_op op) {
    return (unsigned)op < FSIO_OP_COUNT ? op_names[op] : "?";
}

void fsio_fault_arm(uint64_t site, int err, fsio_fault_mode mode) {
    atomic_store(&g_fault.armed, 0);
    g_fault.site = site;
    g_fault.err = err ? err : EIO;
    g_fault.mode = mode;
    g_fault.fired_op = FSIO_OP_COUNT;
    g_fault.fired_path[0] = '\0';
    g_fault.from_env = 0;
    atomic_store(&g_fault.count, 0);
    atomic_store(&g_fault.fired, 0);
    atomic_store_explicit(&g_fault.armed, 1, memory_order_release);
}

void fsio_fault_disarm(void) { atomic_store(&g_fault.armed, 0); }

uint64_t fsio_fault_sites(void) { return atomic_load(&g_fault.count); }

int fsio_fault_fired(fsio_op *op, char *path, size_t path_cap) {
    if (!atomic_load_explicit(&g_fault.fired, memory_order_acquire)) return 0;
    if (op) *op = g_fault.fired_op;
    if (path && path_cap) snprintf(path, path_cap, "%s", g_fault.fired_path);
    return 1;
}

/* The armed hook: count the call; at the armed site crash, or return -1
 * (fail with fault_errno()) or 1 (a short write, then fail). */
static int fault_slow(fsio_op op, const char *path) {
    fsio_fault_mode mode = g_fault.mode;
    if ((mode == FSIO_FAULT_FSYNC && op != FSIO_OP_FSYNC) ||
        (mode == FSIO_FAULT_SHORT && op != FSIO_OP_WRITE))
        return 0;
    uint64_t n = atomic_fetch_add(&g_fault.count, 1) + 1;
    if (n != g_fault.site) return 0;
    if (mode == FSIO_FAULT_CRASH || g_fault.from_env) {
        static const char *const what[] = { "failure", "fsync failure", "short write",
                                            "crash" };
        char line[PATH_MAX + 96];
        int len = snprintf(line, sizeof line, "fsio-fault: %s at site %llu (%s %s)\n",
                           what[mode], (unsigned long long)n, fsio_op_name(op),
                           path ? path : "");
        if (len > (int)sizeof line - 1) len = (int)sizeof line - 1;
        ssize_t w = write(STDERR_FILENO, line, (size_t)len);
        (void)w;
        if (mode == FSIO_FAULT_CRASH) _exit(FSIO_FAULT_CRASH_CODE);
    }
    g_fault.fired_op = op;
    snprintf(g_fault.fired_path, sizeof g_fault.fired_path, "%s", path ? path : "");
    atomic_store_explicit(&g_fault.fired, 1, memory_order_release);
    return mode == FSIO_FAULT_SHORT ? 1 : -1;
}

/* The hook of every write-side primitive: 0 = make the call. Unarmed, one
 * atomic load. */
static inline int fsio_fault_check(fsio_op op, const char *path) {
    if (__builtin_expect(!atomic_load_explicit(&g_fault.armed, memory_order_acquire), 1))
        return 0;
    return fault_slow(op, path);
}

static int fault_errno(void) { return g_fault.err; }

static void fault_print_count(void) {
    char line[64];
    int len = snprintf(line, sizeof line, "fsio-fault: %llu sites\n",
                       (unsigned long long)fsio_fault_sites());
    ssize_t w = write(STDERR_FILENO, line, (size_t)len);
    (void)w;
}

/* ORCH_FSIO_FAULT (test-only, see fsio.h), read once at program start. */
__attribute__((constructor)) static void fault_from_env(void) {
    const char *v = getenv("ORCH_FSIO_FAULT");
    if (!v || !*v) return;
    if (strcmp(v, "count") == 0) {
        fsio_fault_arm(0, EIO, FSIO_FAULT_FAIL);
        atexit(fault_print_count);
        return;
    }
    static const struct {
        const char *name;
        int err;
        fsio_fault_mode mode;
    } modes[] = { { "enospc", ENOSPC, FSIO_FAULT_FAIL },
                  { "eio", EIO, FSIO_FAULT_FAIL },
                  { "fsync", EIO, FSIO_FAULT_FSYNC },
                  { "short", ENOSPC, FSIO_FAULT_SHORT },
                  { "crash", 0, FSIO_FAULT_CRASH } };
    const char *colon = strchr(v, ':');
    uint64_t site = 0;
    if (!colon || util_parse_u64(colon + 1, &site) != 0 || site == 0) goto bad;
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++)
        if (strlen(modes[i].name) == (size_t)(colon - v) &&
            strncmp(v, modes[i].name, (size_t)(colon - v)) == 0) {
            fsio_fault_arm(site, modes[i].err, modes[i].mode);
            g_fault.from_env = 1;
            return;
        }
bad:;
    static const char msg[] = "fsio-fault: ignoring ORCH_FSIO_FAULT (expected "
                              "count or enospc|eio|fsync|short|crash:K)\n";
    ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)w;
}

/* ------------------------------------------------------------------------- */
/* Errors                                                                     */
/* ------------------------------------------------------------------------- */

/* strerror(e) with its first letter in lower case ("no such file or
 * directory"), so it reads as the tail of "PATH: what failed: ..." lines. */
static void reason(int e, char *buf, size_t cap) {
    snprintf(buf, cap, "%s", strerror(e));
    if (buf[0] >= 'A' && buf[0] <= 'Z' && buf[1] >= 'a' && buf[1] <= 'z')
        buf[0] = (char)(buf[0] - 'A' + 'a');
}

static int fail(char *err, size_t err_cap, int e, const char *path, const char *what) {
    char r[256];
    reason(e, r, sizeof r);
    if (what)
        util_set_err(err, err_cap, "%s: %s: %s", path, what, r);
    else
        util_set_err(err, err_cap, "%s: %s", path, r);
    errno = e;
    return -1;
}

static int too_large(char *err, size_t err_cap, const char *path, size_t max_bytes) {
    util_set_err(err, err_cap, "%s: file larger than %zu bytes", path, max_bytes);
    errno = EFBIG;
    return -1;
}

static int not_regular(char *err, size_t err_cap, const char *path) {
    util_set_err(err, err_cap, "%s: not a regular file", path);
    errno = EINVAL;
    return -1;
}

/* ------------------------------------------------------------------------- */
/* Hooked system calls: each returns like the call it wraps                   */
/* ------------------------------------------------------------------------- */

static int sys_fault(void) {
    errno = fault_errno();
    return -1;
}

static int sys_mkdir(const char *path) {
    int f = fsio_fault_check(FSIO_OP_MKDIR, path);
    return f ? sys_fault() : mkdir(path, 0755);
}

static int sys_open_write(const char *path, int flags) {
    int f = fsio_fault_check(FSIO_OP_CREATE, path);
    return f ? sys_fault() : open(path, flags | O_WRONLY | O_CLOEXEC, 0644);
}

static int sys_fsync(int fd, const char *path) {
    int f = fsio_fault_check(FSIO_OP_FSYNC, path);
    return f ? sys_fault() : fsync(fd);
}

/* The descriptor is closed either way (a failed close still releases it). */
static int sys_close(int fd, const char *path) {
    int f = fsio_fault_check(FSIO_OP_CLOSE, path);
    int rc = close(fd);
    return f ? sys_fault() : rc;
}

static int sys_fclose(FILE *fp, const char *path) {
    int f = fsio_fault_check(FSIO_OP_CLOSE, path);
    int rc = fclose(fp);
    return f ? sys_fault() : rc;
}

static int sys_rename(const char *from, const char *to) {
    int f = fsio_fault_check(FSIO_OP_RENAME, from);
    return f ? sys_fault() : rename(from, to);
}

static int sys_unlinkat(int dfd, const char *name, int flags, const char *path) {
    int f = fsio_fault_check(FSIO_OP_REMOVE, path);
    return f ? sys_fault() : unlinkat(dfd, name, flags);
}

/* Open a file for writing (flags: O_CREAT, O_TRUNC, O_APPEND as wanted)
 * without blocking on a FIFO, refusing anything but a regular file. */
static int open_regular_for_write(const char *path, int flags, char *err,
                                  size_t err_cap) {
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
        return not_regular(err, err_cap, path);
    int fd = sys_open_write(path, flags | O_NONBLOCK);
    if (fd < 0) return fail(err, err_cap, errno, path, NULL);
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return not_regular(err, err_cap, path);
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl != -1) (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    return fd;
}

/* ------------------------------------------------------------------------- */
/* Directories and reads                                                      */
/* ------------------------------------------------------------------------- */

int fsio_mkdir_p(const char *dir, char *err, size_t err_cap) {
    char buf[PATH_MAX];
    if (!dir || !*dir) {
        util_set_err(err, err_cap, "empty directory name");
        errno = EINVAL;
        return -1;
    }
    if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf) {
        util_set_err(err, err_cap, "%s: path too long", dir);
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *p = buf + 1;; p++) {
        int end = *p == '\0';
        if (!end && *p != '/') continue;
        *p = '\0';
        struct stat st;
        if (stat(buf, &st) != 0) {
            if (errno != ENOENT) return fail(err, err_cap, errno, buf, NULL);
            /* Missing: make it (another process may just have). */
            if (sys_mkdir(buf) != 0 && errno != EEXIST)
                return fail(err, err_cap, errno, buf, "mkdir");
            if (stat(buf, &st) != 0) return fail(err, err_cap, errno, buf, NULL);
        }
        if (!S_ISDIR(st.st_mode)) {
            util_set_err(err, err_cap, "%s: exists and is not a directory", buf);
            errno = ENOTDIR;
            return -1;
        }
        if (end) break;
        *p = '/';
    }
    return 0;
}

int fsio_mkdir(const char *dir, char *err, size_t err_cap) {
    if (sys_mkdir(dir) == 0) return 0;
    return fail(err, err_cap, errno, dir, "mkdir");
}

int fsio_open_regular(const char *path, int *fd_out, struct stat *st_out, char *err,
                      size_t err_cap) {
    /* O_NONBLOCK: opening a FIFO must not wait for a writer. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return fail(err, err_cap, errno, path, NULL);
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return fail(err, err_cap, e, path, NULL);
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        util_set_err(err, err_cap, "%s: not a regular file", path);
        errno = S_ISDIR(st.st_mode) ? EISDIR : EINVAL;
        return -1;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl != -1) (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    *fd_out = fd;
    if (st_out) *st_out = st;
    return 0;
}

int fsio_read_file(const char *path, size_t max_bytes, char **out, size_t *len, char *err,
                   size_t err_cap) {
    int fd;
    struct stat st;
    if (fsio_open_regular(path, &fd, &st, err, err_cap) != 0) return -1;
    if ((uint64_t)st.st_size > max_bytes) {
        close(fd);
        return too_large(err, err_cap, path, max_bytes);
    }
    /* The buffer holds cap - 1 bytes and the NUL; st_size is only a guess
     * (the file may grow or shrink while it is read). */
    size_t limit = max_bytes < SIZE_MAX ? max_bytes + 1 : SIZE_MAX;
    size_t cap = (size_t)st.st_size + 1, n = 0;
    char *buf = malloc(cap);
    if (!buf) {
        close(fd);
        return fail(err, err_cap, ENOMEM, path, "read");
    }
    int e = 0;
    for (;;) {
        char probe;
        int full = n + 1 == cap; /* at EOF, or the file grew */
        ssize_t r = full ? read(fd, &probe, 1) : read(fd, buf + n, cap - 1 - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            e = errno;
            break;
        }
        if (r == 0) break;
        if (!full) {
            n += (size_t)r;
            continue;
        }
        if (n + 1 > max_bytes) {
            free(buf);
            close(fd);
            return too_large(err, err_cap, path, max_bytes);
        }
        size_t ncap = cap <= limit / 2 ? cap * 2 : limit; /* > cap: n < max */
        char *nb = realloc(buf, ncap);
        if (!nb) {
            e = ENOMEM;
            break;
        }
        buf = nb;
        cap = ncap;
        buf[n++] = probe;
    }
    close(fd);
    if (e) {
        free(buf);
        return fail(err, err_cap, e, path, "read");
    }
    buf[n] = '\0';
    *out = buf;
    if (len) *len = n;
    return 0;
}

/* ------------------------------------------------------------------------- */
/* Writes                                                                     */
/* ------------------------------------------------------------------------- */

int fsio_write_all(int fd, const void *buf, size_t n, const char *path, char *err,
                   size_t err_cap) {
    int f = fsio_fault_check(FSIO_OP_WRITE, path);
    if (f < 0) return fail(err, err_cap, fault_errno(), path, "write");
    const char *p = buf;
    size_t todo = f > 0 ? n / 2 : n; /* a short write: half, then the error */
    while (todo) {
        ssize_t w = write(fd, p, todo);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return fail(err, err_cap, errno, path, "write");
        if (w == 0) return fail(err, err_cap, EIO, path, "write");
        p += w;
        todo -= (size_t)w;
    }
    if (f > 0) return fail(err, err_cap, fault_errno(), path, "write");
    return 0;
}

int fsio_fsync_path(const char *path, int is_dir, char *err, size_t err_cap) {
    int fd = open(path, (is_dir ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
    if (fd < 0) return fail(err, err_cap, errno, path, "open for fsync");
    int rc = sys_fsync(fd, path);
    int e = errno;
    close(fd);
    if (rc != 0 && !(is_dir && (e == EINVAL || e == EROFS)))
        return fail(err, err_cap, e, path, "fsync");
    return 0;
}

int fsio_fsync_parent(const char *path, char *err, size_t err_cap) {
    char dir[PATH_MAX];
    size_t len = strlen(path);
    while (len > 1 && path[len - 1] == '/') len--;
    const char *slash = memrchr(path, '/', len);
    if (!slash) return fsio_fsync_path(".", 1, err, err_cap);
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    if (n >= sizeof dir) {
        util_set_err(err, err_cap, "%s: path too long", path);
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(dir, path, n);
    dir[n] = '\0';
    return fsio_fsync_path(dir, 1, err, err_cap);
}

int fsio_rename(const char *from, const char *to, char *err, size_t err_cap) {
    if (sys_rename(from, to) == 0) return 0;
    int e = errno;
    char r[256];
    reason(e, r, sizeof r);
    util_set_err(err, err_cap, "%s: rename to %s: %s", from, to, r);
    errno = e;
    return -1;
}

int fsio_exchange(const char *a, const char *b, char *err, size_t err_cap) {
    int f = fsio_fault_check(FSIO_OP_RENAME, a);
    if (!f && renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) == 0) return 0;
    int e = f ? fault_errno() : errno;
    char r[256];
    reason(e, r, sizeof r);
    util_set_err(err, err_cap, "%s: exchange with %s: %s", a, b, r);
    errno = e;
    return -1;
}

int fsio_write_file(const char *path, const void *data, size_t len, char *err,
                    size_t err_cap) {
    int fd = open_regular_for_write(path, O_CREAT | O_TRUNC, err, err_cap);
    if (fd < 0) return -1;
    if (fsio_write_all(fd, data, len, path, err, err_cap) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    if (sys_fsync(fd, path) != 0) {
        int e = errno;
        close(fd);
        return fail(err, err_cap, e, path, "fsync");
    }
    if (sys_close(fd, path) != 0) return fail(err, err_cap, errno, path, "close");
    return 0;
}

int fsio_atomic_open(fsio_atomic_file *f, const char *path, char *err, size_t err_cap) {
    static atomic_uint counter;
    f->fp = NULL;
    f->tmp_path[0] = '\0';
    if (snprintf(f->path, sizeof f->path, "%s", path) >= (int)sizeof f->path) {
        util_set_err(err, err_cap, "%s: path too long", path);
        errno = ENAMETOOLONG;
        return -1;
    }
    snprintf(f->tmp_path, sizeof f->tmp_path, "%s.tmp.%ld.%u", path, (long)getpid(),
             atomic_fetch_add(&counter, 1));
    int fd = sys_open_write(f->tmp_path, O_CREAT | O_EXCL);
    if (fd < 0) {
        int e = errno;
        f->tmp_path[0] = '\0';
        return fail(err, err_cap, e, path, "create temp file");
    }
    f->fp = fdopen(fd, "wb");
    if (!f->fp) {
        int e = errno;
        close(fd);
        fsio_atomic_abort(f);
        return fail(err, err_cap, e, path, "create temp file");
    }
    return 0;
}

int fsio_atomic_write(fsio_atomic_file *f, const void *buf, size_t n, char *err,
                      size_t err_cap) {
    int fault = fsio_fault_check(FSIO_OP_WRITE, f->tmp_path);
    if (fault < 0) return fail(err, err_cap, fault_errno(), f->path, "write");
    size_t todo = fault > 0 ? n / 2 : n;
    if (todo && fwrite(buf, 1, todo, f->fp) != todo)
        return fail(err, err_cap, errno ? errno : EIO, f->path, "write");
    if (fault > 0) return fail(err, err_cap, fault_errno(), f->path, "write");
    return 0;
}

int fsio_atomic_commit(fsio_atomic_file *f, char *err, size_t err_cap) {
    if (!f->fp) {
        util_set_err(err, err_cap, "%s: commit of a file that is not open", f->path);
        errno = EBADF;
        return -1;
    }
    int e = 0;
    const char *what = NULL;
    /* The flush is where buffered bytes reach the file: a write site. */
    int fault = fsio_fault_check(FSIO_OP_WRITE, f->tmp_path);
    if (fault || fflush(f->fp) != 0 || ferror(f->fp)) {
        e = fault ? fault_errno() : errno ? errno : EIO;
        what = "write";
    } else if (sys_fsync(fileno(f->fp), f->tmp_path) != 0) {
        e = errno;
        what = "fsync";
    }
    if (sys_fclose(f->fp, f->tmp_path) != 0 && !what) {
        e = errno;
        what = "close";
    }
    f->fp = NULL;
    if (what) {
        fsio_atomic_abort(f);
        return fail(err, err_cap, e, f->path, what);
    }
    if (fsio_rename(f->tmp_path, f->path, err, err_cap) != 0) {
        e = errno;
        fsio_atomic_abort(f);
        errno = e;
        return -1;
    }
    f->tmp_path[0] = '\0';
    return fsio_fsync_parent(f->path, err, err_cap);
}

void fsio_atomic_abort(fsio_atomic_file *f) {
    if (!f) return;
    int saved = errno;
    if (f->fp) fclose(f->fp);
    f->fp = NULL;
    if (f->tmp_path[0]) (void)fsio_unlink(f->tmp_path, NULL, 0);
    f->tmp_path[0] = '\0';
    errno = saved;
}

int fsio_write_atomic(const char *path, const void *data, size_t len, char *err,
                      size_t err_cap) {
    fsio_atomic_file f;
    if (fsio_atomic_open(&f, path, err, err_cap) != 0) return -1;
    if (fsio_atomic_write(&f, data, len, err, err_cap) != 0) {
        int e = errno;
        fsio_atomic_abort(&f);
        errno = e;
        return -1;
    }
    return fsio_atomic_commit(&f, err, err_cap);
}

int fsio_tmp_name_pid(const char *name, long *pid) {
    /* TARGET.tmp.PID.N: scan back over N, then PID. */
    size_t len = strlen(name), i = len;
    while (i > 0 && name[i - 1] >= '0' && name[i - 1] <= '9') i--;
    if (i == len || i == 0 || name[i - 1] != '.') return 0;
    size_t pid_end = --i;
    while (i > 0 && name[i - 1] >= '0' && name[i - 1] <= '9') i--;
    if (i == pid_end || pid_end - i > 10 || i < 5 ||
        strncmp(name + i - 5, ".tmp.", 5) != 0)
        return 0;
    if (i == 5) return 0; /* no TARGET */
    long v = 0;
    for (size_t k = i; k < pid_end; k++) v = v * 10 + (name[k] - '0');
    if (v <= 0 || v > INT_MAX) return 0;
    *pid = v;
    return 1;
}

int fsio_open_append(const char *path, int truncate, char *err, size_t err_cap) {
    return open_regular_for_write(path, O_CREAT | O_APPEND | (truncate ? O_TRUNC : 0),
                                  err, err_cap);
}

/* ------------------------------------------------------------------------- */
/* Removal                                                                    */
/* ------------------------------------------------------------------------- */

int fsio_unlink(const char *path, char *err, size_t err_cap) {
    if (sys_unlinkat(AT_FDCWD, path, 0, path) == 0) return 0;
    return fail(err, err_cap, errno, path, "remove");
}

DIR *fsio_opendir(const char *dir, char *err, size_t err_cap) {
    int f = fsio_fault_check(FSIO_OP_OPENDIR, dir);
    DIR *d = f ? NULL : opendir(dir);
    if (!d) fail(err, err_cap, f ? fault_errno() : errno, dir, "open directory");
    return d;
}

/* Remove NAME in directory dfd (PATH: the same, for messages), recursively;
 * never follows a symlink. */
static int rm_at(int dfd, const char *name, const char *path, char *err, size_t err_cap) {
    struct stat st;
    if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
        return errno == ENOENT ? 0 : fail(err, err_cap, errno, path, "remove");
    if (!S_ISDIR(st.st_mode)) {
        if (sys_unlinkat(dfd, name, 0, path) == 0 || errno == ENOENT) return 0;
        return fail(err, err_cap, errno, path, "remove");
    }
    int f = fsio_fault_check(FSIO_OP_OPENDIR, path);
    int fd = f ? -1 : openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        int e = f ? fault_errno() : errno;
        if (fd >= 0) close(fd);
        return fail(err, err_cap, e, path, "open directory");
    }
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char sub[PATH_MAX];
        snprintf(sub, sizeof sub, "%s/%s", path, e->d_name); /* only for messages */
        if (rm_at(dirfd(d), e->d_name, sub, rc ? NULL : err, rc ? 0 : err_cap) != 0)
            rc = -1;
    }
    closedir(d);
    if (rc != 0) return -1;
    if (sys_unlinkat(dfd, name, AT_REMOVEDIR, path) == 0 || errno == ENOENT) return 0;
    return fail(err, err_cap, errno, path, "remove");
}

int fsio_rm_rf(const char *path, char *err, size_t err_cap) {
    return rm_at(AT_FDCWD, path, path, err, err_cap);
}
