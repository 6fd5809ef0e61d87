/*
 * fsio.c - directories, capped whole-file reads and atomic writes; see fsio.h.
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
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return fail(err, err_cap, errno, buf, "mkdir");
        struct stat st;
        if (stat(buf, &st) != 0) return fail(err, err_cap, errno, buf, NULL);
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
    if (mkdir(dir, 0755) == 0) return 0;
    return fail(err, err_cap, errno, dir, "mkdir");
}

int fsio_read_file(const char *path, size_t max_bytes, char **out, size_t *len, char *err,
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
        errno = EINVAL;
        return -1;
    }
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

int fsio_write_all(int fd, const void *buf, size_t n, const char *path, char *err,
                   size_t err_cap) {
    const char *p = buf;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return fail(err, err_cap, errno, path, "write");
        if (w == 0) return fail(err, err_cap, EIO, path, "write");
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int fsio_fsync_path(const char *path, int is_dir, char *err, size_t err_cap) {
    int fd = open(path, (is_dir ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
    if (fd < 0) return fail(err, err_cap, errno, path, "open for fsync");
    int rc = fsync(fd);
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
    if (rename(from, to) == 0) return 0;
    int e = errno;
    char r[256];
    reason(e, r, sizeof r);
    util_set_err(err, err_cap, "%s: rename to %s: %s", from, to, r);
    errno = e;
    return -1;
}

int fsio_exchange(const char *a, const char *b, char *err, size_t err_cap) {
    if (renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) == 0) return 0;
    int e = errno;
    char r[256];
    reason(e, r, sizeof r);
    util_set_err(err, err_cap, "%s: exchange with %s: %s", a, b, r);
    errno = e;
    return -1;
}

int fsio_write_file(const char *path, const void *data, size_t len, char *err,
                    size_t err_cap) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return fail(err, err_cap, errno, path, NULL);
    if (fsio_write_all(fd, data, len, path, err, err_cap) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    if (fsync(fd) != 0) {
        int e = errno;
        close(fd);
        return fail(err, err_cap, e, path, "fsync");
    }
    if (close(fd) != 0) return fail(err, err_cap, errno, path, "close");
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
    int fd = open(f->tmp_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
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
    if (n && fwrite(buf, 1, n, f->fp) != n)
        return fail(err, err_cap, errno ? errno : EIO, f->path, "write");
    return 0;
}

int fsio_atomic_commit(fsio_atomic_file *f, char *err, size_t err_cap) {
    if (!f->fp) {
        util_set_err(err, err_cap, "%s: commit of a file that is not open", f->path);
        errno = EBADF;
        return -1;
    }
    int rc = 0, e = 0;
    const char *what = NULL;
    if (fflush(f->fp) != 0 || ferror(f->fp)) {
        e = errno ? errno : EIO;
        what = "write";
    } else if (fsync(fileno(f->fp)) != 0) {
        e = errno;
        what = "fsync";
    }
    if (fclose(f->fp) != 0 && !what) {
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
    rc = fsio_fsync_parent(f->path, err, err_cap);
    return rc;
}

void fsio_atomic_abort(fsio_atomic_file *f) {
    if (!f) return;
    int saved = errno;
    if (f->fp) fclose(f->fp);
    f->fp = NULL;
    if (f->tmp_path[0]) unlink(f->tmp_path);
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
