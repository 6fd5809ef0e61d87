/*
 * test_fsio.c - Check suite for orchestrator/core/fsio.{c,h}: mkdir -p over
 * existing directories and over a file in the way, the capped whole-file
 * read (exactly at the cap, one byte over, empty files, embedded NULs,
 * missing files, directories, a FIFO that must not block), atomic writes
 * (content replaced, no temp file left, abort and failed commit leave the
 * target untouched), the small primitives, the directory exchange, appends
 * and removal (rm -rf never follows a symlink, FIFOs are refused without
 * blocking), temp-name parsing, and the fault hook itself: site counting per
 * mode, the fault firing once at the armed site with the call's errno, a
 * short write leaving exactly half, a crash exiting with
 * FSIO_FAULT_CRASH_CODE, and mkdir -p counting only the components it makes.
 * (tests/test_fault_injection.c sweeps the hook over whole operations.)
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "orchestrator/core/fsio.h"
#include "tests/test_util.h"

static char dir[256];
static char err[1024];

static void setup(void) {
    test_tmpdir(dir, sizeof dir, "fsio");
    err[0] = '\0';
}

static void teardown(void) { test_rmdir(dir); }

/* dir/name into a static buffer (one at a time). */
static const char *at(const char *name) {
    static char p[2][512];
    static int k;
    k ^= 1;
    snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
    return p[k];
}

static void put(const char *path, const char *text, size_t n) {
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(text, 1, n, f), n);
    ck_assert_int_eq(fclose(f), 0);
}

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Entries of d other than "." and ".." (only those containing needle when
 * it is not NULL). */
static int count_entries(const char *d, const char *needle) {
    DIR *dp = opendir(d);
    ck_assert_ptr_nonnull(dp);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dp)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (!needle || strstr(e->d_name, needle)) n++;
    }
    closedir(dp);
    return n;
}

static char *slurp(const char *p, size_t *len) {
    char *b = NULL;
    ck_assert_msg(fsio_read_file(p, 1 << 20, &b, len, err, sizeof err) == 0, "%s", err);
    return b;
}

START_TEST(mkdir_p_nested_and_existing) {
    const char *p = at("a/b/c");
    ck_assert_msg(fsio_mkdir_p(p, err, sizeof err) == 0, "%s", err);
    ck_assert(is_dir(p));
    /* Again over the existing tree, with a trailing slash and a "//". */
    ck_assert_int_eq(fsio_mkdir_p(p, err, sizeof err), 0);
    ck_assert_int_eq(fsio_mkdir_p(at("a/b/c/"), err, sizeof err), 0);
    ck_assert_int_eq(fsio_mkdir_p(at("a//b/d"), err, sizeof err), 0);
    ck_assert(is_dir(at("a/b/d")));
    ck_assert_int_eq(fsio_mkdir_p(dir, err, sizeof err), 0);
    ck_assert_int_eq(fsio_mkdir_p("/", err, sizeof err), 0);
    /* Relative paths work from the current directory. */
    char cwd[4096];
    ck_assert_ptr_nonnull(getcwd(cwd, sizeof cwd));
    ck_assert_int_eq(chdir(dir), 0);
    ck_assert_int_eq(fsio_mkdir_p("rel/x", err, sizeof err), 0);
    ck_assert_int_eq(chdir(cwd), 0);
    ck_assert(is_dir(at("rel/x")));
    ck_assert_int_eq(fsio_mkdir_p("", err, sizeof err), -1);
}
END_TEST

START_TEST(mkdir_fresh_only) {
    ck_assert_msg(fsio_mkdir(at("fresh"), err, sizeof err) == 0, "%s", err);
    ck_assert(is_dir(at("fresh")));
    errno = 0;
    ck_assert_int_eq(fsio_mkdir(at("fresh"), err, sizeof err), -1);
    ck_assert_int_eq(errno, EEXIST);
    ck_assert_msg(strstr(err, "fresh: mkdir: file exists") != NULL, "%s", err);
}
END_TEST

