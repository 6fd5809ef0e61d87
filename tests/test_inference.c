/*
 * test_inference.c - Check suite for orchestrator/infer/ (generate, inference_model): the
 * one-sequence decoding session through the mock engine (its README rule,
 * chunked prefill, the context limit, bad ids, an engine fault poisoning the
 * session until reset) and inference_model_open (a checkpoint resolved,
 * config read from state.json, engine, weights and tokenizer opened; every
 * failure leaves nothing held).
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "orchestrator/core/engine_loader.h"
#include "orchestrator/infer/generate.h"
#include "orchestrator/infer/inference_model.h"
#include "orchestrator/store/checkpoint.h"
#include "tests/test_util.h"

static char dir[256];
static engine_handle mock;

static void setup(void) {
    test_tmpdir(dir, sizeof dir, "infer");
    char err[512];
    if (engine_load("mock", &mock, err, sizeof err) != 0)
        ck_abort_msg("cannot load the mock engine: %s", err);
}

static void teardown(void) {
    engine_unload(&mock);
    test_rmdir(dir);
}

static orch_engine_ctx *mk(const engine_handle *h, uint32_t width, uint32_t layers,
                           uint64_t seed, const char *opts) {
    orch_model_desc d = test_model_desc(256, 32, layers, 2, width);
    orch_engine_ctx *c = NULL;
    char err[512];
    if (engine_create_context(h, &d, 1, seed, opts, &c, err, sizeof err) != 0)
        ck_abort_msg("create: %s", err);
    return c;
}

/* ---- generate session ---------------------------------------------------- */

START_TEST(generate_session_mock_rule) {
    orch_engine_ctx *a = mk(&mock, 8, 1, 1, NULL);
    generate_session *s = NULL;
    char err[512];
    ck_assert_int_eq(generate_session_create(&mock, a, 256, 32, 3, &s, err, sizeof err),
                     0);
    ck_assert_ptr_null(generate_logits(s));
    /* "ab" -> 'n', then 't' (README example); prefill in chunks of 3. */
    int32_t prompt[7] = { 'x', 'y', 'z', 'w', 'v', 'a', 'b' };
    int32_t sum = 0;
    for (int i = 0; i < 7; i++) sum += prompt[i];
    ck_assert_int_eq(generate_feed(s, prompt, 7, err, sizeof err), 0);
    ck_assert_uint_eq(generate_position(s), 7);
    const float *lg = generate_logits(s);
    int best = 0;
    for (int v = 1; v < 256; v++)
        if (lg[v] > lg[best]) best = v;
    ck_assert_int_eq(best, 97 + sum % 26);
    for (int k = 0; k < 25; k++) {
        int32_t t = best;
        sum += t;
        ck_assert_int_eq(generate_feed(s, &t, 1, err, sizeof err), 0);
        lg = generate_logits(s);
        best = 0;
        for (int v = 1; v < 256; v++)
            if (lg[v] > lg[best]) best = v;
        ck_assert_int_eq(best, 97 + sum % 26);
    }
    ck_assert_uint_eq(generate_position(s), 32);
    int32_t t = 'a';
    ck_assert_int_eq(generate_feed(s, &t, 1, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "context"));
    generate_reset(s);
    t = 300;
    ck_assert_int_eq(generate_feed(s, &t, 1, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "outside the vocabulary"));
    int32_t ab[2] = { 'a', 'b' };
    ck_assert_int_eq(generate_feed(s, ab, 2, err, sizeof err), 0);
    lg = generate_logits(s);
    ck_assert(lg['n'] > lg['m'] && lg['n'] > lg['o']);
    generate_session_free(s);
    generate_session_free(NULL);
    mock.api->context_destroy(a);
    /* An engine failure is reported and poisons the session until reset. */
    a = mk(&mock, 8, 1, 1, "fault=infer_forward:2");
    ck_assert_int_eq(generate_session_create(&mock, a, 256, 32, 0, &s, err, sizeof err),
                     0);
    ck_assert_int_eq(generate_feed(s, ab, 2, err, sizeof err), 0);
    ck_assert_int_eq(generate_feed(s, ab, 1, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "injected fault"));
    ck_assert_int_eq(generate_feed(s, ab, 1, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "reset"));
    generate_reset(s);
    ck_assert_int_eq(generate_feed(s, ab, 2, err, sizeof err), 0);
    generate_session_free(s);
    mock.api->context_destroy(a);
}
END_TEST

/* ---- inference_model_open ------------------------------------------------ */

/* state.json of a run whose config describes a width-`width` model on the
 * engine named `engine`. */
