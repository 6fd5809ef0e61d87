/*
 * test_loader.c - tests of orchestrator/engine_loader: the --engine search
 * order, and that every deliberately broken engine (tests/engines/NAME.c, built
 * to <build>/tests/engines/NAME.so next to this binary) and every bad file is
 * rejected with one line naming the file and the reason, leaving the handle
 * untouched. Also context creation and error formatting through the loader.
 */
#include <check.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine_api/orch_engine.h"
#include "orchestrator/core/engine_loader.h"
#include "orchestrator/core/util.h"
#include "tests/test_util.h"

#define DIR_MAX 1024
static char exe_dir[DIR_MAX]; /* <build>/tests */
static char tmp_dir[DIR_MAX]; /* per-test scratch (made in each forked test) */

static void touch(const char *dir, const char *name, const char *content) {
    char p[PATH_MAX * 2];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    ck_assert_ptr_nonnull(f);
    fputs(content, f);
    fclose(f);
}

static void subdir(const char *name, char *out, size_t cap) {
    snprintf(out, cap, "%s/%s", tmp_dir, name);
    ck_assert_int_eq(mkdir(out, 0700), 0);
}

/* ------------------------------------------------------------------------- */
/* engine_resolve                                                             */
/* ------------------------------------------------------------------------- */

START_TEST(test_resolve_path_as_is) {
    char out[PATH_MAX], err[256];
    ck_assert_int_eq(
        engine_resolve("./x/libengine_mock.so", out, sizeof out, err, sizeof err), 0);
    ck_assert_str_eq(out, "./x/libengine_mock.so");
    ck_assert_int_eq(
        engine_resolve("/no/such/engine.so", out, sizeof out, err, sizeof err), 0);
    ck_assert_str_eq(out, "/no/such/engine.so");
    ck_assert_int_eq(engine_resolve("", out, sizeof out, err, sizeof err), -1);
    ck_assert(err[0] != '\0');
    ck_assert_int_eq(engine_resolve(NULL, out, sizeof out, err, sizeof err), -1);
}
END_TEST

START_TEST(test_resolve_env_path_order) {
    test_tmpdir(tmp_dir, sizeof tmp_dir, "loader");
    char a[PATH_MAX], b[PATH_MAX], c[PATH_MAX], env[PATH_MAX * 3 + 8];
    subdir("a", a, sizeof a);
    subdir("b", b, sizeof b);
    subdir("c", c, sizeof c);
    touch(b, "libengine_zzq.so", "x");
    touch(c, "libengine_zzq.so", "x");
    snprintf(env, sizeof env, "%s::%s:%s", a, b, c); /* empty entry tolerated */
    setenv("ORCH_ENGINE_PATH", env, 1);
    char out[PATH_MAX], err[256], want[PATH_MAX * 2];
    ck_assert_int_eq(engine_resolve("zzq", out, sizeof out, err, sizeof err), 0);
    snprintf(want, sizeof want, "%s/libengine_zzq.so", b);
    ck_assert_str_eq(out, want);
    /* A file name is searched as is. */
    touch(c, "libcustom.so", "x");
    ck_assert_int_eq(engine_resolve("libcustom.so", out, sizeof out, err, sizeof err), 0);
    snprintf(want, sizeof want, "%s/libcustom.so", c);
    ck_assert_str_eq(out, want);
    /* Earlier directories win. */
    touch(a, "libengine_zzq.so", "x");
    ck_assert_int_eq(engine_resolve("zzq", out, sizeof out, err, sizeof err), 0);
    snprintf(want, sizeof want, "%s/libengine_zzq.so", a);
    ck_assert_str_eq(out, want);
    test_rmdir(tmp_dir);
}
END_TEST

