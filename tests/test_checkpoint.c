/*
 * test_checkpoint.c - checkpoints through the mock engine (and the cpu engine
 * when it is built): round trip of all three tensor tables, the on-disk
 * layout, atomicity (leftover temp dirs, failed saves, re-saving a step),
 * corrupt/torn checkpoints falling back with a warning, retention (keep K +
 * best), loading by name with shape checks, cross-engine loading, the GPT-2
 * import (Conv1D transposes, prefixes, dtypes) and reading the run config
 * back (ckpt_read_config). The generate library has its own suite,
 * test_inference.c.
 */
/* Paths in tests are short; truncation warnings on fixed buffers are noise. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

#include <check.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "orchestrator/store/checkpoint.h"
#include "orchestrator/cli/commands.h"
#include "orchestrator/core/engine_loader.h"
#include "orchestrator/infer/inference_model.h"
#include "orchestrator/store/safetensors.h"
#include "orchestrator/core/util.h"
#include "tests/test_util.h"

static char dir[256];
static engine_handle mock;

static void setup(void) {
    test_tmpdir(dir, sizeof dir, "ckpt");
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

/* A few AdamW steps so weights and both moments are non-trivial. */
static void train(const engine_handle *h, orch_engine_ctx *c, int steps) {
    int32_t tok[2 * 8], tgt[2 * 8];
    for (int i = 0; i < 16; i++) {
        tok[i] = (i * 37 + 5) % 256;
        tgt[i] = (i * 91 + 11) % 256;
    }
    for (int s = 1; s <= steps; s++) {
        float loss;
        ck_assert_int_eq(h->api->grads_zero(c), ORCH_OK);
        ck_assert_int_eq(h->api->forward_backward(c, tok, tgt, 2, 8, 1.0f, &loss),
                         ORCH_OK);
        orch_adamw_params p = { sizeof p, 0,     (uint64_t)s, 1e-2f, 0.9f,
                                0.95f,    1e-8f, 0.1f,        1.0f };
        ck_assert_int_eq(h->api->optimizer_step(c, &p, NULL), ORCH_OK);
    }
}

/* Every table of kinds [0, n_kinds) equal, name by name, bit for bit. */
static void assert_same(const engine_handle *ha, orch_engine_ctx *a,
                        const engine_handle *hb, orch_engine_ctx *b, int n_kinds) {
    for (uint32_t kind = 0; kind < (uint32_t)n_kinds; kind++) {
        uint32_t na = 0, nb = 0;
        ck_assert_int_eq(ha->api->tensor_count(a, kind, &na), ORCH_OK);
        ck_assert_int_eq(hb->api->tensor_count(b, kind, &nb), ORCH_OK);
        ck_assert_uint_eq(na, nb);
        for (uint32_t i = 0; i < na; i++) {
            orch_tensor_info ia = { .struct_size = sizeof ia },
                             ib = { .struct_size = sizeof ib };
            ck_assert_int_eq(ha->api->tensor_info(a, kind, i, &ia), ORCH_OK);
            ck_assert_int_eq(hb->api->tensor_info(b, kind, i, &ib), ORCH_OK);
            ck_assert_str_eq(ia.name, ib.name);
            ck_assert_uint_eq(ia.numel, ib.numel);
            float *x = malloc(ia.numel * 4), *y = malloc(ib.numel * 4);
            ck_assert_int_eq(ha->api->tensor_read(a, kind, i, x, ia.numel * 4), ORCH_OK);
            ck_assert_int_eq(hb->api->tensor_read(b, kind, i, y, ib.numel * 4), ORCH_OK);
            if (memcmp(x, y, ia.numel * 4) != 0)
                ck_abort_msg("kind %u tensor %s differs", kind, ia.name);
            free(x);
            free(y);
        }
    }
}

static int tables_differ(const engine_handle *h, orch_engine_ctx *a, orch_engine_ctx *b) {
    orch_tensor_info ia = { .struct_size = sizeof ia };
    ck_assert_int_eq(h->api->tensor_info(a, 0, 0, &ia), ORCH_OK);
    float *x = malloc(ia.numel * 4), *y = malloc(ia.numel * 4);
    h->api->tensor_read(a, 0, 0, x, ia.numel * 4);
    h->api->tensor_read(b, 0, 0, y, ia.numel * 4);
    int d = memcmp(x, y, ia.numel * 4) != 0;
    free(x);
    free(y);
    return d;
}

static void save(const char *run, uint64_t step, orch_engine_ctx *c, int keep,
                 double val_loss) {
    char err[1024], out[4096], state[128];
    snprintf(state, sizeof state, "{\"step\": %llu, \"x\": [1, 2]}",
             (unsigned long long)step);
    ckpt_save_opts o = { keep, 1, val_loss };
    if (ckpt_save(run, step, &mock, c, state, &o, out, sizeof out, err, sizeof err) != 0)
        ck_abort_msg("save %llu: %s", (unsigned long long)step, err);
}

static char *slurp(const char *p) {
    FILE *fp = fopen(p, "rb");
    if (!fp) return NULL;
    static char buf[65536];
    size_t n = fread(buf, 1, sizeof buf - 1, fp);
    buf[n] = 0;
    fclose(fp);
    return buf;
}

static int exists(const char *fmt, const char *a) {
    char p[1024];
    snprintf(p, sizeof p, fmt, dir, a);
    return access(p, F_OK) == 0;
}

