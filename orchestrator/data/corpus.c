/*
 * corpus.c - the default corpus (King James Bible via Debian's `bible`
 * program from bible-kjv) and its token shards. See corpus.h.
 */
#include "orchestrator/data/corpus.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "orchestrator/core/fsio.h"
#include "orchestrator/core/util.h"
#include "orchestrator/data/shard.h"
#include "orchestrator/data/tokenizer.h"

extern char **environ;

#define KJV_RANGE       "gen1:1-rev22:21"
#define KJV_FIRST_VERSE "In the beginning God created the heaven and the earth."
#define KJV_LAST_VERSE  "The grace of our Lord Jesus Christ be with you all. Amen."
/* `bible -l1000` gives 4,298,239 bytes; allow for packaging differences. */
#define KJV_MIN_BYTES 4000000
#define KJV_MAX_BYTES 4700000

static atomic_uint tmp_counter;

/* Check the text written by `bible` into the file at path. */
static int kjv_check(const char *path, char *err, size_t err_cap) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        util_set_err(err, err_cap, "cannot read back %s: %s", path, strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    if (st.st_size < KJV_MIN_BYTES || st.st_size > KJV_MAX_BYTES) {
        util_set_err(err, err_cap,
                     "`bible -l1000 '" KJV_RANGE "'` wrote %lld bytes, not the "
                     "expected ~4.3 MB (is bible-kjv complete? run "
                     "tools/setup.sh)",
                     (long long)st.st_size);
        close(fd);
        return -1;
    }
    char head[256], tail[256];
    ssize_t h = pread(fd, head, sizeof head - 1, 0);
    ssize_t t = pread(fd, tail, sizeof tail - 1, st.st_size - (off_t)(sizeof tail - 1));
    close(fd);
    if (h <= 0 || t <= 0) {
        util_set_err(err, err_cap, "cannot read back %s", path);
        return -1;
    }
    head[h] = tail[t] = '\0';
    if (!strstr(head, "Genesis 1") || !strstr(head, KJV_FIRST_VERSE)) {
        util_set_err(err, err_cap,
                     "the KJV text does not start with Genesis 1:1 (unexpected "
                     "`bible` output; run tools/setup.sh)");
        return -1;
    }
    if (!strstr(tail, KJV_LAST_VERSE)) {
        util_set_err(err, err_cap,
                     "the KJV text does not end with Revelation 22:21 "
                     "(truncated `bible` output?)");
        return -1;
    }
    return 0;
}