START_TEST(test_resolve_next_to_binary_then_bare) {
    test_tmpdir(tmp_dir, sizeof tmp_dir, "loader");
    char name[64], out[PATH_MAX], err[256], want[PATH_MAX * 2];
    snprintf(name, sizeof name, "zzresolve%d", (int)getpid());
    char file[128];
    snprintf(file, sizeof file, "libengine_%s.so", name);
    setenv("ORCH_ENGINE_PATH", tmp_dir, 1);
    /* Nowhere: the bare file name, for dlopen's own search. */
    ck_assert_int_eq(engine_resolve(name, out, sizeof out, err, sizeof err), 0);
    ck_assert_str_eq(out, file);
    /* Next to the binary. */
    touch(exe_dir, file, "x");
    ck_assert_int_eq(engine_resolve(name, out, sizeof out, err, sizeof err), 0);
    snprintf(want, sizeof want, "%s/%s", exe_dir, file);
    int ok_next = strcmp(out, want) == 0;
    /* $ORCH_ENGINE_PATH comes first. */
    touch(tmp_dir, file, "x");
    ck_assert_int_eq(engine_resolve(name, out, sizeof out, err, sizeof err), 0);
    char want_env[PATH_MAX * 2];
    snprintf(want_env, sizeof want_env, "%s/%s", tmp_dir, file);
    int ok_env = strcmp(out, want_env) == 0;
    unlink(want);
    test_rmdir(tmp_dir);
    ck_assert_msg(ok_next, "next to binary: expected %s", want);
    ck_assert_msg(ok_env, "env path should win: got %s", out);
}
END_TEST

/* ------------------------------------------------------------------------- */
/* engine_load rejections                                                     */
/* ------------------------------------------------------------------------- */

/* Load `path`, expect failure with one line naming the file and containing
 * each of the NULL-terminated fragments; the handle must be untouched. */
static void expect_reject(const char *path, const char *const *fragments) {
    engine_handle h;
    memset(&h, 0x5A, sizeof h);
    engine_handle copy = h;
    char err[2048] = "";
    int rc = engine_load(path, &h, err, sizeof err);
    ck_assert_msg(rc == -1, "%s was accepted", path);
    ck_assert_msg(memcmp(&h, &copy, sizeof h) == 0, "%s: handle changed on failure",
                  path);
    ck_assert_msg(strchr(err, '\n') == NULL, "%s: message has several lines: %s", path,
                  err);
    ck_assert_msg(strstr(err, path) != NULL, "%s: message does not name the file: %s",
                  path, err);
    for (const char *const *f = fragments; *f; f++)
        ck_assert_msg(strstr(err, *f) != NULL, "%s: message lacks '%s': %s", path, *f,
                      err);
}

static void broken(const char *name, char *out, size_t cap) {
    snprintf(out, cap, "%s/engines/%s.so", exe_dir, name);
    ck_assert_msg(access(out, R_OK) == 0, "%s was not built", out);
}

START_TEST(test_reject_missing_symbol) {
    char p[PATH_MAX];
    broken("no_entry", p, sizeof p);
    expect_reject(
        p, (const char *const[]){ "missing entry symbol orch_engine_get_api", NULL });
}
END_TEST

START_TEST(test_reject_wrong_major) {
    char p[PATH_MAX], want[64];
    broken("wrong_major", p, sizeof p);
    snprintf(want, sizeof want, "orch needs %u.x", ORCH_ENGINE_ABI_MAJOR);
    expect_reject(
        p, (const char *const[]){ "ABI version mismatch", "engine has 2.3", want, NULL });
}
END_TEST

START_TEST(test_reject_short_table) {
    char p[PATH_MAX], want[64];
    broken("short_table", p, sizeof p);
    snprintf(want, sizeof want, "(%zu bytes", offsetof(orch_engine_api, tensor_count));
    expect_reject(p, (const char *const[]){ "function table too short", want, NULL });
}
END_TEST

START_TEST(test_reject_null_member) {
    char p[PATH_MAX];
    broken("null_member", p, sizeof p);
    expect_reject(p,
                  (const char *const[]){ "required member 'tensor_read' is NULL", NULL });
    broken("null_cap_member", p, sizeof p);
    expect_reject(p,
                  (const char *const[]){ "required member 'grads_zero' is NULL", NULL });
    broken("lora_null_member", p, sizeof p);
    expect_reject(
        p, (const char *const[]){ "required member 'adapter_create' is NULL", NULL });
}
END_TEST