START_TEST(round_trip_and_layout) {
    orch_engine_ctx *a = mk(&mock, 8, 2, 1, NULL), *b = mk(&mock, 8, 2, 2, NULL);
    train(&mock, a, 3);
    char run[512], err[1024], out[4096];
    snprintf(run, sizeof run, "%s/run/nested", dir);
    ckpt_save_opts o = ckpt_save_opts_default();
    o.val_loss = 2.5;
    ck_assert_int_eq(ckpt_save(run, 5, &mock, a, "{\"hello\": \"w\u00f6rld\"}", &o, out,
                               sizeof out, err, sizeof err),
                     0);
    char want[600];
    snprintf(want, sizeof want, "%s/ckpt-00000005", run);
    ck_assert_str_eq(out, want);
    /* Layout. */
    char p[700];
    snprintf(p, sizeof p, "%s/latest", run);
    ck_assert_str_eq(slurp(p), "ckpt-00000005\n");
    snprintf(p, sizeof p, "%s/state.json", out);
    ck_assert_str_eq(slurp(p), "{\"hello\": \"w\u00f6rld\"}");
    snprintf(p, sizeof p, "%s/meta.json", out);
    ck_assert_ptr_nonnull(strstr(slurp(p), "\"val_loss\":\t2.5"));
    snprintf(p, sizeof p, "%s/checksums.sha256", out);
    char *sums = slurp(p);
    ck_assert_ptr_nonnull(strstr(sums, "  model.safetensors\n"));
    ck_assert_ptr_nonnull(strstr(sums, "  optimizer.safetensors\n"));
    ck_assert_ptr_nonnull(strstr(sums, "  state.json\n"));
    ck_assert_ptr_nonnull(strstr(sums, "  meta.json\n"));
    /* coreutils agrees with our checksums. */
    char cmd[900];
    snprintf(cmd, sizeof cmd, "cd '%s' && sha256sum --quiet -c checksums.sha256", out);
    ck_assert_int_eq(system(cmd), 0);
    /* Standard safetensors with the engine's names; moments prefixed. */
    safetensors_file *f = NULL;
    snprintf(p, sizeof p, "%s/optimizer.safetensors", out);
    ck_assert_int_eq(safetensors_open(p, &f, err, sizeof err), 0);
    ck_assert_ptr_nonnull(safetensors_find(f, "m.wte.weight"));
    ck_assert_ptr_nonnull(safetensors_find(f, "v.h.1.mlp.c_proj.bias"));
    safetensors_close(f);
    snprintf(p, sizeof p, "%s/model.safetensors", out);
    ck_assert_int_eq(safetensors_open(p, &f, err, sizeof err), 0);
    const safetensors_tensor *t = safetensors_find(f, "h.0.attn.c_attn.weight");
    ck_assert_ptr_nonnull(t);
    ck_assert_uint_eq(t->shape[0], 24);
    ck_assert_uint_eq(t->shape[1], 8);
    ck_assert_str_eq(safetensors_metadata(f, "format"), "orch");
    ck_assert_str_eq(safetensors_metadata(f, "layout"), "orch-gpt2");
    ck_assert_str_eq(safetensors_metadata(f, "layout_version"), "1");
    safetensors_close(f);
    /* Helpers. */
    uint64_t step = 0;
    ck_assert_int_eq(ckpt_read_step(out, &step, err, sizeof err), 0);
    ck_assert_uint_eq(step, 5);
    ck_assert_int_eq(ckpt_has_optimizer(out), 1);
    char *st = NULL;
    ck_assert_int_eq(ckpt_read_state(out, &st, err, sizeof err), 0);
    ck_assert_str_eq(st, "{\"hello\": \"w\u00f6rld\"}");
    free(st);
    char found[4096], warn[1024];
    ck_assert_int_eq(
        ckpt_find_latest(run, found, sizeof found, warn, sizeof warn, err, sizeof err),
        0);
    ck_assert_str_eq(found, out);
    ck_assert_str_eq(warn, "");
    ck_assert_int_eq(
        ckpt_find_latest(out, found, sizeof found, warn, sizeof warn, err, sizeof err),
        0);
    ck_assert_str_eq(found, out);
    /* Load into a context with different weights: all tables equal. */
    ck_assert(tables_differ(&mock, a, b));
    ck_assert_int_eq(ckpt_load_weights(out, &mock, b, 1, err, sizeof err), 0);
    assert_same(&mock, a, &mock, b, 3);
    /* Bad state JSON is refused and nothing changes. */
    ck_assert_int_eq(
        ckpt_save(run, 6, &mock, a, "{not json", &o, NULL, 0, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "not valid JSON"));
    snprintf(p, sizeof p, "%s/latest", run);
    ck_assert_str_eq(slurp(p), "ckpt-00000005\n");
    mock.api->context_destroy(a);
    mock.api->context_destroy(b);
}
END_TEST