START_TEST(mkdir_p_file_in_the_way) {
    put(at("f"), "x", 1);
    errno = 0;
    ck_assert_int_eq(fsio_mkdir_p(at("f/sub/deeper"), err, sizeof err), -1);
    ck_assert_int_eq(errno, ENOTDIR);
    ck_assert_msg(strstr(err, at("f")) && strstr(err, "not a directory"), "%s", err);
    ck_assert_msg(!strstr(err, "sub"), "names the wrong component: %s", err);
    ck_assert_int_eq(fsio_mkdir_p(at("f"), err, sizeof err), -1);
    ck_assert_msg(strstr(err, "exists and is not a directory"), "%s", err);
    /* The file is untouched. */
    size_t n;
    char *b = slurp(at("f"), &n);
    ck_assert_uint_eq(n, 1);
    free(b);
}
END_TEST

START_TEST(read_file_cap_and_contents) {
    char data[100];
    for (int i = 0; i < 100; i++) data[i] = (char)(i % 7); /* includes NULs */
    put(at("d"), data, sizeof data);
    char *out = (char *)0x1;
    size_t len = 12345;
    /* Exactly at the cap is fine. */
    ck_assert_msg(fsio_read_file(at("d"), 100, &out, &len, err, sizeof err) == 0, "%s",
                  err);
    ck_assert_uint_eq(len, 100);
    ck_assert_int_eq(memcmp(out, data, 100), 0);
    ck_assert_int_eq(out[100], '\0');
    free(out);
    /* One byte over is refused, with the cap in the message. */
    out = (char *)0x1;
    len = 7;
    errno = 0;
    ck_assert_int_eq(fsio_read_file(at("d"), 99, &out, &len, err, sizeof err), -1);
    ck_assert_int_eq(errno, EFBIG);
    ck_assert_msg(strstr(err, at("d")) && strstr(err, "larger than 99 bytes"), "%s", err);
    ck_assert_ptr_eq(out, (char *)0x1);
    ck_assert_uint_eq(len, 7);
    /* Empty file; len may be NULL. */
    put(at("empty"), "", 0);
    ck_assert_int_eq(fsio_read_file(at("empty"), 0, &out, NULL, err, sizeof err), 0);
    ck_assert_int_eq(out[0], '\0');
    free(out);
    /* A larger file than the first buffer guess (st_size is the guess). */
    size_t big = 3 << 20;
    char *bb = malloc(big);
    for (size_t i = 0; i < big; i++) bb[i] = (char)('a' + i % 26);
    put(at("big"), bb, big);
    ck_assert_int_eq(fsio_read_file(at("big"), big, &out, &len, err, sizeof err), 0);
    ck_assert_uint_eq(len, big);
    ck_assert_int_eq(memcmp(out, bb, big), 0);
    free(out);
    free(bb);
}
END_TEST

START_TEST(read_file_refuses_non_regular) {
    char *out = NULL;
    /* A missing file says so. */
    errno = 0;
    ck_assert_int_eq(fsio_read_file(at("nope"), 100, &out, NULL, err, sizeof err), -1);
    ck_assert_int_eq(errno, ENOENT);
    ck_assert_msg(strstr(err, at("nope")) && strstr(err, "no such file"), "%s", err);
    ck_assert_ptr_null(out);
    /* A directory. */
    ck_assert_int_eq(fsio_read_file(dir, 100, &out, NULL, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "not a regular file"), "%s", err);
    /* A FIFO without a writer: refused at once (the Check timeout catches a
     * read that blocks). */
    ck_assert_int_eq(mkfifo(at("fifo"), 0600), 0);
    alarm(5);
    ck_assert_int_eq(fsio_read_file(at("fifo"), 100, &out, NULL, err, sizeof err), -1);
    alarm(0);
    ck_assert_msg(strstr(err, at("fifo")) && strstr(err, "not a regular file"), "%s",
                  err);
    ck_assert_ptr_null(out);
}
END_TEST