START_TEST(test_reject_capability_beyond_table) {
    char p[PATH_MAX], want[64];
    broken("lora_short_table", p, sizeof p);
    snprintf(want, sizeof want, "(%zu bytes, ABI %u.2)",
             offsetof(orch_engine_api, forward_backward_notify), ORCH_ENGINE_ABI_MAJOR);
    expect_reject(p, (const char *const[]){ "member 'adapter_create' is beyond its "
                                            "function table",
                                            want, NULL });
}
END_TEST

START_TEST(test_reject_probe) {
    char p[PATH_MAX];
    broken("probe_fails", p, sizeof p);
    expect_reject(p, (const char *const[]){
                         "cannot run here: no test accelerator on this machine", NULL });
}
END_TEST

START_TEST(test_reject_null_api) {
    char p[PATH_MAX];
    broken("null_api", p, sizeof p);
    expect_reject(p, (const char *const[]){ "returned NULL", NULL });
}
END_TEST

START_TEST(test_reject_bad_files) {
    test_tmpdir(tmp_dir, sizeof tmp_dir, "loader");
    char p[PATH_MAX * 2];
    touch(tmp_dir, "text.so", "this is not a shared library\n");
    snprintf(p, sizeof p, "%s/text.so", tmp_dir);
    expect_reject(p, (const char *const[]){ "not a shared library", NULL });
    touch(tmp_dir, "empty.so", "");
    snprintf(p, sizeof p, "%s/empty.so", tmp_dir);
    expect_reject(p, (const char *const[]){ "not a shared library", NULL });
    /* ELF magic, then garbage: dlopen itself refuses it. */
    touch(tmp_dir, "trunc.so", "\177ELF\002\001\001garbage garbage garbage");
    snprintf(p, sizeof p, "%s/trunc.so", tmp_dir);
    expect_reject(p, (const char *const[]){ "not a loadable shared library", NULL });
    snprintf(p, sizeof p, "%s/absent.so", tmp_dir);
    expect_reject(p, (const char *const[]){ "file not found", NULL });
    /* A directory. */
    snprintf(p, sizeof p, "%s", tmp_dir);
    expect_reject(p, (const char *const[]){ "not a shared library", NULL });
    /* A FIFO: refused at once (this test would hang if the loader waited
     * for a writer), like a directory. */
    snprintf(p, sizeof p, "%s/fifo.so", tmp_dir);
    ck_assert_int_eq(mkfifo(p, 0644), 0);
    expect_reject(p, (const char *const[]){ "not a regular file", NULL });
    /* A bare name found nowhere. */
    setenv("ORCH_ENGINE_PATH", tmp_dir, 1);
    expect_reject("libengine_surely_absent.so",
                  (const char *const[]){ "not found in", NULL });
    test_rmdir(tmp_dir);
}
END_TEST

/* engine.name from a file: only mock, cpu and cuda, unless trusted. */
START_TEST(test_config_name_trust) {
    ck_assert(engine_is_builtin_name("mock") && engine_is_builtin_name("cpu") &&
              engine_is_builtin_name("cuda"));
    ck_assert(!engine_is_builtin_name("CPU") && !engine_is_builtin_name("cpu ") &&
              !engine_is_builtin_name("") && !engine_is_builtin_name(NULL) &&
              !engine_is_builtin_name("libengine_cpu.so") &&
              !engine_is_builtin_name("./cpu"));
    char err[1024];
    ck_assert_int_eq(engine_check_config_name("cpu", "c.json", 0, err, sizeof err), 0);
    ck_assert_int_eq(engine_check_config_name("x.so", "c.json", 0, err, sizeof err), -1);
    ck_assert_str_eq(err, "c.json: config engine.name 'x.so' is a library path; paths "
                          "are only accepted from the command line: pass --engine=x.so, "
                          "or --trust-config-engine");
    ck_assert_int_eq(
        engine_check_config_name("/tmp/e/libx", "R/state.json", 0, err, sizeof err), -1);
    ck_assert(strstr(err, "R/state.json: config engine.name '/tmp/e/libx' is a library "
                          "path") == err);
    ck_assert_int_eq(engine_check_config_name("foo", "c.json", 0, err, sizeof err), -1);
    ck_assert_str_eq(err, "c.json: config engine.name 'foo' is not a built-in engine "
                          "(mock, cpu, cuda); other engines are only accepted from the "
                          "command line: pass --engine=foo, or --trust-config-engine");
    /* Trusted: anything goes (the loader's own checks still apply). */
    ck_assert_int_eq(engine_check_config_name("/tmp/x.so", "c.json", 1, err, sizeof err),
                     0);
    ck_assert_int_eq(engine_check_config_name("foo", NULL, 1, err, sizeof err), 0);
}
END_TEST