static void state_json_engine(char *buf, size_t cap, uint32_t width, const char *engine) {
    snprintf(buf, cap,
             "{\"format\": 1, \"step\": 4, \"tokenizer\": \"byte\", \"config\": {"
             "\"model\": {\"vocab_size\": 256, \"context\": 32, \"layers\": 1, "
             "\"heads\": 2, \"width\": %u}, \"train\": {\"micro_batch\": 1, "
             "\"seq_len\": 8, \"max_steps\": 4, \"lr\": 0.01, \"seed\": 5}, "
             "\"data\": {\"tokenizer\": \"byte\", \"train\": \"/nowhere/t_*.bin\", "
             "\"val\": \"/nowhere/v_*.bin\"}, \"engine\": {\"name\": \"%s\", "
             "\"threads\": 1}}}",
             width, engine);
}

/* ... on the mock. */
static void state_json(char *buf, size_t cap, uint32_t width) {
    state_json_engine(buf, cap, width, "mock");
}

/* Save ctx as step 4 of RUN with a config of the given width. */
static void save_run(const char *run, orch_engine_ctx *c, uint32_t width) {
    char state[1024], err[1024];
    state_json(state, sizeof state, width);
    ckpt_save_opts o = ckpt_save_opts_default();
    if (ckpt_save(run, 4, &mock, c, state, &o, NULL, 0, err, sizeof err) != 0)
        ck_abort_msg("save: %s", err);
}

/* PARAM tensor 0 of a and b, bit for bit. */
static int first_tensor_same(const engine_handle *ha, orch_engine_ctx *a,
                             const engine_handle *hb, orch_engine_ctx *b) {
    orch_tensor_info ia = { .struct_size = sizeof ia };
    ck_assert_int_eq(ha->api->tensor_info(a, ORCH_TENSOR_PARAM, 0, &ia), ORCH_OK);
    float *x = malloc(ia.numel * 4), *y = malloc(ia.numel * 4);
    ck_assert_int_eq(ha->api->tensor_read(a, ORCH_TENSOR_PARAM, 0, x, ia.numel * 4),
                     ORCH_OK);
    ck_assert_int_eq(hb->api->tensor_read(b, ORCH_TENSOR_PARAM, 0, y, ia.numel * 4),
                     ORCH_OK);
    int same = memcmp(x, y, ia.numel * 4) == 0;
    free(x);
    free(y);
    return same;
}

START_TEST(model_open_from_a_run) {
    char run[512], err[1024], warn[1024];
    snprintf(run, sizeof run, "%s/run", dir);
    orch_engine_ctx *a = mk(&mock, 8, 1, 42, NULL);
    save_run(run, a, 8);
    /* Engine, threads and options from the config; tokenizer opened. */
    inference_model m;
    inference_model_opts mo = { run, NULL, -1, NULL, 1 };
    ck_assert_msg(inference_model_open(&mo, &m, warn, sizeof warn, err, sizeof err) == 0,
                  "%s", err);
    ck_assert_str_eq(warn, "");
    ck_assert_ptr_nonnull(strstr(m.ckpt_dir, "/run/ckpt-00000004"));
    ck_assert_uint_eq(m.step, 4);
    ck_assert_str_eq(m.engine.api->name, "mock");
    ck_assert_uint_eq(m.desc.width, 8);
    ck_assert_uint_eq(m.desc.mlp_width, 32);
    ck_assert_uint_eq(m.cfg->train.seed, 5);
    ck_assert_ptr_nonnull(m.tok);
    ck_assert_uint_eq(tokenizer_vocab_size(m.tok), 256);
    /* The weights are the saved ones (not the seed's). */
    ck_assert(first_tensor_same(&mock, a, &m.engine, m.ctx));
    /* And the model decodes: the mock's rule through a session on it. */
    generate_session *s = NULL;
    ck_assert_int_eq(generate_session_create(&m.engine, m.ctx, m.desc.vocab_size,
                                             m.desc.context, 0, &s, err, sizeof err),
                     0);
    int32_t ab[2] = { 'a', 'b' };
    ck_assert_int_eq(generate_feed(s, ab, 2, err, sizeof err), 0);
    const float *lg = generate_logits(s);
    ck_assert(lg['n'] > lg['m'] && lg['n'] > lg['o']);
    generate_session_free(s);
    inference_model_close(&m);
    ck_assert_ptr_null(m.cfg);
    inference_model_close(&m); /* twice is fine */
    /* Without the tokenizer; the checkpoint directory itself. */
    char ck[600];
    snprintf(ck, sizeof ck, "%s/ckpt-00000004", run);
    inference_model_opts mo2 = { ck, "mock", 1, "", 0 };
    ck_assert_int_eq(inference_model_open(&mo2, &m, warn, sizeof warn, err, sizeof err),
                     0);
    ck_assert_ptr_null(m.tok);
    ck_assert_str_eq(m.ckpt_dir, ck);
    inference_model_close(&m);
    /* A broken `latest` falls back with a warning. */
    char p[700];
    snprintf(p, sizeof p, "%s/latest", run);
    FILE *fp = fopen(p, "w");
    fputs("ckpt-00000099\n", fp);
    fclose(fp);
    ck_assert_int_eq(inference_model_open(&mo, &m, warn, sizeof warn, err, sizeof err),
                     0);
    ck_assert_ptr_nonnull(strstr(warn, "ckpt-00000099"));
    inference_model_close(&m);
    mock.api->context_destroy(a);
}
END_TEST