START_TEST(weights_only_and_mismatches) {
    orch_engine_ctx *a = mk(&mock, 8, 2, 1, NULL);
    char run[512], err[1024], out[4096];
    snprintf(run, sizeof run, "%s/run", dir);
    ckpt_save_opts o = { 3, 0, NAN };
    ck_assert_int_eq(
        ckpt_save(run, 1, &mock, a, "{}", &o, out, sizeof out, err, sizeof err), 0);
    ck_assert_int_eq(ckpt_has_optimizer(out), 0);
    ck_assert(!exists("%s/run/ckpt-00000001/%s", "optimizer.safetensors"));
    orch_engine_ctx *b = mk(&mock, 8, 2, 9, NULL);
    ck_assert_int_eq(ckpt_load_weights(out, &mock, b, 1, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "no optimizer state"));
    ck_assert_int_eq(ckpt_load_weights(out, &mock, b, 0, err, sizeof err), 0);
    assert_same(&mock, a, &mock, b, 1);
    /* Wrong width: shape mismatch names the tensor and both shapes. */
    orch_engine_ctx *w = mk(&mock, 16, 2, 1, NULL);
    ck_assert_int_eq(ckpt_load_weights(out, &mock, w, 0, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(
        err, "tensor 'wte.weight' has shape [256,8] but the model needs [256,16]"));
    /* Wrong depth: tensor count differs. */
    orch_engine_ctx *l = mk(&mock, 8, 3, 1, NULL);
    ck_assert_int_eq(ckpt_load_weights(out, &mock, l, 0, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "holds 28 tensors but the model has 40"));
    /* A file missing a tensor the model needs (same count, other name). */
    char p[700];
    snprintf(p, sizeof p, "%s/other", dir);
    ckpt_tensor ts[1];
    float v[4] = { 0 };
    ts[0] = (ckpt_tensor){ "zz", SAFETENSORS_F32, 1, { 4 }, v };
    ck_assert_int_eq(ckpt_write_dir(p, ts, 1, "{}", 0, err, sizeof err), 0);
    ck_assert_int_eq(ckpt_load_weights(p, &mock, a, 0, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "holds 1 tensors"));
    ck_assert_int_eq(ckpt_write_dir(p, ts, 1, "{}", 0, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "already exists"));
    ck_assert_int_eq(ckpt_verify(p, err, sizeof err), 0);
    mock.api->context_destroy(a);
    mock.api->context_destroy(b);
    mock.api->context_destroy(w);
    mock.api->context_destroy(l);
}
END_TEST

/* Copy SRC's tensors into DST with the given metadata (NULL: none). */
static void rewrite_with_metadata(const char *src, const char *dst, const char *const *kv,
                                  size_t n_kv) {
    char err[1024];
    safetensors_file *f = NULL;
    safetensors_writer *w = NULL;
    ck_assert_int_eq(safetensors_open(src, &f, err, sizeof err), 0);
    ck_assert_int_eq(safetensors_writer_create(dst, &w, err, sizeof err), 0);
    for (size_t k = 0; k + 1 < 2 * n_kv; k += 2)
        ck_assert_int_eq(
            safetensors_writer_add_metadata(w, kv[k], kv[k + 1], err, sizeof err), 0);
    for (size_t i = 0; i < safetensors_count(f); i++) {
        const safetensors_tensor *t = safetensors_get(f, i);
        ck_assert_int_eq(safetensors_writer_declare(w, t->name, t->dtype, t->ndim,
                                                    t->shape, err, sizeof err),
                         0);
    }
    ck_assert_int_eq(safetensors_writer_begin_data(w, err, sizeof err), 0);
    for (size_t i = 0; i < safetensors_count(f); i++) {
        const safetensors_tensor *t = safetensors_get(f, i);
        ck_assert_int_eq(safetensors_writer_write(w, t->data, t->nbytes, err, sizeof err),
                         0);
    }
    ck_assert_int_eq(safetensors_writer_finish(w, NULL, err, sizeof err), 0);
    safetensors_close(f);
}

/* Checkpoints written before the layout keys ("format": "pt", or no
 * metadata) still load; an orch layout of another version, or another
 * format, is refused with a line naming it. */
START_TEST(layout_metadata_old_and_foreign) {
    orch_engine_ctx *a = mk(&mock, 8, 2, 1, NULL), *b = mk(&mock, 8, 2, 7, NULL);
    char run[512], err[1024], out[4096], model[4200], copy[4300];
    snprintf(run, sizeof run, "%s/run", dir);
    ckpt_save_opts o = { 3, 0, NAN };
    ck_assert_int_eq(ckpt_save(run, 1, &mock, a,
                               "{\"config\": {\"model\": {\"arch\": \"gpt2\"}}}", &o, out,
                               sizeof out, err, sizeof err),
                     0);
    snprintf(model, sizeof model, "%s/model.safetensors", out);
    snprintf(copy, sizeof copy, "%s/orig.safetensors", dir);
    ck_assert_int_eq(rename(model, copy), 0);
    static const char *const pt[] = { "format", "pt" };
    static const char *const v2[] = { "format",    "orch",           "layout",
                                      "orch-gpt2", "layout_version", "2" };
    static const char *const mlx[] = { "format", "mlx" };
    rewrite_with_metadata(copy, model, NULL, 0);
    ck_assert(tables_differ(&mock, a, b));
    ck_assert_int_eq(ckpt_load_weights(out, &mock, b, 0, err, sizeof err), 0);
    assert_same(&mock, a, &mock, b, 1);
    rewrite_with_metadata(copy, model, pt, 1);
    ck_assert_int_eq(ckpt_load_weights(out, &mock, b, 0, err, sizeof err), 0);
    rewrite_with_metadata(copy, model, v2, 3);
    ck_assert_int_eq(ckpt_load_weights(out, &mock, b, 0, err, sizeof err), -1);
    ck_assert_ptr_nonnull(
        strstr(err, "layout 'orch-gpt2' version '2' is not one this orch reads"));
    rewrite_with_metadata(copy, model, mlx, 1);
    ck_assert_int_eq(ckpt_load_weights(out, &mock, b, 0, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "format 'mlx' is not an orch checkpoint"));
    mock.api->context_destroy(a);
    mock.api->context_destroy(b);
}
END_TEST

START_TEST(retention_keeps_last_k_and_best) {
    orch_engine_ctx *a = mk(&mock, 8, 1, 1, NULL);
    char run[512];
    snprintf(run, sizeof run, "%s/run", dir);
    double vl[7] = { 0, 5.0, 3.0, 4.0, NAN, 7.0, 8.0 };
    for (int s = 1; s <= 6; s++) save(run, (uint64_t)s, a, 2, vl[s]);
    /* Last 2 (5, 6) plus the best (2, val 3.0). */
    ck_assert(!exists("%s/run/ckpt-0000000%s", "1"));
    ck_assert(exists("%s/run/ckpt-0000000%s", "2"));
    ck_assert(!exists("%s/run/ckpt-0000000%s", "3"));
    ck_assert(!exists("%s/run/ckpt-0000000%s", "4"));
    ck_assert(exists("%s/run/ckpt-0000000%s", "5"));
    ck_assert(exists("%s/run/ckpt-0000000%s", "6"));
    /* A new best replaces the old best. */
    save(run, 7, a, 2, 1.0);
    ck_assert(!exists("%s/run/ckpt-0000000%s", "2"));
    ck_assert(!exists("%s/run/ckpt-0000000%s", "5"));
    ck_assert(exists("%s/run/ckpt-0000000%s", "6"));
    ck_assert(exists("%s/run/ckpt-0000000%s", "7"));
    /* Unknown losses only: keep the last K; keep_last 1 never drops latest. */
    save(run, 8, a, 1, NAN);
    save(run, 9, a, 1, NAN);
    ck_assert(exists("%s/run/ckpt-0000000%s", "9"));
    ck_assert(exists("%s/run/ckpt-0000000%s", "7")); /* still the best */
    ck_assert(!exists("%s/run/ckpt-0000000%s", "8"));
    ck_assert(!exists("%s/run/ckpt-0000000%s", "6"));
    /* keep_last <= 0 keeps everything. */
    save(run, 10, a, 0, NAN);
    save(run, 11, a, 0, NAN);
    ck_assert(exists("%s/run/ckpt-000000%s", "10"));
    ck_assert(exists("%s/run/ckpt-000000%s", "11"));
    ck_assert(exists("%s/run/ckpt-0000000%s", "9"));
    /* No trash or temp left behind. */
    char cmd[600];
    snprintf(cmd, sizeof cmd,
             "test -z \"$(ls -A '%s/run' | grep -v -e '^ckpt-' -e '^latest$')\"", dir);
    ck_assert_int_eq(system(cmd), 0);
    mock.api->context_destroy(a);
}
END_TEST

static pid_t dead_pid(void) {
    pid_t p = fork();
    if (p == 0) _exit(0);
    waitpid(p, NULL, 0);
    return p;
}

START_TEST(stale_temp_dirs_ignored_and_cleaned) {
    orch_engine_ctx *a = mk(&mock, 8, 1, 1, NULL);
    char run[512], p[700], err[1024], found[4096], warn[1024];
    snprintf(run, sizeof run, "%s/run", dir);
    save(run, 1, a, 3, NAN);
    /* A torn save by a dead process, with a higher step, and junk inside. */
    snprintf(p, sizeof p, "%s/.tmp-ckpt-00000002-%d", run, (int)dead_pid());
    ck_assert_int_eq(mkdir(p, 0755), 0);
    char q[800];
    snprintf(q, sizeof q, "%s/model.safetensors", p);
    FILE *fp = fopen(q, "w");
    fputs("partial", fp);
    fclose(fp);
    /* Leftover pointer temp file and trash dir of a dead process. */
    char lt[700], tr[700];
    snprintf(lt, sizeof lt, "%s/.latest.tmp-%d", run, (int)dead_pid());
    fp = fopen(lt, "w");
    fputs("ckpt-00000002\n", fp);
    fclose(fp);
    snprintf(tr, sizeof tr, "%s/.trash-ckpt-00000001-%d", run, (int)dead_pid());
    ck_assert_int_eq(mkdir(tr, 0755), 0);
    /* A temp dir of a live process (pid 1) is not touched. */
    char live[700];
    snprintf(live, sizeof live, "%s/.tmp-ckpt-00000003-1", run);
    ck_assert_int_eq(mkdir(live, 0755), 0);
    ck_assert_int_eq(
        ckpt_find_latest(run, found, sizeof found, warn, sizeof warn, err, sizeof err),
        0);
    ck_assert_ptr_nonnull(strstr(found, "ckpt-00000001"));
    ck_assert_str_eq(warn, "");
    save(run, 2, a, 3, NAN);
    ck_assert_int_ne(access(p, F_OK), 0);
    ck_assert_int_ne(access(lt, F_OK), 0);
    ck_assert_int_ne(access(tr, F_OK), 0);
    ck_assert_int_eq(access(live, F_OK), 0);
    ck_assert_int_eq(
        ckpt_find_latest(run, found, sizeof found, warn, sizeof warn, err, sizeof err),
        0);
    ck_assert_ptr_nonnull(strstr(found, "ckpt-00000002"));
    mock.api->context_destroy(a);
}
END_TEST

START_TEST(failed_save_changes_nothing) {
    /* The 60th tensor_read fails: inside model.safetensors of the second save
     * (a 1-layer model has 16 tensors; a save reads 3 tables = 48). */
    orch_engine_ctx *a = mk(&mock, 8, 1, 1, "fault=tensor_read:60");
    char run[512], p[700], err[1024], found[4096], warn[1024];
    snprintf(run, sizeof run, "%s/run", dir);
    save(run, 1, a, 3, NAN);
    ckpt_save_opts o = { 3, 1, NAN };
    ck_assert_int_eq(ckpt_save(run, 2, &mock, a, "{}", &o, NULL, 0, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "injected fault"));
    snprintf(p, sizeof p, "%s/latest", run);
    ck_assert_str_eq(slurp(p), "ckpt-00000001\n");
    ck_assert(!exists("%s/run/ckpt-0000000%s", "2"));
    char cmd[600];
    snprintf(cmd, sizeof cmd,
             "test -z \"$(ls -A '%s/run' | grep -v -e '^ckpt-' -e '^latest$')\"", dir);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_int_eq(
        ckpt_find_latest(run, found, sizeof found, warn, sizeof warn, err, sizeof err),
        0);
    ck_assert_ptr_nonnull(strstr(found, "ckpt-00000001"));
    mock.api->context_destroy(a);
}
END_TEST

START_TEST(resave_same_step_replaces_atomically) {
    orch_engine_ctx *a = mk(&mock, 8, 1, 1, NULL), *b = mk(&mock, 8, 1, 2, NULL);
    orch_engine_ctx *c = mk(&mock, 8, 1, 3, NULL);
    char run[512], err[1024], found[4096], warn[1024];
    snprintf(run, sizeof run, "%s/run", dir);
    save(run, 3, a, 3, NAN);
    save(run, 3, b, 3, NAN);
    ck_assert_int_eq(
        ckpt_find_latest(run, found, sizeof found, warn, sizeof warn, err, sizeof err),
        0);
    ck_assert_int_eq(ckpt_load_weights(found, &mock, c, 1, err, sizeof err), 0);
    assert_same(&mock, b, &mock, c, 3);
    char cmd[600];
    snprintf(cmd, sizeof cmd,
             "test -z \"$(ls -A '%s/run' | grep -v -e '^ckpt-' -e '^latest$')\"", dir);
    ck_assert_int_eq(system(cmd), 0);
    mock.api->context_destroy(a);
    mock.api->context_destroy(b);
    mock.api->context_destroy(c);
}
END_TEST

/* Damage the newest checkpoint in various ways: the previous good one is used
 * with a warning naming the problem. */
static const struct {
    const char *what;
    const char *cmd; /* run in the ckpt-00000003 dir */
    const char *expect;
} damage[] = {
    { "flipped byte",
      "printf 'X' | dd of=model.safetensors bs=1 seek=200 conv=notrunc 2>/dev/null",
      "checksum mismatch for model.safetensors" },
    { "truncated model", "truncate -s 100 model.safetensors",
      "checksum mismatch for model.safetensors" },
    { "truncated optimizer", "truncate -s 0 optimizer.safetensors",
      "checksum mismatch for optimizer.safetensors" },
    { "missing state", "rm state.json", "missing file state.json" },
    { "missing checksums (torn)", "rm checksums.sha256", "missing checksums.sha256" },
    { "garbage checksums", "echo nonsense > checksums.sha256", "malformed line 1" },
    { "edited state", "echo '{}' > state.json", "checksum mismatch for state.json" },
    { "checksums without model",
      "grep -v model checksums.sha256 > x && mv x checksums.sha256",
      "does not list model.safetensors" },
    { "checksums cut short", "head -n 3 checksums.sha256 > x && mv x checksums.sha256",
      "does not list meta.json" },
    { "checksums without optimizer",
      "grep -v optimizer checksums.sha256 > x && mv x checksums.sha256",
      "does not list optimizer.safetensors" },
};

START_TEST(corrupt_latest_falls_back) {
    orch_engine_ctx *a = mk(&mock, 8, 1, 1, NULL);
    char run[512], err[1024], found[4096], warn[1024], cmd[1200];
    snprintf(run, sizeof run, "%s/run", dir);
    for (int s = 1; s <= 3; s++) save(run, (uint64_t)s, a, 5, NAN);
    snprintf(cmd, sizeof cmd, "cd '%s/ckpt-00000003' && %s", run, damage[_i].cmd);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_int_eq(
        ckpt_find_latest(run, found, sizeof found, warn, sizeof warn, err, sizeof err),
        0);
    ck_assert_ptr_nonnull(strstr(found, "ckpt-00000002"));
    if (!strstr(warn, damage[_i].expect) || !strstr(warn, "using ckpt-00000002"))
        ck_abort_msg("%s: warning '%s'", damage[_i].what, warn);
    /* Naming the damaged dir directly is an error, not a silent fallback. */
    snprintf(cmd, sizeof cmd, "%s/ckpt-00000003", run);
    ck_assert_int_eq(
        ckpt_find_latest(cmd, found, sizeof found, warn, sizeof warn, err, sizeof err),
        -1);
    ck_assert_ptr_nonnull(strstr(err, damage[_i].expect));
    ck_assert_int_eq(ckpt_verify(cmd, err, sizeof err), -1);
    /* The next save still works and becomes latest (the bad one is replaced
     * or left for retention). */
    save(run, 4, a, 5, NAN);
    ck_assert_int_eq(
        ckpt_find_latest(run, found, sizeof found, warn, sizeof warn, err, sizeof err),
        0);
    ck_assert_ptr_nonnull(strstr(found, "ckpt-00000004"));
    ck_assert_str_eq(warn, "");
    mock.api->context_destroy(a);
}
END_TEST

START_TEST(latest_file_problems) {
    orch_engine_ctx *a = mk(&mock, 8, 1, 1, NULL);
    char run[512], err[1024], found[4096], warn[1024], p[700];
    snprintf(run, sizeof run, "%s/run", dir);
    /* Nothing there yet. */
    ck_assert_int_eq(mkdir(run, 0755), 0);
    ck_assert_int_eq(
        ckpt_find_latest(run, found, sizeof found, warn, sizeof warn, err, sizeof err),
        -1);
    ck_assert_ptr_nonnull(strstr(err, "no checkpoint found"));
    ck_assert_int_eq(ckpt_find_latest("/nonexistent/run", found, sizeof found, warn,
                                      sizeof warn, err, sizeof err),
                     -1);
    ck_assert_ptr_nonnull(strstr(err, "/nonexistent/run"));
    save(run, 1, a, 5, NAN);
    save(run, 2, a, 5, NAN);
    snprintf(p, sizeof p, "%s/latest", run);
    /* Garbage in latest. */
    FILE *fp = fopen(p, "w");
    fputs("../../etc\n", fp);
    fclose(fp);
    ck_assert_int_eq(
        ckpt_find_latest(run, found, sizeof found, warn, sizeof warn, err, sizeof err),
        0);
    ck_assert_ptr_nonnull(strstr(found, "ckpt-00000002"));
    ck_assert_ptr_nonnull(strstr(warn, "'latest' is corrupt"));
    /* latest names a dir that is gone. */
    fp = fopen(p, "w");
    fputs("ckpt-00000007\n", fp);
    fclose(fp);
    ck_assert_int_eq(
        ckpt_find_latest(run, found, sizeof found, warn, sizeof warn, err, sizeof err),
        0);
    ck_assert_ptr_nonnull(strstr(found, "ckpt-00000002"));
    ck_assert_ptr_nonnull(strstr(warn, "names ckpt-00000007"));
    /* latest missing. */
    unlink(p);
    ck_assert_int_eq(
        ckpt_find_latest(run, found, sizeof found, warn, sizeof warn, err, sizeof err),
        0);
    ck_assert_ptr_nonnull(strstr(warn, "no 'latest' file"));
    /* Every checkpoint broken: an error. */
    char cmd[900];
    snprintf(cmd, sizeof cmd, "rm '%s'/ckpt-*/checksums.sha256", run);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_int_eq(
        ckpt_find_latest(run, found, sizeof found, warn, sizeof warn, err, sizeof err),
        -1);
    ck_assert_ptr_nonnull(strstr(err, "none of the 2 ckpt-* directories verifies"));
    mock.api->context_destroy(a);
}
END_TEST

/* mock -> cpu -> mock: a checkpoint written through one engine loads through
 * the other with every tensor identical. */
START_TEST(cross_engine_load) {
    engine_handle cpu;
    char err[1024], run[512], out[4096];
    if (engine_load("cpu", &cpu, err, sizeof err) != 0) {
        fprintf(stderr, "SKIP cross_engine_load: cpu engine not available (%s)\n", err);
        return;
    }
    orch_engine_ctx *a = mk(&mock, 8, 2, 1, NULL);
    train(&mock, a, 2);
    snprintf(run, sizeof run, "%s/run", dir);
    save(run, 1, a, 5, NAN);
    orch_engine_ctx *c = mk(&cpu, 8, 2, 7, NULL);
    snprintf(out, sizeof out, "%s/ckpt-00000001", run);
    ck_assert_int_eq(ckpt_load_weights(out, &cpu, c, 1, err, sizeof err), 0);
    assert_same(&mock, a, &cpu, c, 3);
    /* Save through cpu (its own tensor order/names), load back into mock. */
    char run2[600];
    snprintf(run2, sizeof run2, "%s/run2", dir);
    ckpt_save_opts o = ckpt_save_opts_default();
    ck_assert_int_eq(
        ckpt_save(run2, 1, &cpu, c, "{}", &o, out, sizeof out, err, sizeof err), 0);
    orch_engine_ctx *b = mk(&mock, 8, 2, 3, NULL);
    ck_assert_int_eq(ckpt_load_weights(out, &mock, b, 1, err, sizeof err), 0);
    assert_same(&mock, a, &mock, b, 3);
    cpu.api->context_destroy(c);
    engine_unload(&cpu);
    mock.api->context_destroy(a);
    mock.api->context_destroy(b);
}
END_TEST

/* ---- GPT-2 import ---------------------------------------------------------- */

/* Deterministic value of element e of HF tensor k. */
static float hf_val(int k, uint64_t e) {
    /* Multiples of 1/16 in [-3, 9]: exact in F32, F16 and BF16. */
    return (float)k * 0.0625f + (float)(e % 97) * 0.0625f - 3.0f;
}

/* Write a tiny GPT-2 in the Hugging Face layout: V=256, T=16, C=8, L=2, M=32,
 * Conv1D weights [in, out]; optional "transformer." prefix, attn.bias buffers,
 * lm_head; c_fc.bias stored as F16 and ln_f.weight as BF16. */
static void write_hf(const char *path, const char *prefix, int extras) {
    const uint64_t V = 256, T = 16, C = 8, M = 32;
    struct {
        char name[64];
        int dtype;
        uint32_t ndim;
        uint64_t s[2];
    } t[64];
    int n = 0;
#define ADD(nm, dt, nd, a, b)                        \
    do {                                             \
        snprintf(t[n].name, 64, "%s%s", prefix, nm); \
        t[n].dtype = dt;                             \
        t[n].ndim = nd;                              \
        t[n].s[0] = a;                               \
        t[n].s[1] = b;                               \
        n++;                                         \
    } while (0)
    ADD("wte.weight", SAFETENSORS_F32, 2, V, C);
    ADD("wpe.weight", SAFETENSORS_F32, 2, T, C);
    for (int l = 0; l < 2; l++) {
        char b[64];
#define L(sfx, dt, nd, a, bb)                     \
    do {                                          \
        snprintf(b, sizeof b, "h.%d.%s", l, sfx); \
        ADD(b, dt, nd, a, bb);                    \
    } while (0)
        L("ln_1.weight", SAFETENSORS_F32, 1, C, 0);
        L("ln_1.bias", SAFETENSORS_F32, 1, C, 0);
        L("attn.c_attn.weight", SAFETENSORS_F32, 2, C, 3 * C);
        L("attn.c_attn.bias", SAFETENSORS_F32, 1, 3 * C, 0);
        L("attn.c_proj.weight", SAFETENSORS_F32, 2, C, C);
        L("attn.c_proj.bias", SAFETENSORS_F32, 1, C, 0);
        L("ln_2.weight", SAFETENSORS_F32, 1, C, 0);
        L("ln_2.bias", SAFETENSORS_F32, 1, C, 0);
        L("mlp.c_fc.weight", SAFETENSORS_F32, 2, C, M);
        L("mlp.c_fc.bias", SAFETENSORS_F16, 1, M, 0);
        L("mlp.c_proj.weight", SAFETENSORS_F32, 2, M, C);
        L("mlp.c_proj.bias", SAFETENSORS_F32, 1, C, 0);
        if (extras) {
            L("attn.bias", SAFETENSORS_F32, 2, T, T);
            L("attn.masked_bias", SAFETENSORS_F32, 0, 0, 0);
        }
    }
    ADD("ln_f.weight", SAFETENSORS_BF16, 1, C, 0);
    ADD("ln_f.bias", SAFETENSORS_F32, 1, C, 0);
    if (extras) {
        t[n].dtype = SAFETENSORS_F32;
        t[n].ndim = 2;
        t[n].s[0] = V;
        t[n].s[1] = C;
        snprintf(t[n].name, 64, "lm_head.weight");
        n++;
    }
    char err[512];
    safetensors_writer *w = NULL;
    ck_assert_int_eq(safetensors_writer_create(path, &w, err, sizeof err), 0);
    /* Reverse declaration order: the importer must not depend on order. */
    for (int k = n - 1; k >= 0; k--)
        ck_assert_int_eq(safetensors_writer_declare(w, t[k].name, t[k].dtype, t[k].ndim,
                                                    t[k].s, err, sizeof err),
                         0);
    ck_assert_int_eq(safetensors_writer_begin_data(w, err, sizeof err), 0);
    for (int k = n - 1; k >= 0; k--) {
        uint64_t numel = 1;
        for (uint32_t d = 0; d < t[k].ndim; d++) numel *= t[k].s[d];
        for (uint64_t e = 0; e < numel; e++) {
            float v = hf_val(k, e);
            if (t[k].dtype == SAFETENSORS_F32) {
                safetensors_writer_write(w, &v, 4, err, sizeof err);
            } else if (t[k].dtype == SAFETENSORS_BF16) {
                uint32_t bits;
                memcpy(&bits, &v, 4);
                uint16_t h = (uint16_t)(bits >> 16); /* exact: values have few bits */
                safetensors_writer_write(w, &h, 2, err, sizeof err);
            } else {
                /* F16 of v (exact for hf_val's values). */
                int neg = v < 0;
                float a = neg ? -v : v;
                uint16_t h = 0;
                if (a != 0) {
                    int ex;
                    float m = frexpf(a, &ex); /* a = m 2^ex, m in [0.5,1) */
                    h = (uint16_t)((ex - 1 + 15) << 10 |
                                   ((uint16_t)((m * 2 - 1) * 1024) & 0x3ff));
                }
                if (neg) h |= 0x8000;
                safetensors_writer_write(w, &h, 2, err, sizeof err);
            }
        }
    }
    ck_assert_int_eq(safetensors_writer_finish(w, NULL, err, sizeof err), 0);
    /* Remember k for names: return via hf_index below. */
#undef L
#undef ADD
}

/* Index k (declaration index before reversal) of an HF tensor by its orch
 * name, matching write_hf's order. */
static int hf_index(const char *name) {
    if (!strcmp(name, "wte.weight")) return 0;
    if (!strcmp(name, "wpe.weight")) return 1;
    static const char *sfx[12] = { "ln_1.weight",        "ln_1.bias",
                                   "attn.c_attn.weight", "attn.c_attn.bias",
                                   "attn.c_proj.weight", "attn.c_proj.bias",
                                   "ln_2.weight",        "ln_2.bias",
                                   "mlp.c_fc.weight",    "mlp.c_fc.bias",
                                   "mlp.c_proj.weight",  "mlp.c_proj.bias" };
    int l;
    char rest[64];
    if (sscanf(name, "h.%d.%63s", &l, rest) == 2)
        for (int k = 0; k < 12; k++)
            if (!strcmp(rest, sfx[k])) return 2 + l * 12 + k;
    if (!strcmp(name, "ln_f.weight")) return 26;
    if (!strcmp(name, "ln_f.bias")) return 27;
    return -1;
}

static int run_import(int argc, const char **argv) {
    return cmd_import_gpt2(argc, (char **)argv);
}

static void check_imported(const char *out, int extras) {
    char p[700], err[1024];
    (void)extras;
    snprintf(p, sizeof p, "%s/model.safetensors", out);
    safetensors_file *f = NULL;
    ck_assert_int_eq(safetensors_open(p, &f, err, sizeof err), 0);
    ck_assert_uint_eq(safetensors_count(f), 28);
    for (size_t i = 0; i < safetensors_count(f); i++) {
        const safetensors_tensor *t = safetensors_get(f, i);
        int k = hf_index(t->name);
        ck_assert_int_ge(k, 0);
        /* With extras, attn.bias/masked_bias entries shift later indices. */
        if (extras) {
            int l;
            if (sscanf(t->name, "h.%d.", &l) == 1)
                k += 2 * l;
            else if (k >= 26)
                k += 4;
        }
        ck_assert_int_eq(t->dtype, SAFETENSORS_F32);
        const float *d = t->data;
        int conv = strstr(t->name, "c_attn.weight") || strstr(t->name, "c_proj.weight") ||
                   strstr(t->name, "c_fc.weight");
        for (uint64_t e = 0; e < t->numel; e++) {
            uint64_t src = e;
            if (conv) { /* ours [out,in] = theirs [in,out] transposed */
                uint64_t r = e / t->shape[1], c = e % t->shape[1];
                src = c * t->shape[0] + r;
            }
            float want = hf_val(k, src);
            if (fabsf(d[e] - want) > 1e-6f)
                ck_abort_msg("%s[%llu] = %g, want %g", t->name, (unsigned long long)e,
                             d[e], want);
        }
    }
    /* Shapes in orch layout. */
    const safetensors_tensor *t = safetensors_find(f, "h.1.attn.c_attn.weight");
    ck_assert_uint_eq(t->shape[0], 24);
    ck_assert_uint_eq(t->shape[1], 8);
    t = safetensors_find(f, "h.0.mlp.c_proj.weight");
    ck_assert_uint_eq(t->shape[0], 8);
    ck_assert_uint_eq(t->shape[1], 32);
    safetensors_close(f);
    ck_assert_int_eq(ckpt_verify(out, err, sizeof err), 0);
    ck_assert_int_eq(ckpt_has_optimizer(out), 0);
    /* The model loads by name into an engine context of the config's shape. */
    inference_model m;
    inference_model_opts mo = { out, "mock", 1, NULL, 0 };
    char warn[512];
    if (inference_model_open(&mo, &m, warn, sizeof warn, err, sizeof err) != 0)
        ck_abort_msg("open imported: %s", err);
    ck_assert_uint_eq(m.desc.width, 8);
    ck_assert_uint_eq(m.desc.layers, 2);
    ck_assert_uint_eq(m.desc.heads, 2);
    ck_assert_uint_eq(m.desc.context, 16);
    ck_assert_uint_eq(m.desc.mlp_width, 32);
    ck_assert_uint_eq(m.desc.vocab_size, 256);
    ck_assert_str_eq(m.cfg->data.tokenizer, "byte");
    inference_model_close(&m);
}

START_TEST(import_gpt2_round_trip) {
    char hf[600], out[600], out2[600], cfgout[600];
    snprintf(hf, sizeof hf, "%s/model.safetensors", dir);
    write_hf(hf, "", 0);
    snprintf(out, sizeof out, "%s/imported", dir);
    snprintf(cfgout, sizeof cfgout, "%s/cfg.json", dir);
    const char *argv1[] = { "import-gpt2", hf,  "--out",        out,
                            "--heads",     "2", "--config-out", cfgout };
    ck_assert_int_eq(run_import(8, argv1), 0);
    check_imported(out, 0);
    char *c = slurp(cfgout);
    ck_assert_ptr_nonnull(c);
    ck_assert_ptr_nonnull(strstr(c, "\"heads\":\t2"));
    /* "transformer." prefix, buffers to skip, lm_head, heads from config.json. */
    snprintf(out2, sizeof out2, "%s/hf", dir);
    ck_assert_int_eq(mkdir(out2, 0755), 0);
    snprintf(hf, sizeof hf, "%s/hf/model.safetensors", dir);
    write_hf(hf, "transformer.", 1);
    char cj[700];
    snprintf(cj, sizeof cj, "%s/hf/config.json", dir);
    FILE *fp = fopen(cj, "w");
    fputs("{\"n_head\": 2, \"layer_norm_epsilon\": 1e-05, \"n_embd\": 8}", fp);
    fclose(fp);
    snprintf(out2, sizeof out2, "%s/imported2", dir);
    const char *argv2[] = { "import-gpt2", hf, "--out", out2 };
    ck_assert_int_eq(run_import(4, argv2), 0);
    check_imported(out2, 1);
    /* Errors: existing --out, missing file, unknown tensor, bad heads. */
    ck_assert_int_eq(run_import(4, argv2), 1);
    const char *argv3[] = { "import-gpt2", "/nonexistent.safetensors", "--out", out2 };
    ck_assert_int_eq(run_import(4, argv3), 2);
    const char *argv4[] = { "import-gpt2", hf, "--out", "x", "--heads", "3" };
    ck_assert_int_eq(run_import(6, argv4), 2);
    const char *argv5[] = { "import-gpt2", hf };
    ck_assert_int_eq(run_import(2, argv5), 2);
}
END_TEST

START_TEST(import_rejects_foreign_files) {
    char p[600], err[512], out[600];
    snprintf(p, sizeof p, "%s/x.safetensors", dir);
    snprintf(out, sizeof out, "%s/o", dir);
    safetensors_writer *w = NULL;
    uint64_t s[2] = { 4, 4 };
    float v[16] = { 0 };
    ck_assert_int_eq(safetensors_writer_create(p, &w, err, sizeof err), 0);
    ck_assert_int_eq(safetensors_writer_declare(w, "encoder.layer.0.weight",
                                                SAFETENSORS_F32, 2, s, err, sizeof err),
                     0);
    ck_assert_int_eq(safetensors_writer_begin_data(w, err, sizeof err), 0);
    ck_assert_int_eq(safetensors_writer_write(w, v, sizeof v, err, sizeof err), 0);
    ck_assert_int_eq(safetensors_writer_finish(w, NULL, err, sizeof err), 0);
    const char *argv[] = { "import-gpt2", p, "--out", out };
    ck_assert_int_eq(run_import(4, argv), 2);
    ck_assert_int_ne(access(out, F_OK), 0);
}
END_TEST

/* ---- the run config in state.json ---------------------------------------- */

static void put_state(const char *ckdir, const char *text) {
    char p[700];
    snprintf(p, sizeof p, "%s/state.json", ckdir);
    FILE *fp = fopen(p, "w");
    ck_assert_ptr_nonnull(fp);
    fputs(text, fp);
    fclose(fp);
}

#define CFG_JSON                                                                        \
    "{\"model\": {\"vocab_size\": 256, \"context\": 32, \"layers\": 1, \"heads\": 2, "  \
    "\"width\": 8}, \"train\": {\"micro_batch\": 1, \"seq_len\": 8, \"max_steps\": 3, " \
    "\"lr\": 0.01}, \"data\": {\"tokenizer\": \"byte\", \"train\": \"/d/t_*.bin\", "    \
    "\"val\": \"/d/v_*.bin\"}}"

START_TEST(read_config_and_its_errors) {
    char ck[600], err[1024], tok[32];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    ck_assert_int_eq(mkdir(ck, 0755), 0);
    orch_config *c = NULL, *sentinel = (orch_config *)0x1;
    /* A checkpoint written by a run: config and tokenizer. */
    put_state(ck, "{\"step\": 3, \"tokenizer\": \"byte\", \"config\": " CFG_JSON "}");
    ck_assert_msg(ckpt_read_config(ck, &c, tok, sizeof tok, err, sizeof err) == 0, "%s",
                  err);
    ck_assert_str_eq(tok, "byte");
    ck_assert_uint_eq(c->model.width, 8);
    ck_assert_uint_eq(c->model.mlp_width, 32);
    ck_assert_str_eq(c->data.val, "/d/v_*.bin");
    config_free(c);
    /* Without "tokenizer" the config's data.tokenizer is used; tok may be NULL. */
    put_state(ck, "{\"config\": " CFG_JSON "}");
    tok[0] = 'x';
    ck_assert_int_eq(ckpt_read_config(ck, &c, tok, sizeof tok, err, sizeof err), 0);
    ck_assert_str_eq(tok, "byte");
    config_free(c);
    ck_assert_int_eq(ckpt_read_config(ck, &c, NULL, 0, err, sizeof err), 0);
    config_free(c);
    /* Each failure names state.json and the problem; *out is untouched. */
    static const struct {
        const char *text, *expect;
    } bad[] = {
        { NULL, "state.json: no such file or directory" },
        { "{not json", "state.json: not valid JSON (unexpected text at line 1, column " },
        { "", "state.json: not valid JSON (empty file at line 1, column 1)" },
        { "{\"config\": " CFG_JSON "}\n{}",
          "state.json: not valid JSON (unexpected text at line 2, column 1)" },
        { "{\"config\": " CFG_JSON,
          "state.json: not valid JSON (unexpected end at line 1" },
        /* JSON, but not an object: not "no config object". */
        { "[1, 2]", "state.json: not a JSON object (it holds an array)" },
        { "{\"config\": 7}", "state.json: no \"config\" object: it is a number" },
        { "{\"tokenizer\": 5, \"config\": " CFG_JSON "}",
          "state.json: tokenizer: expected a string, got a number" },
        { "{\"config\": {\"model\": {}}}",
          "state.json: config: model.vocab_size: missing required key" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char p[700];
        snprintf(p, sizeof p, "%s/state.json", ck);
        if (bad[i].text)
            put_state(ck, bad[i].text);
        else
            unlink(p);
        c = sentinel;
        ck_assert_int_eq(ckpt_read_config(ck, &c, tok, sizeof tok, err, sizeof err), -1);
        ck_assert_ptr_eq(c, sentinel);
        ck_assert_msg(strstr(err, bad[i].expect) && strstr(err, ck), "case %zu: '%s'", i,
                      err);
    }
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("checkpoint");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, round_trip_and_layout);
    tcase_add_test(tc, weights_only_and_mismatches);
    tcase_add_test(tc, layout_metadata_old_and_foreign);
    tcase_add_test(tc, retention_keeps_last_k_and_best);
    tcase_add_test(tc, stale_temp_dirs_ignored_and_cleaned);
    tcase_add_test(tc, failed_save_changes_nothing);
    tcase_add_test(tc, resave_same_step_replaces_atomically);
    tcase_add_loop_test(tc, corrupt_latest_falls_back, 0,
                        (int)(sizeof damage / sizeof damage[0]));
    tcase_add_test(tc, latest_file_problems);
    tcase_add_test(tc, cross_engine_load);
    tcase_add_test(tc, import_gpt2_round_trip);
    tcase_add_test(tc, import_rejects_foreign_files);
    tcase_add_test(tc, read_config_and_its_errors);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return test_run_suite(suite()); }