START_TEST(test_accept_newer_minor) {
    char p[PATH_MAX];
    broken("newer_minor", p, sizeof p);
    engine_handle h;
    char err[1024] = "";
    ck_assert_msg(engine_load(p, &h, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(h.api->abi_minor, 9);
    ck_assert_str_eq(h.api->name, "newer-minor");
    ck_assert_str_eq(h.path, p);
    ck_assert_str_eq(h.probe_msg, "test engine");
    /* Its context_create fails: the loader reports it in one line. */
    orch_model_desc m = { .struct_size = sizeof m, .arch = ORCH_ARCH_GPT2 };
    orch_engine_ctx *ctx = NULL;
    ck_assert_int_eq(engine_create_context(&h, &m, 1, 1, NULL, &ctx, err, sizeof err),
                     -1);
    ck_assert_ptr_null(ctx);
    ck_assert_msg(strstr(err, "newer-minor") &&
                      strstr(err, "test engine has no contexts"),
                  "%s", err);
    engine_unload(&h);
    ck_assert_ptr_null(h.api);
    engine_unload(&h); /* twice is fine */
    engine_unload(NULL);
}
END_TEST

START_TEST(test_minor_zero_gets_no_llama) {
    char p[PATH_MAX];
    broken("minor_zero", p, sizeof p);
    engine_handle h;
    char err[1024] = "";
    ck_assert_msg(engine_load(p, &h, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(h.api->abi_minor, 0);
    orch_model_desc m = { .struct_size = sizeof m, .arch = ORCH_ARCH_GPT2 };
    orch_engine_ctx *ctx = NULL;
    /* gpt2 reaches the engine (whose stub refuses every context)... */
    ck_assert_int_eq(engine_create_context(&h, &m, 1, 1, NULL, &ctx, err, sizeof err),
                     -1);
    ck_assert_msg(strstr(err, "test engine has no contexts"), "%s", err);
    /* ...llama is refused before it, naming the file and both versions. */
    m.arch = ORCH_ARCH_LLAMA;
    ck_assert_int_eq(engine_create_context(&h, &m, 1, 1, NULL, &ctx, err, sizeof err),
                     -1);
    ck_assert_ptr_null(ctx);
    char want[PATH_MAX + 128];
    snprintf(want, sizeof want,
             "engine '%s': ABI version 1.0 cannot run model.arch llama (llama needs ABI "
             "1.1 or later)",
             p);
    ck_assert_str_eq(err, want);
    engine_unload(&h);
}
END_TEST

/* ------------------------------------------------------------------------- */
/* The mock through the loader                                                */
/* ------------------------------------------------------------------------- */

START_TEST(test_load_mock_by_name) {
    setenv("ORCH_ENGINE_PATH", test_build_dir(), 1);
    engine_handle h;
    char err[1024] = "";
    ck_assert_msg(engine_load("mock", &h, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(h.api->name, "mock");
    ck_assert(strstr(h.path, "libengine_mock.so") != NULL);
    ck_assert_str_eq(h.probe_msg, "mock engine, no numerics");
    orch_model_desc m = test_model_desc(64, 16, 1, 2, 8);
    orch_engine_ctx *ctx = NULL;
    ck_assert_msg(
        engine_create_context(&h, &m, 1, 3, "sleep_ms=0", &ctx, err, sizeof err) == 0,
        "%s", err);
    /* engine_format_error: status text then the engine's last error. */
    uint32_t n;
    int32_t st = h.api->tensor_count(ctx, 42, &n);
    char msg[512];
    engine_format_error(&h, ctx, st, msg, sizeof msg);
    ck_assert_msg(strncmp(msg, "invalid argument: ", 18) == 0 && strstr(msg, "42"), "%s",
                  msg);
    engine_format_error(&h, NULL, ORCH_ERR_DEVICE, msg, sizeof msg);
    ck_assert_str_eq(msg, "device error");
    h.api->context_destroy(ctx);
    /* Bad model and bad options through engine_create_context. */
    m.heads = 3;
    ctx = NULL;
    ck_assert_int_eq(engine_create_context(&h, &m, 1, 3, NULL, &ctx, err, sizeof err),
                     -1);
    ck_assert_ptr_null(ctx);
    ck_assert_msg(strstr(err, "engine mock: cannot create context: invalid argument: ") &&
                      strstr(err, "heads (3) must divide width (8)"),
                  "%s", err);
    m.heads = 2;
    ck_assert_int_eq(
        engine_create_context(&h, &m, 1, 3, "bogus=1", &ctx, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "unknown option 'bogus=1'"), "%s", err);
    engine_unload(&h);
    /* By file name and by path too. */
    ck_assert_msg(engine_load("libengine_mock.so", &h, err, sizeof err) == 0, "%s", err);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s", h.path);
    engine_unload(&h);
    ck_assert_msg(engine_load(path, &h, err, sizeof err) == 0, "%s", err);
    engine_unload(&h);
}
END_TEST

START_TEST(test_caps_string) {
    char buf[256];
    engine_caps_string(0, buf, sizeof buf);
    ck_assert_str_eq(buf, "none");
    engine_caps_string(ORCH_CAP_TRAIN | ORCH_CAP_INFER | ORCH_CAP_KV_COPY |
                           ORCH_CAP_EVAL | ORCH_CAP_DETERMINISTIC | ORCH_CAP_GPU |
                           ORCH_CAP_FAULT_INJECTION,
                       buf, sizeof buf);
    ck_assert_str_eq(buf, "train,infer,kv-copy,eval,deterministic,gpu,fault-injection");
    engine_caps_string(ORCH_CAP_INFER | ORCH_CAP_GPU, buf, sizeof buf);
    ck_assert_str_eq(buf, "infer,gpu");
    engine_caps_string(ORCH_CAP_LORA | ORCH_CAP_COSERVE, buf, sizeof buf);
    ck_assert_str_eq(buf, "lora,coserve");
    char small[8];
    memset(small, 'z', sizeof small);
    engine_caps_string(ORCH_CAP_TRAIN | ORCH_CAP_INFER | ORCH_CAP_EVAL, small, 7);
    ck_assert_int_eq(small[7], 'z');
    ck_assert(memchr(small, '\0', 7) != NULL);
}
END_TEST

int main(void) {
    if (util_exe_dir(exe_dir, sizeof exe_dir) != 0) {
        fprintf(stderr, "test_loader: cannot find my own directory\n");
        return EXIT_FAILURE;
    }
    if (strlen(exe_dir) > DIR_MAX - 64) {
        fprintf(stderr, "test_loader: build directory path too long\n");
        return EXIT_FAILURE;
    }
    Suite *s = suite_create("loader");
    TCase *tc = tcase_create("loader");
    tcase_add_test(tc, test_resolve_path_as_is);
    tcase_add_test(tc, test_resolve_env_path_order);
    tcase_add_test(tc, test_resolve_next_to_binary_then_bare);
    tcase_add_test(tc, test_reject_missing_symbol);
    tcase_add_test(tc, test_reject_wrong_major);
    tcase_add_test(tc, test_reject_short_table);
    tcase_add_test(tc, test_reject_null_member);
    tcase_add_test(tc, test_reject_capability_beyond_table);
    tcase_add_test(tc, test_reject_probe);
    tcase_add_test(tc, test_reject_null_api);
    tcase_add_test(tc, test_reject_bad_files);
    tcase_add_test(tc, test_accept_newer_minor);
    tcase_add_test(tc, test_minor_zero_gets_no_llama);
    tcase_add_test(tc, test_config_name_trust);
    tcase_add_test(tc, test_load_mock_by_name);
    tcase_add_test(tc, test_caps_string);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