START_TEST(model_open_failures_hold_nothing) {
    char run[512], err[1024], warn[1024];
    inference_model m;
    /* No such checkpoint. */
    snprintf(run, sizeof run, "%s/none", dir);
    inference_model_opts mo = { run, NULL, -1, NULL, 1 };
    ck_assert_int_eq(inference_model_open(&mo, &m, warn, sizeof warn, err, sizeof err),
                     -1);
    ck_assert_msg(strstr(err, run) != NULL, "%s", err);
    ck_assert_ptr_null(m.cfg);
    ck_assert_ptr_null(m.ctx);
    inference_model_close(&m);
    /* An unknown engine. */
    snprintf(run, sizeof run, "%s/run", dir);
    orch_engine_ctx *a = mk(&mock, 8, 1, 1, NULL);
    save_run(run, a, 8);
    inference_model_opts bad_engine = { run, "nosuch-engine", -1, NULL, 1 };
    ck_assert_int_eq(
        inference_model_open(&bad_engine, &m, warn, sizeof warn, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "nosuch-engine") != NULL, "%s", err);
    ck_assert_ptr_null(m.cfg);
    ck_assert_ptr_null(m.engine.api);
    /* The config does not match the weights (width 16 vs 8). */
    char run2[600];
    snprintf(run2, sizeof run2, "%s/run2", dir);
    save_run(run2, a, 16);
    inference_model_opts mismatch = { run2, NULL, -1, NULL, 1 };
    ck_assert_int_eq(
        inference_model_open(&mismatch, &m, warn, sizeof warn, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "shape") && strstr(err, "wte.weight"), "%s", err);
    ck_assert_ptr_null(m.ctx);
    /* A checkpoint without a run config (e.g. bare weights). */
    char bare[600];
    snprintf(bare, sizeof bare, "%s/bare", dir);
    float v[4] = { 0 };
    ckpt_tensor t = { "x", 0, 1, { 4 }, v };
    ck_assert_int_eq(ckpt_write_dir(bare, &t, 1, "{\"format\": 1}", 0, err, sizeof err),
                     0);
    inference_model_opts noconf = { bare, "mock", -1, NULL, 0 };
    ck_assert_int_eq(
        inference_model_open(&noconf, &m, warn, sizeof warn, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "state.json: no \"config\" object"), "%s", err);
    mock.api->context_destroy(a);
}
END_TEST

/* A checkpoint naming a library: not opened unless trusted (issue 12). */
START_TEST(model_open_refuses_a_library_from_the_checkpoint) {
    char run[512], err[4096], warn[1024], state[6000], lib[4200];
    snprintf(run, sizeof run, "%s/run", dir);
    snprintf(lib, sizeof lib, "%s/tests/engines/marker_ctor.so", test_build_dir());
    char marker[600];
    snprintf(marker, sizeof marker, "%s/marker", dir);
    setenv("ORCH_TEST_MARKER", marker, 1);
    state_json_engine(state, sizeof state, 8, lib);
    orch_engine_ctx *a = mk(&mock, 8, 1, 1, NULL);
    ckpt_save_opts so = ckpt_save_opts_default();
    ck_assert_msg(ckpt_save(run, 4, &mock, a, state, &so, NULL, 0, err, sizeof err) == 0,
                  "%s", err);
    mock.api->context_destroy(a);
    inference_model m;
    inference_model_opts mo = { run, NULL, -1, NULL, INFERENCE_MODEL_TOKENIZER };
    ck_assert_int_eq(inference_model_open(&mo, &m, warn, sizeof warn, err, sizeof err),
                     -1);
    char want[10000];
    snprintf(want, sizeof want,
             "%s/ckpt-00000004/state.json: config engine.name '%s' is a library path; "
             "paths are only accepted from the command line: pass --engine=%s, or "
             "--trust-config-engine",
             run, lib, lib);
    ck_assert_str_eq(err, want);
    ck_assert_int_ne(access(marker, F_OK), 0); /* never dlopened */
    ck_assert_ptr_null(m.cfg);
    /* Trusted: loaded (the marker appears); it has no contexts to offer. */
    mo.flags |= INFERENCE_MODEL_TRUST_CONFIG_ENGINE;
    ck_assert_int_eq(inference_model_open(&mo, &m, warn, sizeof warn, err, sizeof err),
                     -1);
    ck_assert_msg(strstr(err, "cannot create context") != NULL, "%s", err);
    ck_assert_int_eq(access(marker, F_OK), 0);
    /* --engine overrides the checkpoint's name without any trust. */
    mo.engine = "mock";
    mo.flags = INFERENCE_MODEL_TOKENIZER;
    ck_assert_msg(inference_model_open(&mo, &m, warn, sizeof warn, err, sizeof err) == 0,
                  "%s", err);
    inference_model_close(&m);
    unsetenv("ORCH_TEST_MARKER");
}
END_TEST