START_TEST(atomic_write_replaces) {
    const char *t = at("target");
    put(t, "old contents", 12);
    ck_assert_msg(fsio_write_atomic(t, "new", 3, err, sizeof err) == 0, "%s", err);
    size_t n;
    char *b = slurp(t, &n);
    ck_assert_uint_eq(n, 3);
    ck_assert_str_eq(b, "new");
    free(b);
    ck_assert_int_eq(count_entries(dir, NULL), 1);
    /* A new file, written in pieces through the stream and the writer. */
    fsio_atomic_file f;
    ck_assert_int_eq(fsio_atomic_open(&f, at("pieces"), err, sizeof err), 0);
    ck_assert_int_eq(count_entries(dir, ".tmp."), 1); /* the temp file beside it */
    ck_assert_int_eq(access(at("pieces"), F_OK), -1);
    fprintf(f.fp, "%d-", 42);
    ck_assert_int_eq(fsio_atomic_write(&f, "xyz", 3, err, sizeof err), 0);
    ck_assert_int_eq(fsio_atomic_write(&f, NULL, 0, err, sizeof err), 0);
    ck_assert_msg(fsio_atomic_commit(&f, err, sizeof err) == 0, "%s", err);
    b = slurp(at("pieces"), &n);
    ck_assert_str_eq(b, "42-xyz");
    free(b);
    ck_assert_int_eq(count_entries(dir, ".tmp"), 0);
    ck_assert_int_eq(count_entries(dir, NULL), 2);
    fsio_atomic_abort(&f); /* after a commit: a no-op */
    ck_assert_int_eq(access(at("pieces"), F_OK), 0);
}
END_TEST

START_TEST(atomic_abort_and_failures_leave_target) {
    const char *t = at("target");
    put(t, "keep me", 7);
    fsio_atomic_file f;
    ck_assert_int_eq(fsio_atomic_open(&f, t, err, sizeof err), 0);
    fputs("half written", f.fp);
    fsio_atomic_abort(&f);
    fsio_atomic_abort(&f); /* twice is fine */
    size_t n;
    char *b = slurp(t, &n);
    ck_assert_str_eq(b, "keep me");
    free(b);
    ck_assert_int_eq(count_entries(dir, NULL), 1);
    /* Opening in a missing directory fails and creates nothing. */
    ck_assert_int_eq(fsio_atomic_open(&f, at("no/dir/x"), err, sizeof err), -1);
    ck_assert_msg(strstr(err, "no such file"), "%s", err);
    fsio_atomic_abort(&f); /* safe after a failed open */
    ck_assert_int_eq(fsio_write_atomic(at("no/dir/x"), "a", 1, err, sizeof err), -1);
    ck_assert_int_eq(count_entries(dir, NULL), 1);
    /* A commit that cannot rename (the target is a non-empty directory)
     * removes the temp file and leaves the directory alone. */
    ck_assert_int_eq(mkdir(at("isdir"), 0755), 0);
    put(at("isdir/inside"), "i", 1);
    ck_assert_int_eq(fsio_write_atomic(at("isdir"), "zz", 2, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "rename"), "%s", err);
    ck_assert(is_dir(at("isdir")));
    ck_assert_int_eq(count_entries(dir, ".tmp"), 0);
    ck_assert_int_eq(count_entries(at("isdir"), NULL), 1);
}
END_TEST