int corpus_fetch_kjv(const char *out_path, char *err, size_t err_cap) {
    fsio_atomic_file f; /* `bible` writes straight into the temp file */
    if (fsio_atomic_open(&f, out_path, err, err_cap) != 0) return -1;
    int fd = fileno(f.fp);
    int errpipe[2];
    if (pipe2(errpipe, O_CLOEXEC) != 0) {
        util_set_err(err, err_cap, "pipe: %s", strerror(errno));
        fsio_atomic_abort(&f);
        return -1;
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, fd, 1);
    posix_spawn_file_actions_adddup2(&fa, errpipe[1], 2);
    char *argv[] = { "bible", "-l1000", KJV_RANGE, NULL };
    pid_t pid;
    int src = posix_spawnp(&pid, "bible", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(errpipe[1]);
    if (src != 0) {
        close(errpipe[0]);
        fsio_atomic_abort(&f);
        if (src == ENOENT)
            util_set_err(err, err_cap,
                         "the `bible` program (Debian package bible-kjv) is not "
                         "installed; run tools/setup.sh");
        else
            util_set_err(err, err_cap, "cannot run `bible`: %s", strerror(src));
        return -1;
    }
    char msg[512];
    size_t mn = 0;
    for (;;) {
        ssize_t r = read(errpipe[0], msg + mn, sizeof msg - 1 - mn);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        mn += (size_t)r;
        if (mn == sizeof msg - 1) { /* keep draining, drop the rest */
            char sink[512];
            while (read(errpipe[0], sink, sizeof sink) > 0) {
            }
            break;
        }
    }
    msg[mn] = '\0';
    close(errpipe[0]);
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    for (char *p = msg; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        /* posix_spawnp reports a missing program as exit 127 on glibc. */
        if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
            util_set_err(err, err_cap,
                         "the `bible` program (Debian package bible-kjv) is not "
                         "installed; run tools/setup.sh");
        else
            util_set_err(
                err, err_cap, "`bible -l1000 '" KJV_RANGE "'` failed (status %d)%s%s",
                WIFEXITED(status) ? WEXITSTATUS(status) : -1, mn ? ": " : "", msg);
        fsio_atomic_abort(&f);
        return -1;
    }
    if (kjv_check(f.tmp_path, err, err_cap) != 0) {
        fsio_atomic_abort(&f);
        return -1;
    }
    return fsio_atomic_commit(&f, err, err_cap);
}

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

int corpus_default_data_dir(char *buf, size_t cap, char *err, size_t err_cap) {
    char cand[PATH_MAX];
    const char *env = getenv("ORCH_DATA_DIR");
    char exe[PATH_MAX];
    if (env && *env) {
        snprintf(cand, sizeof cand, "%s", env);
    } else if (util_exe_dir(exe, sizeof exe) == 0 &&
               snprintf(cand, sizeof cand, "%s/../data", exe) < (int)sizeof cand &&
               is_dir(cand)) {
        /* cand set */
    } else {
        snprintf(cand, sizeof cand, "./data");
    }
    if (strlen(cand) + 1 > cap) {
        util_set_err(err, err_cap, "data directory path too long: %s", cand);
        return -1;
    }
    memcpy(buf, cand, strlen(cand) + 1);
    return 0;
}

/* Remove a directory prepare wrote (best effort: it only holds our temp or
 * replaced shards). */
static void remove_flat_dir(const char *dir) { (void)fsio_rm_rf(dir, NULL, 0); }

/* 1 if both globs open as valid datasets made with tokenizer kind. */
static int shards_valid(const char *train_glob, const char *val_glob, const char *kind) {
    const char *globs[2] = { train_glob, val_glob };
    for (int i = 0; i < 2; i++) {
        dataset *ds;
        char e[256];
        if (dataset_open(globs[i], &ds, e, sizeof e) != 0) return 0;
        int ok = strcmp(dataset_tokenizer_name(ds), kind) == 0;
        dataset_close(ds);
        if (!ok) return 0;
    }
    return 1;
}

int corpus_prepare_kjv(const char *data_dir, const char *kind, shard_progress_fn progress,
                       void *progress_user, char *train_glob, size_t train_glob_cap,
                       char *val_glob, size_t val_glob_cap, int *prepared, char *err,
                       size_t err_cap) {
    if (prepared) *prepared = 0;
    if (!tokenizer_kind_valid(kind)) {
        util_set_err(err, err_cap, "unknown tokenizer '%s' (expected byte or gpt2)",
                     kind ? kind : "(null)");
        return -1;
    }
    char dir[PATH_MAX];
    if (data_dir) {
        if (snprintf(dir, sizeof dir, "%s", data_dir) >= (int)sizeof dir) {
            util_set_err(err, err_cap, "path too long: %s", data_dir);
            return -1;
        }
    } else if (corpus_default_data_dir(dir, sizeof dir, err, err_cap) != 0) {
        return -1;
    }
    if (fsio_mkdir_p(dir, err, err_cap) != 0) return -1;

    char text[PATH_MAX], out[PATH_MAX], tglob[PATH_MAX], vglob[PATH_MAX];
    if (snprintf(text, sizeof text, "%s/kjv.txt", dir) >= (int)sizeof text ||
        snprintf(out, sizeof out, "%s/kjv-%s", dir, kind) >= (int)sizeof out ||
        snprintf(tglob, sizeof tglob, "%s/train_*.bin", out) >= (int)sizeof tglob ||
        snprintf(vglob, sizeof vglob, "%s/val_*.bin", out) >= (int)sizeof vglob) {
        util_set_err(err, err_cap, "data directory path too long: %s", dir);
        return -1;
    }
    if (strlen(tglob) + 1 > train_glob_cap || strlen(vglob) + 1 > val_glob_cap) {
        util_set_err(err, err_cap, "glob buffer too small for %s", tglob);
        return -1;
    }
    memcpy(train_glob, tglob, strlen(tglob) + 1);
    memcpy(val_glob, vglob, strlen(vglob) + 1);

    if (shards_valid(tglob, vglob, kind)) return 0;

    struct stat st;
    if (stat(text, &st) != 0 && corpus_fetch_kjv(text, err, err_cap) != 0) return -1;

    char tmp[PATH_MAX], old[PATH_MAX];
    unsigned k = atomic_fetch_add(&tmp_counter, 1);
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%u", out, (long)getpid(), k) >=
            (int)sizeof tmp ||
        snprintf(old, sizeof old, "%s.old.%ld.%u", out, (long)getpid(), k) >=
            (int)sizeof old) {
        util_set_err(err, err_cap, "data directory path too long: %s", dir);
        return -1;
    }
    shard_prepare_opts o = {
        .tokenizer = kind,
        .input = text,
        .out_dir = tmp,
        .val_fraction = 0.01,
        .progress = progress,
        .progress_user = progress_user,
    };
    shard_prepare_result r;
    if (shard_prepare_corpus(&o, &r, err, err_cap) != 0) {
        remove_flat_dir(tmp);
        return -1;
    }
    /* Swap the new set in; an old, invalid set is moved aside first. */
    int had_old = is_dir(out) && fsio_rename(out, old, NULL, 0) == 0;
    char msg[1024];
    if (fsio_rename(tmp, out, msg, sizeof msg) != 0) {
        remove_flat_dir(tmp);
        if (had_old) remove_flat_dir(old);
        /* Another process may have prepared the same set meanwhile. */
        if (shards_valid(tglob, vglob, kind)) return 0;
        util_set_err(err, err_cap, "%s", msg);
        return -1;
    }
    if (had_old) remove_flat_dir(old);
    (void)fsio_fsync_path(dir, 1, NULL, 0); /* best effort, as for the shards */
    if (prepared) *prepared = 1;
    return 0;
}