/* --quantize WORD appends weights=WORD last (so it overrides an earlier
 * weights= in the options), to the command's options or, when they are the
 * config's, as a "+" suffix; an unknown word is refused naming the choices. */
START_TEST(quantize_options_append_last) {
    char buf[128], err[256];
    ck_assert_str_eq(inference_model_quantize_options("int8", "threads=2", buf,
                                                      sizeof buf, err, sizeof err),
                     "threads=2,weights=int8");
    ck_assert_str_eq(inference_model_quantize_options("fp32", "weights=int8", buf,
                                                      sizeof buf, err, sizeof err),
                     "weights=int8,weights=fp32");
    ck_assert_str_eq(
        inference_model_quantize_options("int8", "", buf, sizeof buf, err, sizeof err),
        "weights=int8");
    ck_assert_str_eq(
        inference_model_quantize_options("fp32", NULL, buf, sizeof buf, err, sizeof err),
        "+weights=fp32");
    const char *opts = "a=1"; /* no --quantize: the options as they were */
    ck_assert_ptr_eq(
        inference_model_quantize_options(NULL, opts, buf, sizeof buf, err, sizeof err),
        opts);
    err[0] = '\0';
    ck_assert_ptr_null(
        inference_model_quantize_options("int4", "", buf, sizeof buf, err, sizeof err));
    ck_assert_msg(strstr(err, "unknown format 'int4' (choices: int8, fp32)"), "%s", err);
    char tiny[8];
    ck_assert_ptr_null(inference_model_quantize_options("int8", "threads=2", tiny,
                                                        sizeof tiny, err, sizeof err));
    ck_assert_msg(strstr(err, "too long"), "%s", err);
}
END_TEST

/* --kv-cache-dtype WORD appends kv=WORD (f32, bf16) the same way, also after
 * what --quantize appended; auto and no flag leave the options as they were. */
START_TEST(kv_options_append_last) {
    char buf[128], err[256];
    ck_assert_str_eq(
        inference_model_kv_options("bf16", "threads=2", buf, sizeof buf, err, sizeof err),
        "threads=2,kv=bf16");
    ck_assert_str_eq(
        inference_model_kv_options("f32", NULL, buf, sizeof buf, err, sizeof err),
        "+kv=f32");
    const char *q =
        inference_model_quantize_options("int8", NULL, buf, sizeof buf, err, sizeof err);
    ck_assert_str_eq(
        inference_model_kv_options("bf16", q, buf, sizeof buf, err, sizeof err),
        "+weights=int8,kv=bf16");
    const char *opts = "a=1";
    ck_assert_ptr_eq(
        inference_model_kv_options("auto", opts, buf, sizeof buf, err, sizeof err), opts);
    ck_assert_ptr_eq(
        inference_model_kv_options(NULL, opts, buf, sizeof buf, err, sizeof err), opts);
    err[0] = '\0';
    ck_assert_ptr_null(
        inference_model_kv_options("fp8", "", buf, sizeof buf, err, sizeof err));
    ck_assert_msg(strstr(err, "unknown type 'fp8' (choices: auto, f32, bf16, int8)"),
                  "%s", err);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("inference");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, generate_session_mock_rule);
    tcase_add_test(tc, quantize_options_append_last);
    tcase_add_test(tc, kv_options_append_last);
    tcase_add_test(tc, model_open_from_a_run);
    tcase_add_test(tc, model_open_failures_hold_nothing);
    tcase_add_test(tc, model_open_refuses_a_library_from_the_checkpoint);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return test_run_suite(suite()); }
