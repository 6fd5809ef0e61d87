/*
 * test_util.h - what every Check suite of orch needs once: the main that runs
 * a suite, the build directory and engine search path, a model-description
 * builder, and temporary directories that are removed again.
 *
 * Header-only (static functions) so each suite stays one .c file linked
 * against the orchestrator objects.
 * Threads: call from the test process's main thread or a Check test body.
 * Memory: returned strings point into static buffers of this file.
 * Errors: failures abort the current Check test with a message.
 */
#ifndef ORCH_TEST_UTIL_H
#define ORCH_TEST_UTIL_H

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_api/orch_engine.h"
#include "orchestrator/core/util.h"

/* The build directory: $ORCH_BUILD, else the directory above this test
 * binary (build/tests/test_x -> build), else "build". */
static inline const char *test_build_dir(void) {
    static char dir[4096];
    const char *b = getenv("ORCH_BUILD");
    if (b && *b)
        snprintf(dir, sizeof dir, "%s", b);
    else if (util_exe_dir(dir, sizeof dir - 4) == 0)
        strcat(dir, "/..");
    else
        snprintf(dir, sizeof dir, "build");
    return dir;
}

/* Point $ORCH_ENGINE_PATH at the build directory unless it is set, so that
 * engine_load("mock") works when a suite is run by hand. */
static inline void test_default_engine_path(void) {
    if (!getenv("ORCH_ENGINE_PATH")) setenv("ORCH_ENGINE_PATH", test_build_dir(), 1);
}

/* A GPT-2 model description with the given shape (mlp_width 4*width,
 * layernorm_eps 1e-5, kv_heads = heads). */
static inline orch_model_desc test_model_desc(uint32_t vocab, uint32_t context,
                                              uint32_t layers, uint32_t heads,
                                              uint32_t width) {
    orch_model_desc d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.arch = ORCH_ARCH_GPT2;
    d.vocab_size = vocab;
    d.context = context;
    d.layers = layers;
    d.heads = heads;
    d.width = width;
    d.mlp_width = 4 * width;
    d.layernorm_eps = 1e-5f;
    return d;
}

/* Make a fresh directory /tmp/orch_<tag>_XXXXXX into buf (cap >= 64). */
static inline void test_tmpdir(char *buf, size_t cap, const char *tag) {
    snprintf(buf, cap, "/tmp/orch_%s_XXXXXX", tag);
    ck_assert_msg(mkdtemp(buf) != NULL, "mkdtemp %s failed", buf);
}

/* rm -rf a directory made by test_tmpdir (refuses anything else). */
static inline void test_rmdir(const char *dir) {
    ck_assert_msg(strncmp(dir, "/tmp/orch_", 10) == 0 && !strchr(dir, '\''),
                  "refusing to remove %s", dir);
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

/* Run a suite and turn its result into the process exit status. */
static inline int test_run_suite(Suite *s) {
    test_default_engine_path();
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

#endif