START_TEST(primitives) {
    char p[512];
    snprintf(p, sizeof p, "%s", at("plain"));
    ck_assert_int_eq(fsio_write_file(p, "abc", 3, err, sizeof err), 0);
    ck_assert_int_eq(fsio_write_file(p, "de", 2, err, sizeof err), 0); /* truncates */
    size_t n;
    char *b = slurp(p, &n);
    ck_assert_str_eq(b, "de");
    free(b);
    ck_assert_int_eq(fsio_fsync_path(p, 0, err, sizeof err), 0);
    ck_assert_int_eq(fsio_fsync_path(dir, 1, err, sizeof err), 0);
    ck_assert_int_eq(fsio_fsync_parent(p, err, sizeof err), 0);
    ck_assert_int_eq(fsio_fsync_parent("bare-name", err, sizeof err), 0); /* "." */
    ck_assert_int_eq(fsio_fsync_path(at("missing"), 0, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "missing") && strstr(err, "no such file"), "%s", err);
    ck_assert_int_eq(fsio_rename(p, at("moved"), err, sizeof err), 0);
    ck_assert_int_eq(access(at("moved"), F_OK), 0);
    ck_assert_int_eq(fsio_rename(p, at("moved2"), err, sizeof err), -1);
    ck_assert_msg(strstr(err, p) && strstr(err, "moved2"), "%s", err);
    int fd = open(at("w"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(fsio_write_all(fd, "hello", 5, at("w"), err, sizeof err), 0);
    close(fd);
    b = slurp(at("w"), &n);
    ck_assert_str_eq(b, "hello");
    free(b);
    ck_assert_int_eq(fsio_write_file(at("no/such/dir"), "x", 1, err, sizeof err), -1);
    /* Trailing slashes name the same directory: its parent is fsynced. */
    ck_assert_int_eq(fsio_fsync_parent(at("sub/"), err, sizeof err), 0);
    ck_assert_int_eq(fsio_fsync_parent("/", err, sizeof err), 0);
}
END_TEST

START_TEST(exchange_swaps_directories) {
    ck_assert_int_eq(mkdir(at("new"), 0755), 0);
    ck_assert_int_eq(mkdir(at("old"), 0755), 0);
    put(at("new/f"), "new", 3);
    put(at("old/f"), "old", 3);
    if (fsio_exchange(at("new"), at("old"), err, sizeof err) != 0) {
        /* Only file systems without RENAME_EXCHANGE may refuse. */
        ck_assert_msg(errno == EINVAL || errno == ENOSYS, "%s", err);
        ck_assert_msg(strstr(err, "exchange with"), "%s", err);
        return;
    }
    size_t n;
    char *b = slurp(at("old/f"), &n);
    ck_assert_str_eq(b, "new");
    free(b);
    b = slurp(at("new/f"), &n);
    ck_assert_str_eq(b, "old");
    free(b);
    ck_assert_int_eq(fsio_exchange(at("new"), at("missing"), err, sizeof err), -1);
    ck_assert_msg(strstr(err, "no such file"), "%s", err);
}
END_TEST

START_TEST(fault_hook_counts_and_fires) {
    const char *p = at("f");
    /* Counting: create, write, fsync, close. */
    fsio_fault_arm(0, EIO, FSIO_FAULT_FAIL);
    ck_assert_int_eq(fsio_write_file(p, "abcdef", 6, err, sizeof err), 0);
    ck_assert_uint_eq(fsio_fault_sites(), 4);
    ck_assert_int_eq(fsio_fault_fired(NULL, NULL, 0), 0);
    /* Site 2 (the write) fails with the armed errno and nothing else. */
    fsio_fault_arm(2, ENOSPC, FSIO_FAULT_FAIL);
    errno = 0;
    ck_assert_int_eq(fsio_write_file(p, "xyz", 3, err, sizeof err), -1);
    ck_assert_int_eq(errno, ENOSPC);
    char want[600];
    snprintf(want, sizeof want, "%s: write: no space left on device", p);
    ck_assert_str_eq(err, want);
    fsio_op op;
    char fp[512];
    ck_assert_int_eq(fsio_fault_fired(&op, fp, sizeof fp), 1);
    ck_assert_int_eq(op, FSIO_OP_WRITE);
    ck_assert_str_eq(fp, p);
    ck_assert_str_eq(fsio_op_name(op), "write");
    /* It fires once: the same call works again while still armed. */
    ck_assert_int_eq(fsio_write_file(p, "xyz", 3, err, sizeof err), 0);
    ck_assert_uint_eq(fsio_fault_sites(), 6); /* 2 + create, write, fsync, close */
    /* FSYNC counts only fsyncs: an atomic write has two (file, directory). */
    fsio_fault_arm(0, EIO, FSIO_FAULT_FSYNC);
    ck_assert_int_eq(fsio_write_atomic(p, "new", 3, err, sizeof err), 0);
    ck_assert_uint_eq(fsio_fault_sites(), 2);
    fsio_fault_arm(1, EIO, FSIO_FAULT_FSYNC);
    ck_assert_int_eq(fsio_write_atomic(p, "lost", 4, err, sizeof err), -1);
    ck_assert_msg(strstr(err, ": fsync: input/output error"), "%s", err);
    size_t n;
    char *b = slurp(p, &n);
    ck_assert_str_eq(b, "new"); /* the target is untouched */
    free(b);
    ck_assert_int_eq(count_entries(dir, ".tmp."), 0);
    /* SHORT counts only writes; the k-th writes half, then fails. */
    fsio_fault_arm(1, ENOSPC, FSIO_FAULT_SHORT);
    ck_assert_int_eq(fsio_write_file(p, "abcdef", 6, err, sizeof err), -1);
    ck_assert_int_eq(errno, ENOSPC);
    fsio_fault_disarm();
    b = slurp(p, &n);
    ck_assert_str_eq(b, "abc");
    free(b);
    /* Disarmed: nothing fails and nothing is counted (what the last armed
     * run saw stays readable until the next arm). */
    ck_assert_int_eq(fsio_write_file(p, "ok", 2, err, sizeof err), 0);
    ck_assert_uint_eq(fsio_fault_sites(), 1);
    ck_assert_int_eq(fsio_fault_fired(&op, NULL, 0), 1);
    ck_assert_int_eq(op, FSIO_OP_WRITE);
    fsio_fault_arm(0, EIO, FSIO_FAULT_FAIL);
    ck_assert_int_eq(fsio_fault_fired(NULL, NULL, 0), 0);
    fsio_fault_disarm();
}
END_TEST

START_TEST(fault_hook_every_kind_of_call) {
    struct {
        fsio_op op;
        const char *what;
    } seen[16];
    int ns = 0;
    /* Each site of an atomic write, in order, fails the write with a
     * message naming the target and leaves no temp file. */
    const char *t = at("t");
    put(t, "old", 3);
    fsio_fault_arm(0, EIO, FSIO_FAULT_FAIL);
    ck_assert_int_eq(fsio_write_atomic(t, "new", 3, err, sizeof err), 0);
    uint64_t sites = fsio_fault_sites();
    ck_assert_uint_eq(sites, 7); /* create write flush fsync close rename fsync-dir */
    for (uint64_t k = 1; k <= sites; k++) {
        put(t, "old", 3);
        fsio_fault_arm(k, EIO, FSIO_FAULT_FAIL);
        ck_assert_int_eq(fsio_write_atomic(t, "new", 3, err, sizeof err), -1);
        /* The message names the target (its directory for the last fsync). */
        ck_assert_msg(strstr(err, k == sites ? dir : t), "%s", err);
        char fp[512];
        ck_assert(fsio_fault_fired(&seen[ns].op, fp, sizeof fp));
        seen[ns++].what = NULL;
        fsio_fault_disarm();
        size_t n;
        char *b = slurp(t, &n);
        /* Only the last site (the directory fsync) comes after the rename. */
        ck_assert_str_eq(b, k == sites ? "new" : "old");
        free(b);
        ck_assert_int_eq(count_entries(dir, ".tmp."), 0);
    }
    static const fsio_op order[7] = { FSIO_OP_CREATE, FSIO_OP_WRITE, FSIO_OP_WRITE,
                                      FSIO_OP_FSYNC,  FSIO_OP_CLOSE, FSIO_OP_RENAME,
                                      FSIO_OP_FSYNC };
    for (int i = 0; i < 7; i++) ck_assert_int_eq(seen[i].op, order[i]);
    /* mkdir, opendir, remove, exchange. */
    fsio_fault_arm(1, EIO, FSIO_FAULT_FAIL);
    ck_assert_int_eq(fsio_mkdir(at("d"), err, sizeof err), -1);
    ck_assert(!is_dir(at("d")));
    ck_assert_int_eq(fsio_mkdir(at("d"), err, sizeof err), 0);
    fsio_fault_arm(1, EIO, FSIO_FAULT_FAIL);
    ck_assert_ptr_null(fsio_opendir(at("d"), err, sizeof err));
    ck_assert_msg(strstr(err, "d: open directory: input/output error"), "%s", err);
    fsio_fault_arm(1, EIO, FSIO_FAULT_FAIL);
    ck_assert_int_eq(fsio_unlink(t, err, sizeof err), -1);
    ck_assert_int_eq(access(t, F_OK), 0);
    ck_assert_int_eq(mkdir(at("e"), 0755), 0);
    fsio_fault_arm(1, EIO, FSIO_FAULT_FAIL);
    ck_assert_int_eq(fsio_exchange(at("d"), at("e"), err, sizeof err), -1);
    ck_assert_int_eq(errno, EIO); /* not EINVAL: callers must not fall back */
    fsio_fault_disarm();
}
END_TEST

START_TEST(fault_hook_crash) {
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        fsio_fault_arm(2, 0, FSIO_FAULT_CRASH);
        (void)fsio_mkdir(at("one"), NULL, 0);
        (void)fsio_mkdir(at("two"), NULL, 0); /* replaced by _exit */
        _exit(0);
    }
    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert(WIFEXITED(st));
    ck_assert_int_eq(WEXITSTATUS(st), FSIO_FAULT_CRASH_CODE);
    ck_assert(is_dir(at("one")));
    ck_assert(!is_dir(at("two")));
}
END_TEST

START_TEST(mkdir_p_counts_only_missing) {
    ck_assert_int_eq(mkdir(at("a"), 0755), 0);
    fsio_fault_arm(0, EIO, FSIO_FAULT_FAIL);
    ck_assert_int_eq(fsio_mkdir_p(at("a/b/c"), err, sizeof err), 0);
    ck_assert_uint_eq(fsio_fault_sites(), 2);
    fsio_fault_arm(0, EIO, FSIO_FAULT_FAIL);
    ck_assert_int_eq(fsio_mkdir_p(at("a/b/c"), err, sizeof err), 0);
    ck_assert_uint_eq(fsio_fault_sites(), 0);
    fsio_fault_arm(2, ENOSPC, FSIO_FAULT_FAIL);
    ck_assert_int_eq(fsio_mkdir_p(at("a/x/y/z"), err, sizeof err), -1);
    fsio_fault_disarm();
    ck_assert_msg(strstr(err, "a/x/y: mkdir: no space left on device"), "%s", err);
    ck_assert(is_dir(at("a/x")));
}
END_TEST

START_TEST(rm_rf_never_follows_symlinks) {
    ck_assert_int_eq(mkdir(at("keep"), 0755), 0);
    put(at("keep/file"), "k", 1);
    ck_assert_int_eq(mkdir(at("t"), 0755), 0);
    ck_assert_int_eq(mkdir(at("t/sub"), 0755), 0);
    put(at("t/sub/f"), "x", 1);
    put(at("t/g"), "y", 1);
    ck_assert_int_eq(symlink(at("keep"), at("t/link-dir")), 0);
    ck_assert_int_eq(symlink(at("keep/file"), at("t/sub/link-file")), 0);
    ck_assert_int_eq(mkfifo(at("t/fifo"), 0644), 0);
    ck_assert_msg(fsio_rm_rf(at("t"), err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(access(at("t"), F_OK), -1);
    ck_assert_int_eq(count_entries(at("keep"), NULL), 1);
    ck_assert_int_eq(fsio_rm_rf(at("t"), err, sizeof err), 0); /* missing: fine */
    /* A symlink given itself is removed, not its target. */
    ck_assert_int_eq(symlink(at("keep"), at("l")), 0);
    ck_assert_int_eq(fsio_rm_rf(at("l"), err, sizeof err), 0);
    ck_assert_int_eq(count_entries(at("keep"), NULL), 1);
    /* A failure is reported, naming the path; the rest is still removed. */
    ck_assert_int_eq(mkdir(at("u"), 0755), 0);
    put(at("u/a"), "a", 1);
    put(at("u/b"), "b", 1);
    fsio_fault_arm(2, EIO, FSIO_FAULT_FAIL); /* site 1 opens u */
    ck_assert_int_eq(fsio_rm_rf(at("u"), err, sizeof err), -1);
    fsio_fault_disarm();
    ck_assert_msg(strstr(err, at("u/")) && strstr(err, ": remove: input/output error"),
                  "%s", err);
    ck_assert_int_eq(count_entries(at("u"), NULL), 1);
    ck_assert_int_eq(fsio_unlink(at("nope"), err, sizeof err), -1);
    ck_assert_msg(strstr(err, "nope: remove: no such file"), "%s", err);
}
END_TEST

START_TEST(tmp_names) {
    long pid = 0;
    ck_assert_int_eq(fsio_tmp_name_pid("config.json.tmp.1234.7", &pid), 1);
    ck_assert_int_eq(pid, 1234);
    ck_assert_int_eq(fsio_tmp_name_pid("train_000.bin.tmp.99.0", &pid), 1);
    ck_assert_int_eq(pid, 99);
    static const char *const no[] = {
        "config.json",         "x.tmp.12",         "x.tmp..3",     ".tmp.5.6",
        "x.tmp.0.1",           "x.tmp.a.1",        "x.tmp.1.",     "x.tmpl.1.2",
        "x.tmp.99999999999.1", ".latest.tmp-1234", "ckpt-00000001"
    };
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
        ck_assert_msg(fsio_tmp_name_pid(no[i], &pid) == 0, "%s", no[i]);
    /* The names fsio_atomic_open makes parse, with this process's id. */
    fsio_atomic_file f;
    ck_assert_int_eq(fsio_atomic_open(&f, at("x"), err, sizeof err), 0);
    const char *base = strrchr(f.tmp_path, '/') + 1;
    ck_assert_int_eq(fsio_tmp_name_pid(base, &pid), 1);
    ck_assert_int_eq(pid, (long)getpid());
    fsio_atomic_abort(&f);
}
END_TEST

START_TEST(append_and_non_regular_files) {
    const char *p = at("log");
    int fd = fsio_open_append(p, 1, err, sizeof err);
    ck_assert_msg(fd >= 0, "%s", err);
    ck_assert_int_eq(fsio_write_all(fd, "one\n", 4, p, err, sizeof err), 0);
    close(fd);
    fd = fsio_open_append(p, 0, err, sizeof err);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(fsio_write_all(fd, "two\n", 4, p, err, sizeof err), 0);
    ck_assert_int_eq(fcntl(fd, F_GETFL) & (O_APPEND | O_NONBLOCK), O_APPEND);
    close(fd);
    size_t n;
    char *b = slurp(p, &n);
    ck_assert_str_eq(b, "one\ntwo\n");
    free(b);
    fd = fsio_open_append(p, 1, err, sizeof err); /* truncate */
    close(fd);
    b = slurp(p, &n);
    ck_assert_uint_eq(n, 0);
    free(b);
    /* A FIFO (which would block an open for writing) and a device are
     * refused at once. */
    ck_assert_int_eq(mkfifo(at("fifo"), 0644), 0);
    ck_assert_int_eq(fsio_open_append(at("fifo"), 0, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "fifo: not a regular file"), "%s", err);
    ck_assert_int_eq(fsio_write_file(at("fifo"), "x", 1, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "fifo: not a regular file"), "%s", err);
    ck_assert_int_eq(fsio_open_append("/dev/null", 0, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "/dev/null: not a regular file"), "%s", err);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("fsio");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 20);
    tcase_add_test(tc, mkdir_p_nested_and_existing);
    tcase_add_test(tc, mkdir_fresh_only);
    tcase_add_test(tc, mkdir_p_file_in_the_way);
    tcase_add_test(tc, read_file_cap_and_contents);
    tcase_add_test(tc, read_file_refuses_non_regular);
    tcase_add_test(tc, atomic_write_replaces);
    tcase_add_test(tc, atomic_abort_and_failures_leave_target);
    tcase_add_test(tc, primitives);
    tcase_add_test(tc, exchange_swaps_directories);
    tcase_add_test(tc, fault_hook_counts_and_fires);
    tcase_add_test(tc, fault_hook_every_kind_of_call);
    tcase_add_test(tc, fault_hook_crash);
    tcase_add_test(tc, mkdir_p_counts_only_missing);
    tcase_add_test(tc, rm_rf_never_follows_symlinks);
    tcase_add_test(tc, tmp_names);
    tcase_add_test(tc, append_and_non_regular_files);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return test_run_suite(suite()); }
