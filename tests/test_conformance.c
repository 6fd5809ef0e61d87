/*
 * test_conformance.c - the engine conformance suite: checks that every engine
 * library present behaves as engine_api/orch_engine.h promises, without
 * assuming any engine's numerics.
 *
 * Engines: every $ORCH_BUILD/libengine_*.so (ORCH_BUILD defaults to the
 * directory above this binary), or the names listed in
 * ORCH_CONFORMANCE_ENGINES (comma/space separated: "mock,cpu" or paths). An
 * engine whose probe() says it cannot run here is skipped with one printed
 * line (if that leaves none, the mock runs); any other load failure fails
 * the suite. Each test is a Check loop test over the loaded engines (fork
 * mode: a crash fails one test).
 *
 * Model: a tiny GPT-2 (vocab 200, context 64, 2 layers, 2 heads, width 32,
 * test_model_desc's defaults) so numeric engines run it in milliseconds.
 */
#include <check.h>
#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_api/orch_engine.h"
#include "orchestrator/core/engine_loader.h"
#include "tests/test_util.h"

#define MAX_ENGINES 16
#define V           200u
#define T           64u
#define L           2u
#define H           2u
#define C           32u
#define N_TENSORS   (2u + 12u * L + 2u)
#define SEED        1234u

typedef struct conf_engine {
    char label[256];
    engine_handle h;
} conf_engine;

static conf_engine engines[MAX_ENGINES];
static int n_engines;
static char load_failures[4096];

/* ------------------------------------------------------------------------- */
/* Helpers                                                                    */
/* ------------------------------------------------------------------------- */

#define ENG   (&engines[_i])
#define API   (engines[_i].h.api)
#define ENAME (engines[_i].label)

static orch_engine_ctx *make_ctx_seed(const conf_engine *e, uint64_t seed) {
    orch_model_desc m = test_model_desc(V, T, L, H, C);
    orch_engine_ctx *ctx = NULL;
    char err[1024];
    int rc = engine_create_context(&e->h, &m, 1, seed, NULL, &ctx, err, sizeof err);
    ck_assert_msg(rc == 0, "%s: %s", e->label, err);
    ck_assert_ptr_nonnull(ctx);
    return ctx;
}
static orch_engine_ctx *make_ctx(const conf_engine *e) { return make_ctx_seed(e, SEED); }

static void expect_error(const conf_engine *e, orch_engine_ctx *ctx, int32_t st,
                         const char *what) {
    ck_assert_msg(st != ORCH_OK, "%s: %s was accepted", e->label, what);
    const char *le = e->h.api->last_error(ctx);
    ck_assert_msg(le != NULL && *le, "%s: %s failed (%d) without last_error", e->label,
                  what, st);
}

static uint64_t rng_state = 88172645463325252ull;
static float rnd_float(void) { /* [-1, 1) */
    double u = (double)(test_xorshift64(&rng_state) >> 11) / 9007199254740992.0;
    return (float)(u * 2.0 - 1.0);
}

/* The table of `kind`, with the tiny model's tensor count. */
static void read_table(const conf_engine *e, orch_engine_ctx *ctx, uint32_t kind,
                       test_table *t) {
    test_read_table(e->h.api, ctx, kind, t);
    ck_assert_msg(t->n == N_TENSORS, "%s: %u tensors, expected %u", e->label, t->n,
                  N_TENSORS);
}

static uint64_t total_params(const conf_engine *e, orch_engine_ctx *ctx) {
    test_table t;
    read_table(e, ctx, ORCH_TENSOR_PARAM, &t);
    return t.total;
}

/* A fixed training batch: B x S tokens, targets = next token. */
#define TB 2u
#define TS 16u
static void train_batch(int32_t *tok, int32_t *tgt) {
    uint64_t s = 42;
    for (uint32_t i = 0; i < TB * TS + 1; i++) {
        int32_t v = (int32_t)((test_lcg64(&s) >> 33) % V);
        if (i < TB * TS) tok[i] = v;
        if (i > 0) tgt[i - 1] = v;
    }
}

static int need(const conf_engine *e, uint64_t cap, const char *what) {
    if (e->h.api->capabilities & cap) return 1;
    printf("%s: no %s capability, test skipped\n", e->label, what);
    return 0;
}

/* ------------------------------------------------------------------------- */
/* Lifecycle, errors, status strings                                          */
/* ------------------------------------------------------------------------- */

START_TEST(test_lifecycle) {
    for (int k = 0; k < 4; k++) {
        orch_engine_ctx *ctx = make_ctx_seed(ENG, (uint64_t)k);
        uint32_t n = 0;
        ck_assert_int_eq(API->tensor_count(ctx, ORCH_TENSOR_PARAM, &n), ORCH_OK);
        ck_assert_uint_eq(n, N_TENSORS);
        API->context_destroy(ctx);
    }
    /* Two live at once. */
    orch_engine_ctx *a = make_ctx(ENG), *b = make_ctx(ENG);
    ck_assert_ptr_ne(a, b);
    API->context_destroy(b);
    API->context_destroy(a);
    API->context_destroy(NULL);
}
END_TEST

START_TEST(test_bad_model_rejected) {
    struct {
        const char *what;
        orch_model_desc m;
    } cases[8];
    int n = 0;
    orch_model_desc base = test_model_desc(V, T, L, H, C);
    cases[n].what = "heads not dividing width", cases[n].m = base, cases[n++].m.heads = 3;
    cases[n].what = "vocab 0", cases[n].m = base, cases[n++].m.vocab_size = 0;
    cases[n].what = "width 0", cases[n].m = base, cases[n++].m.width = 0;
    cases[n].what = "layers 0", cases[n].m = base, cases[n++].m.layers = 0;
    cases[n].what = "context 0", cases[n].m = base, cases[n++].m.context = 0;
    cases[n].what = "heads 0", cases[n].m = base, cases[n++].m.heads = 0;
    cases[n].what = "arch 99", cases[n].m = base, cases[n++].m.arch = 99;
    cases[n].what = "kv_heads != heads", cases[n].m = base, cases[n++].m.kv_heads = 1;
    for (int i = 0; i < n; i++) {
        orch_engine_options o = { sizeof o, 1, SEED, NULL };
        orch_engine_ctx *sentinel = (orch_engine_ctx *)&cases[i];
        orch_engine_ctx *ctx = sentinel;
        char err[512];
        memset(err, 0, sizeof err);
        int32_t st = API->context_create(&cases[i].m, &o, &ctx, err, sizeof err);
        ck_assert_msg(st != ORCH_OK, "%s: %s accepted", ENAME, cases[i].what);
        ck_assert_msg(ctx == sentinel, "%s: %s: out_ctx changed on failure", ENAME,
                      cases[i].what);
        ck_assert_msg(err[0] != '\0', "%s: %s: no error message", ENAME, cases[i].what);
    }
    /* NULL model, and a tiny err buffer is respected. */
    orch_engine_options o = { sizeof o, 1, SEED, NULL };
    orch_engine_ctx *ctx = NULL;
    char small[4] = { 'x', 'x', 'x', 'x' };
    ck_assert_int_ne(API->context_create(NULL, &o, &ctx, small, 3), ORCH_OK);
    ck_assert_ptr_null(ctx);
    ck_assert_int_eq(small[3], 'x');
    ck_assert_msg(memchr(small, '\0', 3) != NULL, "%s: err not terminated", ENAME);
}
END_TEST

START_TEST(test_unknown_option_rejected) {
    orch_model_desc m = test_model_desc(V, T, L, H, C);
    orch_engine_options o = { sizeof o, 1, SEED, "surely_not_an_option_key=1" };
    orch_engine_ctx *ctx = NULL;
    char err[512] = "";
    int32_t st = API->context_create(&m, &o, &ctx, err, sizeof err);
    ck_assert_msg(st == ORCH_ERR_INVALID_ARGUMENT, "%s: unknown option gave %d", ENAME,
                  st);
    ck_assert_ptr_null(ctx);
    ck_assert_msg(err[0] != '\0', "%s: no message", ENAME);
}
END_TEST

START_TEST(test_last_error) {
    orch_engine_ctx *ctx = make_ctx(ENG);
    const char *le = API->last_error(ctx);
    ck_assert_ptr_nonnull(le);
    ck_assert_msg(le[0] == '\0', "%s: fresh context has last_error '%s'", ENAME, le);

    uint32_t count = 777;
    expect_error(ENG, ctx, API->tensor_count(ctx, 99, &count), "tensor kind 99");
    ck_assert_uint_eq(count, 777);

    orch_tensor_info info, copy;
    memset(&info, 0xAB, sizeof info);
    info.struct_size = sizeof info;
    copy = info;
    expect_error(ENG, ctx, API->tensor_info(ctx, ORCH_TENSOR_PARAM, N_TENSORS, &info),
                 "tensor index past the end");
    ck_assert_msg(memcmp(&info, &copy, sizeof info) == 0,
                  "%s: tensor_info changed its out-param on failure", ENAME);

    float buf[4] = { 1, 2, 3, 4 };
    expect_error(ENG, ctx, API->tensor_read(ctx, ORCH_TENSOR_PARAM, 0, buf, sizeof buf),
                 "tensor_read with the wrong byte count");
    ck_assert(buf[0] == 1 && buf[3] == 4);

    if (API->capabilities & ORCH_CAP_TRAIN) {
        uint64_t n = total_params(ENG, ctx);
        expect_error(ENG, ctx, API->grads_read(ctx, n - 1, 2, buf),
                     "grads_read past the end");
        ck_assert(buf[0] == 1 && buf[1] == 2);
        float loss = 99.0f;
        int32_t tok[2] = { 1, 2 }, tgt[2] = { 2, (int32_t)V };
        expect_error(ENG, ctx, API->forward_backward(ctx, tok, tgt, 1, 2, 1.0f, &loss),
                     "target out of range");
        ck_assert(loss == 99.0f);
    }
    /* Still usable after errors. */
    ck_assert_int_eq(API->tensor_count(ctx, ORCH_TENSOR_PARAM, &count), ORCH_OK);
    ck_assert_uint_eq(count, N_TENSORS);
    API->context_destroy(ctx);
}
END_TEST

START_TEST(test_status_strings) {
    const char *seen[ORCH_STATUS_COUNT_V1];
    for (int32_t s = 0; s < ORCH_STATUS_COUNT_V1; s++) {
        const char *str = API->status_string(s);
        ck_assert_msg(str && *str, "%s: empty status string for %d", ENAME, s);
        for (int32_t k = 0; k < s; k++)
            ck_assert_msg(strcmp(seen[k], str) != 0, "%s: codes %d and %d share '%s'",
                          ENAME, k, s, str);
        seen[s] = str;
    }
    const int32_t unknown[] = { ORCH_STATUS_COUNT_V1, -1, 12345, INT32_MIN };
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        const char *str = API->status_string(unknown[i]);
        ck_assert_ptr_nonnull(str);
        ck_assert_msg(strstr(str, "unknown") != NULL,
                      "%s: status %d gives '%s', expected 'unknown status'", ENAME,
                      unknown[i], str);
    }
    char msg[256] = "";
    ck_assert_int_eq(API->probe(msg, sizeof msg), ORCH_OK);
    ck_assert_msg(msg[0] != '\0', "%s: probe gave no message", ENAME);
    ck_assert_msg(API->name && *API->name && API->version && *API->version,
                  "%s: table lacks name/version", ENAME);
}
END_TEST

/* ------------------------------------------------------------------------- */
/* Tensor tables                                                              */
/* ------------------------------------------------------------------------- */

/* Expected GPT-2 table entry i. */
static void expected_entry(uint32_t i, char *name, size_t cap, uint32_t *ndim,
                           uint64_t shape[2]) {
    const uint64_t M = 4 * C;
    if (i == 0) {
        snprintf(name, cap, "wte.weight"), *ndim = 2, shape[0] = V, shape[1] = C;
        return;
    }
    if (i == 1) {
        snprintf(name, cap, "wpe.weight"), *ndim = 2, shape[0] = T, shape[1] = C;
        return;
    }
    if (i >= 2 + 12 * L) {
        snprintf(name, cap, i == 2 + 12 * L ? "ln_f.weight" : "ln_f.bias");
        *ndim = 1, shape[0] = C;
        return;
    }
    static const struct {
        const char *suffix;
        uint32_t ndim;
        uint64_t a, b; /* in units: 0 -> C, 1 -> 3C, 2 -> M */
    } layer[12] = { { "ln_1.weight", 1, 0, 0 },        { "ln_1.bias", 1, 0, 0 },
                    { "attn.c_attn.weight", 2, 1, 0 }, { "attn.c_attn.bias", 1, 1, 0 },
                    { "attn.c_proj.weight", 2, 0, 0 }, { "attn.c_proj.bias", 1, 0, 0 },
                    { "ln_2.weight", 1, 0, 0 },        { "ln_2.bias", 1, 0, 0 },
                    { "mlp.c_fc.weight", 2, 2, 0 },    { "mlp.c_fc.bias", 1, 2, 0 },
                    { "mlp.c_proj.weight", 2, 0, 2 },  { "mlp.c_proj.bias", 1, 0, 0 } };
    const uint64_t unit[3] = { C, 3 * C, M };
    uint32_t l = (i - 2) / 12, k = (i - 2) % 12;
    snprintf(name, cap, "h.%u.%s", l, layer[k].suffix);
    *ndim = layer[k].ndim;
    shape[0] = unit[layer[k].a];
    shape[1] = unit[layer[k].b];
}

START_TEST(test_tensor_table) {
    orch_engine_ctx *ctx = make_ctx(ENG);
    test_table kinds[3];
    for (uint32_t kind = 0; kind < 3; kind++) {
        test_table *t = &kinds[kind];
        read_table(ENG, ctx, kind, t);
        uint64_t off = 0;
        for (uint32_t i = 0; i < t->n; i++) {
            const orch_tensor_info *ti = &t->info[i];
            char name[64];
            uint32_t ndim;
            uint64_t shape[2];
            expected_entry(i, name, sizeof name, &ndim, shape);
            ck_assert_msg(strcmp(ti->name, name) == 0,
                          "%s: tensor %u is '%s', expected '%s'", ENAME, i, ti->name,
                          name);
            ck_assert_msg(ti->ndim == ndim, "%s: %s ndim %u", ENAME, name, ti->ndim);
            ck_assert_msg(
                ti->shape[0] == shape[0] && (ndim == 1 || ti->shape[1] == shape[1]),
                "%s: %s shape [%llu,%llu]", ENAME, name, (unsigned long long)ti->shape[0],
                (unsigned long long)ti->shape[1]);
            ck_assert_uint_eq(ti->numel, ndim == 1 ? shape[0] : shape[0] * shape[1]);
            ck_assert_uint_eq(ti->dtype, ORCH_DTYPE_F32);
            ck_assert_msg(ti->offset == off, "%s: %s offset %llu, expected %llu", ENAME,
                          name, (unsigned long long)ti->offset, (unsigned long long)off);
            int no_decay = (ti->flags & ORCH_TENSOR_FLAG_NO_DECAY) != 0;
            ck_assert_msg(no_decay == (ndim == 1), "%s: %s NO_DECAY flag is %d", ENAME,
                          name, no_decay);
            off += ti->numel;
            if (kind > 0) {
                const orch_tensor_info *p = &kinds[0].info[i];
                ck_assert_msg(strcmp(p->name, ti->name) == 0 && p->numel == ti->numel &&
                                  p->offset == ti->offset,
                              "%s: kind %u table differs from the parameter table at %u",
                              ENAME, kind, i);
            }
        }
        ck_assert_uint_eq(t->total, off);
    }
    API->context_destroy(ctx);
}
END_TEST

START_TEST(test_tensor_init) {
    orch_engine_ctx *ctx = make_ctx(ENG);
    test_table t;
    read_table(ENG, ctx, ORCH_TENSOR_PARAM, &t);
    float *p = test_read_kind(API, ctx, ORCH_TENSOR_PARAM, &t);
    for (uint32_t i = 0; i < t.n; i++) {
        const orch_tensor_info *ti = &t.info[i];
        const float *x = p + ti->offset;
        const char *nm = ti->name;
        size_t len = strlen(nm);
        int is_bias = len > 5 && strcmp(nm + len - 5, ".bias") == 0;
        if (ti->ndim == 1) {
            float want = is_bias ? 0.0f : 1.0f;
            for (uint64_t j = 0; j < ti->numel; j++)
                ck_assert_msg(x[j] == want, "%s: %s[%llu] = %g, expected %g", ENAME, nm,
                              (unsigned long long)j, (double)x[j], (double)want);
        } else {
            double s = 0, s2 = 0;
            for (uint64_t j = 0; j < ti->numel; j++) s += x[j], s2 += (double)x[j] * x[j];
            double mean = s / (double)ti->numel;
            double sd = sqrt(s2 / (double)ti->numel - mean * mean);
            int resid = strstr(nm, "c_proj.weight") != NULL;
            double want = resid ? 0.02 / sqrt(2.0 * L) : 0.02;
            ck_assert_msg(fabs(sd - want) < 0.25 * want && fabs(mean) < 0.25 * want,
                          "%s: %s has mean %g sd %g, expected N(0, %g)", ENAME, nm, mean,
                          sd, want);
        }
    }
    free(p);
    for (uint32_t kind = 1; kind < 3; kind++) {
        float *m = test_read_kind(API, ctx, kind, &t);
        for (uint64_t j = 0; j < t.total; j++)
            ck_assert_msg(m[j] == 0.0f, "%s: moment kind %u not zero at %llu", ENAME,
                          kind, (unsigned long long)j);
        free(m);
    }
    if (API->capabilities & ORCH_CAP_TRAIN) {
        float *g = test_read_grads(API, ctx, t.total);
        for (uint64_t j = 0; j < t.total; j++) ck_assert(g[j] == 0.0f);
        free(g);
    }
    API->context_destroy(ctx);
}
END_TEST

START_TEST(test_tensor_roundtrip) {
    orch_engine_ctx *ctx = make_ctx(ENG);
    test_table t;
    read_table(ENG, ctx, ORCH_TENSOR_PARAM, &t);
    float *want[3];
    for (uint32_t kind = 0; kind < 3; kind++) {
        want[kind] = malloc(t.total * sizeof(float));
        for (uint64_t j = 0; j < t.total; j++)
            want[kind][j] = kind == 2 ? fabsf(rnd_float()) : rnd_float();
        for (uint32_t i = 0; i < t.n; i++) {
            int32_t st = API->tensor_write(ctx, kind, i, want[kind] + t.info[i].offset,
                                           t.info[i].numel * sizeof(float));
            ck_assert_msg(st == ORCH_OK, "%s: tensor_write: %s", ENAME,
                          API->last_error(ctx));
        }
    }
    for (uint32_t kind = 0; kind < 3; kind++) {
        float *got = test_read_kind(API, ctx, kind, &t);
        ck_assert_msg(memcmp(got, want[kind], t.total * sizeof(float)) == 0,
                      "%s: kind %u did not round-trip", ENAME, kind);
        free(got);
    }
    /* Wrong sizes and NULL buffers are rejected and change nothing. */
    const orch_tensor_info *ti = &t.info[2];
    uint64_t bytes = ti->numel * sizeof(float);
    float *junk = calloc(ti->numel + 1, sizeof(float));
    expect_error(ENG, ctx, API->tensor_write(ctx, 0, 2, junk, bytes - 4), "short write");
    expect_error(ENG, ctx, API->tensor_write(ctx, 0, 2, junk, bytes + 4), "long write");
    expect_error(ENG, ctx, API->tensor_write(ctx, 0, 2, junk, 0), "empty write");
    expect_error(ENG, ctx, API->tensor_write(ctx, 0, 2, NULL, bytes), "NULL write");
    expect_error(ENG, ctx, API->tensor_write(ctx, 3, 2, junk, bytes), "write of kind 3");
    expect_error(ENG, ctx, API->tensor_read(ctx, 0, 2, junk, bytes + 4), "long read");
    expect_error(ENG, ctx, API->tensor_read(ctx, 0, 2, NULL, bytes), "NULL read");
    float *got = test_read_kind(API, ctx, 0, &t);
    ck_assert_msg(memcmp(got, want[0], t.total * sizeof(float)) == 0,
                  "%s: a rejected write changed the parameters", ENAME);
    free(got);
    free(junk);
    for (int k = 0; k < 3; k++) free(want[k]);
    API->context_destroy(ctx);
}
END_TEST

/* ------------------------------------------------------------------------- */
/* Training                                                                   */
/* ------------------------------------------------------------------------- */

START_TEST(test_grads_flat) {
    if (!need(ENG, ORCH_CAP_TRAIN, "train")) return;
    orch_engine_ctx *ctx = make_ctx(ENG);
    test_table t;
    read_table(ENG, ctx, ORCH_TENSOR_PARAM, &t);
    uint64_t n = t.total;
    float *src = malloc(n * sizeof(float));
    for (uint64_t j = 0; j < n; j++) src[j] = rnd_float();
    ck_assert_int_eq(API->grads_write(ctx, 0, n, src), ORCH_OK);
    float *g = test_read_grads(API, ctx, n);
    ck_assert_msg(memcmp(g, src, n * sizeof(float)) == 0, "%s: grads did not round-trip",
                  ENAME);
    /* Per-tensor slices at the table's offsets. */
    for (uint32_t i = 0; i < t.n; i++) {
        float *part = malloc(t.info[i].numel * sizeof(float));
        ck_assert_int_eq(API->grads_read(ctx, t.info[i].offset, t.info[i].numel, part),
                         ORCH_OK);
        ck_assert(memcmp(part, src + t.info[i].offset, t.info[i].numel * sizeof(float)) ==
                  0);
        free(part);
    }
    /* Partial write in the middle. */
    float patch[5] = { 1, 2, 3, 4, 5 };
    ck_assert_int_eq(API->grads_write(ctx, 100, 5, patch), ORCH_OK);
    memcpy(src + 100, patch, sizeof patch);
    free(g);
    g = test_read_grads(API, ctx, n);
    ck_assert(memcmp(g, src, n * sizeof(float)) == 0);
    /* Out of range. */
    expect_error(ENG, ctx, API->grads_write(ctx, n, 1, patch), "grads_write at the end");
    expect_error(ENG, ctx, API->grads_write(ctx, n - 2, 5, patch),
                 "grads_write past the end");
    expect_error(ENG, ctx, API->grads_read(ctx, UINT64_MAX, 2, patch),
                 "grads_read at 2^64-1");
    expect_error(ENG, ctx, API->grads_read(ctx, 0, n, NULL), "grads_read into NULL");
    /* Zero. */
    ck_assert_int_eq(API->grads_zero(ctx), ORCH_OK);
    free(g);
    g = test_read_grads(API, ctx, n);
    for (uint64_t j = 0; j < n; j++) ck_assert(g[j] == 0.0f);
    free(g);
    free(src);
    API->context_destroy(ctx);
}
END_TEST

START_TEST(test_forward_backward_accumulates) {
    if (!need(ENG, ORCH_CAP_TRAIN, "train")) return;
    orch_engine_ctx *ctx = make_ctx(ENG);
    uint64_t n = total_params(ENG, ctx);
    int32_t tok[TB * TS], tgt[TB * TS];
    train_batch(tok, tgt);
    float l1 = -1, l2 = -1;
    ck_assert_int_eq(API->grads_zero(ctx), ORCH_OK);
    ck_assert_msg(API->forward_backward(ctx, tok, tgt, TB, TS, 1.0f, &l1) == ORCH_OK,
                  "%s: %s", ENAME, API->last_error(ctx));
    ck_assert_msg(isfinite(l1) && l1 > 0, "%s: loss %g", ENAME, (double)l1);
    ck_assert_msg(fabs(l1 - log((double)V)) < 0.5,
                  "%s: initial loss %g far from ln(V) = %g", ENAME, (double)l1,
                  log((double)V));
    float *g1 = test_read_grads(API, ctx, n);
    double norm = 0;
    float gmax = 0;
    for (uint64_t j = 0; j < n; j++)
        norm += (double)g1[j] * g1[j], gmax = fmaxf(gmax, fabsf(g1[j]));
    ck_assert_msg(norm > 0, "%s: forward_backward added no gradient", ENAME);

    ck_assert_int_eq(API->forward_backward(ctx, tok, tgt, TB, TS, 1.0f, &l2), ORCH_OK);
    ck_assert_msg(test_close(l1, l2, 1e-6f, 0),
                  "%s: loss changed %g -> %g without a step", ENAME, (double)l1,
                  (double)l2);
    float *g2 = test_read_grads(API, ctx, n);
    for (uint64_t j = 0; j < n; j++)
        ck_assert_msg(test_close(g2[j], 2 * g1[j], 1e-4f, 1e-6f * gmax),
                      "%s: two calls gave %g at %llu, one call %g", ENAME, (double)g2[j],
                      (unsigned long long)j, (double)g1[j]);
    /* grad_scale scales what is added. */
    ck_assert_int_eq(API->grads_zero(ctx), ORCH_OK);
    ck_assert_int_eq(API->forward_backward(ctx, tok, tgt, TB, TS, 0.25f, &l2), ORCH_OK);
    free(g2);
    g2 = test_read_grads(API, ctx, n);
    for (uint64_t j = 0; j < n; j++)
        ck_assert_msg(test_close(g2[j], 0.25f * g1[j], 1e-4f, 1e-6f * gmax),
                      "%s: grad_scale 0.25 gave %g at %llu, scale 1 %g", ENAME,
                      (double)g2[j], (unsigned long long)j, (double)g1[j]);
    free(g1);
    free(g2);
    API->context_destroy(ctx);
}
END_TEST

START_TEST(test_ignored_targets) {
    if (!need(ENG, ORCH_CAP_TRAIN, "train")) return;
    orch_engine_ctx *ctx = make_ctx(ENG);
    uint64_t n = total_params(ENG, ctx);
    int32_t tok[TB * TS], tgt[TB * TS];
    train_batch(tok, tgt);
    float l_one, l_two;
    ck_assert_int_eq(API->grads_zero(ctx), ORCH_OK);
    ck_assert_int_eq(API->forward_backward(ctx, tok, tgt, 1, TS, 1.0f, &l_one), ORCH_OK);
    float *g_one = test_read_grads(API, ctx, n);
    /* Row 1 fully ignored: same loss and gradient as row 0 alone. */
    for (uint32_t j = TS; j < TB * TS; j++) tgt[j] = -1;
    ck_assert_int_eq(API->grads_zero(ctx), ORCH_OK);
    ck_assert_int_eq(API->forward_backward(ctx, tok, tgt, TB, TS, 1.0f, &l_two), ORCH_OK);
    float *g_two = test_read_grads(API, ctx, n);
    ck_assert_msg(test_close(l_one, l_two, 1e-5f, 0), "%s: %g vs %g", ENAME,
                  (double)l_one, (double)l_two);
    float gmax = 0;
    for (uint64_t j = 0; j < n; j++) gmax = fmaxf(gmax, fabsf(g_one[j]));
    for (uint64_t j = 0; j < n; j++)
        ck_assert_msg(test_close(g_one[j], g_two[j], 1e-4f, 1e-6f * gmax),
                      "%s: gradient %llu differs with an ignored row", ENAME,
                      (unsigned long long)j);
    free(g_one);
    free(g_two);
    API->context_destroy(ctx);
}
END_TEST

START_TEST(test_eval_loss_matches) {
    if (!need(ENG, ORCH_CAP_EVAL, "eval") || !need(ENG, ORCH_CAP_TRAIN, "train")) return;
    orch_engine_ctx *ctx = make_ctx(ENG);
    uint64_t n = total_params(ENG, ctx);
    int32_t tok[TB * TS], tgt[TB * TS];
    train_batch(tok, tgt);
    tgt[3] = -1;
    float fb, ev = -1;
    ck_assert_int_eq(API->grads_zero(ctx), ORCH_OK);
    ck_assert_int_eq(API->forward_backward(ctx, tok, tgt, TB, TS, 1.0f, &fb), ORCH_OK);
    float *before = test_read_grads(API, ctx, n);
    ck_assert_msg(API->eval_loss(ctx, tok, tgt, TB, TS, &ev) == ORCH_OK, "%s: %s", ENAME,
                  API->last_error(ctx));
    ck_assert_msg(test_close(fb, ev, 1e-5f, 0), "%s: eval %g vs forward_backward %g",
                  ENAME, (double)ev, (double)fb);
    float *after = test_read_grads(API, ctx, n);
    ck_assert_msg(memcmp(before, after, n * sizeof(float)) == 0,
                  "%s: eval_loss touched the gradients", ENAME);
    float keep = 5.0f;
    tok[0] = (int32_t)V;
    expect_error(ENG, ctx, API->eval_loss(ctx, tok, tgt, TB, TS, &keep),
                 "token == vocab");
    ck_assert(keep == 5.0f);
    free(before);
    free(after);
    API->context_destroy(ctx);
}
END_TEST

/* AdamW with the suite's betas, eps and weight decay 0.1. */
static orch_adamw_params adamw(uint64_t step, float lr, float clip) {
    return test_adamw(step, lr, 0.1f, clip);
}

START_TEST(test_optimizer_lowers_loss) {
    if (!need(ENG, ORCH_CAP_TRAIN, "train")) return;
    orch_engine_ctx *ctx = make_ctx(ENG);
    test_table t;
    read_table(ENG, ctx, ORCH_TENSOR_PARAM, &t);
    int32_t tok[TB * TS], tgt[TB * TS];
    train_batch(tok, tgt);
    float first = 0, loss = 0;
    for (uint64_t step = 1; step <= 8; step++) {
        ck_assert_int_eq(API->grads_zero(ctx), ORCH_OK);
        ck_assert_int_eq(API->forward_backward(ctx, tok, tgt, TB, TS, 1.0f, &loss),
                         ORCH_OK);
        if (step == 1) first = loss;
        float *g = test_read_grads(API, ctx, t.total);
        double sq = 0;
        for (uint64_t j = 0; j < t.total; j++) sq += (double)g[j] * g[j];
        free(g);
        float norm = -1;
        orch_adamw_params p = adamw(step, 1e-2f, 0.0f);
        ck_assert_msg(API->optimizer_step(ctx, &p, &norm) == ORCH_OK, "%s: %s", ENAME,
                      API->last_error(ctx));
        ck_assert_msg(test_close(norm, (float)sqrt(sq), 1e-4f, 0),
                      "%s: step %llu norm %g, gradients say %g", ENAME,
                      (unsigned long long)step, (double)norm, sqrt(sq));
    }
    ck_assert_int_eq(API->forward_backward(ctx, tok, tgt, TB, TS, 1.0f, &loss), ORCH_OK);
    ck_assert_msg(loss < first - 0.05f, "%s: loss %g -> %g after 8 AdamW steps", ENAME,
                  (double)first, (double)loss);
    /* The first moments moved. */
    float *m = test_read_kind(API, ctx, ORCH_TENSOR_ADAM_M, &t);
    int nonzero = 0;
    for (uint64_t j = 0; j < t.total; j++) nonzero |= m[j] != 0.0f;
    ck_assert_msg(nonzero, "%s: AdamW left the first moments at zero", ENAME);
    free(m);
    /* NULL norm pointer is allowed. */
    orch_adamw_params p = adamw(9, 1e-3f, 1.0f);
    ck_assert_int_eq(API->optimizer_step(ctx, &p, NULL), ORCH_OK);
    API->context_destroy(ctx);
}
END_TEST

START_TEST(test_optimizer_nonfinite) {
    if (!need(ENG, ORCH_CAP_TRAIN, "train")) return;
    orch_engine_ctx *ctx = make_ctx(ENG);
    test_table t;
    read_table(ENG, ctx, ORCH_TENSOR_PARAM, &t);
    int32_t tok[TB * TS], tgt[TB * TS];
    train_batch(tok, tgt);
    float loss;
    ck_assert_int_eq(API->forward_backward(ctx, tok, tgt, TB, TS, 1.0f, &loss), ORCH_OK);
    float nan = NAN;
    ck_assert_int_eq(API->grads_write(ctx, 7, 1, &nan), ORCH_OK);
    float *p0 = test_read_kind(API, ctx, ORCH_TENSOR_PARAM, &t);
    float *m0 = test_read_kind(API, ctx, ORCH_TENSOR_ADAM_M, &t);
    float norm = 123.0f;
    orch_adamw_params p = adamw(1, 1e-2f, 1.0f);
    int32_t st = API->optimizer_step(ctx, &p, &norm);
    ck_assert_msg(st == ORCH_ERR_NUMERIC, "%s: NaN gradient gave status %d", ENAME, st);
    ck_assert(*API->last_error(ctx));
    ck_assert(norm == 123.0f);
    float *p1 = test_read_kind(API, ctx, ORCH_TENSOR_PARAM, &t);
    float *m1 = test_read_kind(API, ctx, ORCH_TENSOR_ADAM_M, &t);
    ck_assert_msg(memcmp(p0, p1, t.total * sizeof(float)) == 0 &&
                      memcmp(m0, m1, t.total * sizeof(float)) == 0,
                  "%s: a failed step changed the state", ENAME);
    float inf = INFINITY;
    ck_assert_int_eq(API->grads_write(ctx, 7, 1, &inf), ORCH_OK);
    ck_assert_int_eq(API->optimizer_step(ctx, &p, &norm), ORCH_ERR_NUMERIC);
    expect_error(ENG, ctx, API->optimizer_step(ctx, NULL, &norm), "NULL AdamW params");
    free(p0);
    free(p1);
    free(m0);
    free(m1);
    API->context_destroy(ctx);
}
END_TEST

/* ------------------------------------------------------------------------- */
/* ABI 1.3: gradient-ready notification                                       */
/* ------------------------------------------------------------------------- */

static int need_notify(const conf_engine *e) {
    const orch_engine_api *api = e->h.api;
    if (ORCH_API_HAS(api, forward_backward_notify))
        return need(e, ORCH_CAP_TRAIN, "train");
    printf("%s: no forward_backward_notify (ABI %u.%u), test skipped\n", e->label,
           api->abi_major, api->abi_minor);
    return 0;
}

/* Two contexts from one seed: forward_backward on one, then a second
 * micro-batch with forward_backward on one and forward_backward_notify on the
 * other (so the notified gradients are accumulated ones). Ranges: disjoint,
 * covering, each range final when reported (grads_read in the callback),
 * reported last tensor first down to the embeddings (the tied head's wte is
 * element 0, final only at the end), at least one per layer plus the final
 * norm and the embeddings; loss and gradients bit-equal. Then ready NULL,
 * a batch without counted targets (still covers everything once) and a
 * rejected call. */
START_TEST(test_forward_backward_notify) {
    if (!need_notify(ENG)) return;
    orch_engine_ctx *a = make_ctx(ENG), *b = make_ctx(ENG);
    const uint64_t n = total_params(ENG, a);
    int32_t tok[TB * TS], tgt[TB * TS];
    train_batch(tok, tgt);
    float la = 0, lb = 0;
    ck_assert_int_eq(API->grads_zero(a), ORCH_OK);
    ck_assert_int_eq(API->grads_zero(b), ORCH_OK);
    ck_assert_int_eq(API->forward_backward(a, tok, tgt, TB, TS, 0.5f, &la), ORCH_OK);
    ck_assert_int_eq(API->forward_backward(b, tok, tgt, TB, TS, 0.5f, &lb), ORCH_OK);
    for (uint32_t j = 0; j < TB * TS; j++) tok[j] = (tok[j] + 7) % (int32_t)V;
    test_notify_log *lg = malloc(sizeof *lg);
    ck_assert_ptr_nonnull(lg);
    uint32_t r = test_notify_check(API, a, b, tok, tgt, TB, TS, 0.5f, n, lg);
    ck_assert_msg(r >= L + 2,
                  "%s: %u ranges, expected at least one per layer, the final "
                  "norm and the embeddings",
                  ENAME, r);
    test_notify_descending(API, lg);
    ck_assert_msg(lg->off[0] + lg->cnt[0] == n,
                  "%s: the first range does not hold the "
                  "final norm (the end of the buffer)",
                  ENAME);
    ck_assert_msg(lg->off[r - 1] == 0, "%s: the last range does not hold wte", ENAME);

    /* ready NULL: exactly forward_backward. */
    float l1 = 0, l2 = 0;
    ck_assert_int_eq(API->forward_backward(a, tok, tgt, TB, TS, 1.0f, &l1), ORCH_OK);
    ck_assert_int_eq(
        API->forward_backward_notify(b, tok, tgt, TB, TS, 1.0f, &l2, NULL, NULL),
        ORCH_OK);
    ck_assert_msg(memcmp(&l1, &l2, sizeof l1) == 0, "%s: ready NULL: loss %g vs %g",
                  ENAME, (double)l2, (double)l1);
    float *ga = test_read_grads(API, a, n), *gb = test_read_grads(API, b, n);
    ck_assert_msg(memcmp(ga, gb, n * sizeof(float)) == 0,
                  "%s: ready NULL gives other gradients than forward_backward", ENAME);
    free(ga);
    free(gb);

    /* No counted target: no gradient, but every element is still reported. */
    for (uint32_t j = 0; j < TB * TS; j++) tgt[j] = -1;
    r = test_notify_check(API, a, b, tok, tgt, TB, TS, 1.0f, n, lg);
    ck_assert_msg(r >= 1, "%s: no range for a batch without targets", ENAME);

    /* A rejected call: an error with a message, no loss written. */
    float keep = 5.0f;
    tok[0] = (int32_t)V;
    tgt[0] = 1;
    expect_error(ENG, b,
                 API->forward_backward_notify(b, tok, tgt, TB, TS, 1.0f, &keep,
                                              test_notify_ready, lg),
                 "forward_backward_notify with token == vocab");
    ck_assert(keep == 5.0f);
    free(lg);
    API->context_destroy(a);
    API->context_destroy(b);
}
END_TEST

/* ------------------------------------------------------------------------- */
/* ABI 1.2: flat parameters, the optimizer shard, the ranged step             */
/* ------------------------------------------------------------------------- */

static int need_zero(const conf_engine *e) {
    const orch_engine_api *api = e->h.api;
    if (ORCH_API_HAS(api, param_read) && ORCH_API_HAS(api, param_write) &&
        ORCH_API_HAS(api, optimizer_shard) && ORCH_API_HAS(api, moments_read) &&
        ORCH_API_HAS(api, moments_write) && ORCH_API_HAS(api, optimizer_step_range) &&
        ORCH_API_HAS(api, optimizer_bytes))
        return need(e, ORCH_CAP_TRAIN, "train");
    printf("%s: ABI %u.%u without the ABI 1.2 members, test skipped\n", e->label,
           api->abi_major, api->abi_minor);
    return 0;
}

START_TEST(test_param_flat) {
    if (!need_zero(ENG)) return;
    orch_engine_ctx *ctx = make_ctx(ENG);
    test_table t;
    read_table(ENG, ctx, ORCH_TENSOR_PARAM, &t);
    uint64_t n = t.total;
    /* param_read of everything == the tensor table, in table order */
    float *flat = malloc(n * sizeof(float));
    ck_assert_int_eq(API->param_read(ctx, 0, n, flat), ORCH_OK);
    float *tab = test_read_kind(API, ctx, ORCH_TENSOR_PARAM, &t);
    ck_assert_msg(memcmp(flat, tab, n * sizeof(float)) == 0,
                  "%s: param_read differs from tensor_read", ENAME);
    /* a write across a tensor boundary shows in tensor_read */
    uint64_t off = t.info[1].offset - 3, cnt = 7;
    float patch[7] = { 1, 2, 3, 4, 5, 6, 7 };
    ck_assert_int_eq(API->param_write(ctx, off, cnt, patch), ORCH_OK);
    memcpy(flat + off, patch, sizeof patch);
    free(tab);
    tab = test_read_kind(API, ctx, ORCH_TENSOR_PARAM, &t);
    ck_assert_msg(memcmp(flat, tab, n * sizeof(float)) == 0,
                  "%s: param_write across a tensor boundary did not land", ENAME);
    /* bad ranges and buffers */
    expect_error(ENG, ctx, API->param_read(ctx, n, 1, patch), "param_read at the end");
    expect_error(ENG, ctx, API->param_write(ctx, n - 2, 5, patch),
                 "param_write past the end");
    expect_error(ENG, ctx, API->param_read(ctx, UINT64_MAX, 2, patch),
                 "param_read at 2^64-1");
    expect_error(ENG, ctx, API->param_write(ctx, 0, 3, NULL), "param_write from NULL");
    ck_assert_int_eq(API->param_read(ctx, 5, 0, NULL), ORCH_OK);
    free(tab);
    free(flat);
    API->context_destroy(ctx);
}
END_TEST

/* Two AdamW steps with clipping: a whole-buffer optimizer_step on one context
 * and, on another with a shard crossing tensor boundaries, optimizer_step_range
 * over the shard with the norm computed here. Inside the shard parameters and
 * moments agree (the only difference: the clip scale from an f32 norm);
 * outside the shard parameters stay as they were. */
START_TEST(test_optimizer_step_range) {
    if (!need_zero(ENG)) return;
    orch_engine_ctx *a = make_ctx(ENG), *b = make_ctx(ENG);
    test_table t;
    read_table(ENG, a, ORCH_TENSOR_PARAM, &t);
    const uint64_t n = t.total, off = n / 3, cnt = n / 3;
    ck_assert_int_eq(API->optimizer_shard(b, off, cnt), ORCH_OK);
    float *p0 = test_read_kind(API, b, ORCH_TENSOR_PARAM, &t);
    int32_t tok[TB * TS], tgt[TB * TS];
    train_batch(tok, tgt);
    for (uint64_t step = 1; step <= 2; step++) {
        float la = 0, lb = 0, na = 0;
        ck_assert_int_eq(API->grads_zero(a), ORCH_OK);
        ck_assert_int_eq(API->grads_zero(b), ORCH_OK);
        ck_assert_int_eq(API->forward_backward(a, tok, tgt, TB, TS, 1.0f, &la), ORCH_OK);
        ck_assert_int_eq(API->forward_backward(b, tok, tgt, TB, TS, 1.0f, &lb), ORCH_OK);
        float *g = test_read_grads(API, b, n);
        double sq = 0;
        for (uint64_t j = 0; j < n; j++) sq += (double)g[j] * g[j];
        free(g);
        orch_adamw_params p = adamw(step, 1e-2f, 0.5f); /* clipping active */
        /* eps 1e-6: the attention key bias has a zero gradient in exact
         * arithmetic (softmax ignores a shift); its ~1e-10 rounding noise
         * would turn into full-size steps with eps 1e-8, and step 2 would
         * amplify step 1's last-bit differences (see tests/dist_train.sh). */
        p.eps = 1e-6f;
        ck_assert_int_eq(API->optimizer_step(a, &p, &na), ORCH_OK);
        ck_assert_msg(sqrt(sq) > 0.5, "%s: norm %g does not clip", ENAME, sqrt(sq));
        ck_assert_msg(API->optimizer_step_range(b, &p, off, cnt, (float)sqrt(sq)) ==
                          ORCH_OK,
                      "%s: %s", ENAME, API->last_error(b));
        /* the rest of b follows a (as an all-gather would) */
        float *pa = test_read_kind(API, a, ORCH_TENSOR_PARAM, &t);
        float *pb = malloc(n * sizeof(float));
        ck_assert_int_eq(API->param_read(b, 0, n, pb), ORCH_OK);
        double d = test_max_diff(pa + off, pb + off, cnt);
        ck_assert_msg(d <= 1e-6, "%s: step %llu: ranged params differ by %g", ENAME,
                      (unsigned long long)step, d);
        if (step == 1)
            ck_assert_msg(memcmp(pb, p0, off * sizeof(float)) == 0 &&
                              memcmp(pb + off + cnt, p0 + off + cnt,
                                     (n - off - cnt) * sizeof(float)) == 0,
                          "%s: optimizer_step_range changed parameters outside its range",
                          ENAME);
        ck_assert_int_eq(API->param_write(b, 0, off, pa), ORCH_OK);
        ck_assert_int_eq(API->param_write(b, off + cnt, n - off - cnt, pa + off + cnt),
                         ORCH_OK);
        free(pa);
        free(pb);
    }
    /* moments of the shard agree with a's */
    static const uint32_t kinds[2] = { ORCH_TENSOR_ADAM_M, ORCH_TENSOR_ADAM_V };
    for (int k = 0; k < 2; k++) {
        float *ma = test_read_kind(API, a, kinds[k], &t);
        float *mb = malloc(cnt * sizeof(float));
        ck_assert_int_eq(API->moments_read(b, kinds[k], off, cnt, mb), ORCH_OK);
        double d = test_max_diff(ma + off, mb, cnt);
        ck_assert_msg(d <= 1e-6 * (1.0 + test_max_abs(ma + off, cnt)),
                      "%s: moments %d of the shard differ by %g", ENAME, k, d);
        free(ma);
        free(mb);
    }
    /* optimizer memory: the shard's, well under the whole */
    uint64_t ba = 0, bb = 0;
    ck_assert_int_eq(API->optimizer_bytes(a, &ba), ORCH_OK);
    ck_assert_int_eq(API->optimizer_bytes(b, &bb), ORCH_OK);
    ck_assert_msg(ba >= 8 * n && bb >= 8 * cnt && bb < ba / 2,
                  "%s: optimizer bytes %llu (whole) and %llu (a third)", ENAME,
                  (unsigned long long)ba, (unsigned long long)bb);
    free(p0);
    API->context_destroy(a);
    API->context_destroy(b);
}
END_TEST

START_TEST(test_optimizer_shard_rules) {
    if (!need_zero(ENG)) return;
    orch_engine_ctx *ctx = make_ctx(ENG);
    test_table t;
    read_table(ENG, ctx, ORCH_TENSOR_PARAM, &t);
    const uint64_t n = t.total, off = 100, cnt = n / 2;
    float *m = malloc(n * sizeof(float));
    for (uint64_t j = 0; j < n; j++) m[j] = rnd_float();
    test_write_kind(API, ctx, ORCH_TENSOR_ADAM_M, &t, m);
    /* shard: the moments of the range are kept */
    ck_assert_int_eq(API->optimizer_shard(ctx, off, cnt), ORCH_OK);
    float *got = malloc(n * sizeof(float));
    ck_assert_int_eq(API->moments_read(ctx, ORCH_TENSOR_ADAM_M, off, cnt, got), ORCH_OK);
    ck_assert_msg(memcmp(got, m + off, cnt * sizeof(float)) == 0,
                  "%s: optimizer_shard lost the moments of its range", ENAME);
    /* whole-table moment calls and the whole step refuse: ORCH_ERR_STATE */
    float *buf = malloc(t.info[0].numel * sizeof(float));
    int32_t st = API->tensor_read(ctx, ORCH_TENSOR_ADAM_M, 0, buf,
                                  t.info[0].numel * sizeof(float));
    ck_assert_msg(st == ORCH_ERR_STATE, "%s: tensor_read of a moment when sharded: %d",
                  ENAME, st);
    ck_assert(*API->last_error(ctx));
    ck_assert_int_eq(
        API->tensor_read(ctx, ORCH_TENSOR_PARAM, 0, buf, t.info[0].numel * sizeof(float)),
        ORCH_OK);
    orch_adamw_params p = adamw(1, 1e-2f, 1.0f);
    float norm = 0;
    ck_assert_int_eq(API->optimizer_step(ctx, &p, &norm), ORCH_ERR_STATE);
    /* ranges outside the shard: STATE; outside the buffer or NULL: INVALID */
    float x[4] = { 0 };
    ck_assert_int_eq(API->moments_read(ctx, ORCH_TENSOR_ADAM_M, off - 1, 2, x),
                     ORCH_ERR_STATE);
    ck_assert_int_eq(API->moments_write(ctx, ORCH_TENSOR_ADAM_V, off + cnt - 1, 2, x),
                     ORCH_ERR_STATE);
    ck_assert_int_eq(API->optimizer_step_range(ctx, &p, 0, 10, 1.0f), ORCH_ERR_STATE);
    ck_assert_int_eq(API->moments_read(ctx, ORCH_TENSOR_ADAM_M, n, 1, x),
                     ORCH_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(API->moments_read(ctx, ORCH_TENSOR_ADAM_M, off, 2, NULL),
                     ORCH_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(API->moments_read(ctx, ORCH_TENSOR_PARAM, off, 2, x),
                     ORCH_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(API->optimizer_step_range(ctx, NULL, off, 2, 1.0f),
                     ORCH_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(API->optimizer_step_range(ctx, &p, UINT64_MAX, 2, 1.0f),
                     ORCH_ERR_INVALID_ARGUMENT);
    expect_error(ENG, ctx, API->optimizer_shard(ctx, 0, 0), "a shard of 0 elements");
    expect_error(ENG, ctx, API->optimizer_shard(ctx, n - 1, 2), "a shard past the end");
    expect_error(ENG, ctx, API->optimizer_bytes(ctx, NULL), "optimizer_bytes into NULL");
    /* a non-finite or negative norm changes nothing */
    float *p0 = test_read_kind(API, ctx, ORCH_TENSOR_PARAM, &t);
    ck_assert_int_eq(API->optimizer_step_range(ctx, &p, off, cnt, NAN), ORCH_ERR_NUMERIC);
    ck_assert_int_eq(API->optimizer_step_range(ctx, &p, off, cnt, INFINITY),
                     ORCH_ERR_NUMERIC);
    ck_assert_int_eq(API->optimizer_step_range(ctx, &p, off, cnt, -1.0f),
                     ORCH_ERR_NUMERIC);
    float *p1 = test_read_kind(API, ctx, ORCH_TENSOR_PARAM, &t);
    ck_assert(memcmp(p0, p1, n * sizeof(float)) == 0);
    ck_assert_int_eq(API->moments_read(ctx, ORCH_TENSOR_ADAM_M, off, cnt, got), ORCH_OK);
    ck_assert(memcmp(got, m + off, cnt * sizeof(float)) == 0);
    /* back to unsharded: the old range kept, the rest zero, whole calls work */
    ck_assert_int_eq(API->optimizer_shard(ctx, 0, n), ORCH_OK);
    float *all = test_read_kind(API, ctx, ORCH_TENSOR_ADAM_M, &t);
    for (uint64_t j = 0; j < n; j++) {
        float want = j >= off && j < off + cnt ? m[j] : 0.0f;
        ck_assert_msg(all[j] == want, "%s: moment %llu is %g after unsharding, want %g",
                      ENAME, (unsigned long long)j, (double)all[j], (double)want);
    }
    free(all);
    free(p0);
    free(p1);
    free(buf);
    free(got);
    free(m);
    API->context_destroy(ctx);
}
END_TEST

START_TEST(test_determinism) {
    orch_engine_ctx *a = make_ctx(ENG), *b = make_ctx(ENG),
                    *c = make_ctx_seed(ENG, SEED + 1);
    test_table t;
    read_table(ENG, a, ORCH_TENSOR_PARAM, &t);
    float *pa = test_read_kind(API, a, ORCH_TENSOR_PARAM, &t);
    float *pb = test_read_kind(API, b, ORCH_TENSOR_PARAM, &t);
    float *pc = test_read_kind(API, c, ORCH_TENSOR_PARAM, &t);
    ck_assert_msg(memcmp(pa, pb, t.total * sizeof(float)) == 0,
                  "%s: same seed, different parameters", ENAME);
    ck_assert_msg(memcmp(pa, pc, t.info[0].numel * sizeof(float)) != 0,
                  "%s: different seeds, same wte", ENAME);
    if (API->capabilities & ORCH_CAP_TRAIN) {
        int exact = (API->capabilities & ORCH_CAP_DETERMINISTIC) != 0;
        int32_t tok[TB * TS], tgt[TB * TS];
        train_batch(tok, tgt);
        float la[3], lb[3];
        orch_engine_ctx *ctxs[2] = { a, b };
        float *ls[2] = { la, lb };
        for (int k = 0; k < 2; k++)
            for (uint64_t step = 1; step <= 3; step++) {
                ck_assert_int_eq(API->grads_zero(ctxs[k]), ORCH_OK);
                ck_assert_int_eq(API->forward_backward(ctxs[k], tok, tgt, TB, TS, 1.0f,
                                                       &ls[k][step - 1]),
                                 ORCH_OK);
                orch_adamw_params p = adamw(step, 1e-2f, 1.0f);
                ck_assert_int_eq(API->optimizer_step(ctxs[k], &p, NULL), ORCH_OK);
            }
        for (int s = 0; s < 3; s++)
            ck_assert_msg(exact ? la[s] == lb[s] : test_close(la[s], lb[s], 1e-5f, 0),
                          "%s: step %d losses %.9g vs %.9g", ENAME, s + 1, (double)la[s],
                          (double)lb[s]);
        free(pa);
        free(pb);
        pa = test_read_kind(API, a, ORCH_TENSOR_PARAM, &t);
        pb = test_read_kind(API, b, ORCH_TENSOR_PARAM, &t);
        for (uint64_t j = 0; j < t.total; j++)
            ck_assert_msg(exact ? pa[j] == pb[j] : test_close(pa[j], pb[j], 1e-4f, 1e-6f),
                          "%s: parameters diverged at %llu", ENAME,
                          (unsigned long long)j);
    }
    free(pa);
    free(pb);
    free(pc);
    API->context_destroy(a);
    API->context_destroy(b);
    API->context_destroy(c);
}
END_TEST

/* ------------------------------------------------------------------------- */
/* Inference and the KV cache                                                 */
/* ------------------------------------------------------------------------- */

#define BS   4u  /* block size */
#define NB   40u /* pool blocks */
#define PLEN 10u /* prompt length */

static const int32_t prompt[PLEN] = { 17, 3, 150, 42, 42, 199, 0, 88, 61, 120 };

static orch_engine_ctx *kv_ctx(const conf_engine *e) {
    orch_engine_ctx *ctx = make_ctx(e);
    uint64_t bytes = 0;
    ck_assert_int_eq(e->h.api->kv_block_bytes(ctx, BS, &bytes), ORCH_OK);
    ck_assert_msg(bytes > 0, "%s: kv_block_bytes is 0", e->label);
    ck_assert_msg(e->h.api->kv_configure(ctx, BS, NB) == ORCH_OK, "%s: %s", e->label,
                  e->h.api->last_error(ctx));
    return ctx;
}

static void rows_close(const conf_engine *e, const float *a, const float *b,
                       uint32_t rows, const char *what) {
    for (uint64_t j = 0; j < (uint64_t)rows * V; j++)
        ck_assert_msg(test_close(a[j], b[j], 1e-4f, 1e-4f),
                      "%s: %s: logit %llu: %g vs %g", e->label, what,
                      (unsigned long long)j, (double)a[j], (double)b[j]);
}

START_TEST(test_kv_all_vs_incremental) {
    if (!need(ENG, ORCH_CAP_INFER, "infer")) return;
    orch_engine_ctx *ctx = kv_ctx(ENG);
    float *all = malloc(PLEN * V * sizeof(float));
    float *one = malloc(V * sizeof(float));
    /* Whole prompt, every row, blocks scattered through the pool. */
    const int32_t ta[3] = { 3, 37, 1 };
    orch_seq_input s = test_seq_input(prompt, PLEN, 0, ta, 3, ORCH_LOGITS_ALL);
    ck_assert_msg(test_infer(API, ctx, &s, 1, all, PLEN * V) == ORCH_OK, "%s: %s", ENAME,
                  API->last_error(ctx));
    for (uint64_t j = 0; j < (uint64_t)PLEN * V; j++) ck_assert(isfinite(all[j]));
    /* Same prompt in other blocks: a chunk without logits, a chunk with the
     * last row, then one token at a time. */
    const int32_t tb[3] = { 20, 5, 11 };
    s = test_seq_input(prompt, 2, 0, tb, 3, ORCH_LOGITS_NONE);
    one[0] = 4242.0f;
    ck_assert_int_eq(test_infer(API, ctx, &s, 1, one, V), ORCH_OK);
    ck_assert_msg(one[0] == 4242.0f, "%s: LOGITS_NONE wrote logits", ENAME);
    s = test_seq_input(prompt + 2, 3, 2, tb, 2, ORCH_LOGITS_LAST);
    ck_assert_int_eq(test_infer(API, ctx, &s, 1, one, V), ORCH_OK);
    rows_close(ENG, one, all + 4 * V, 1, "prefill chunk vs all-rows");
    for (uint32_t p = 5; p < PLEN; p++) {
        s = test_seq_input(prompt + p, 1, p, tb, 3, ORCH_LOGITS_LAST);
        ck_assert_msg(test_infer(API, ctx, &s, 1, one, V) == ORCH_OK, "%s: %s", ENAME,
                      API->last_error(ctx));
        char what[64];
        snprintf(what, sizeof what, "decode at position %u", p);
        rows_close(ENG, one, all + (uint64_t)p * V, 1, what);
    }
    free(all);
    free(one);
    API->context_destroy(ctx);
}
END_TEST

START_TEST(test_kv_batch_of_sequences) {
    if (!need(ENG, ORCH_CAP_INFER, "infer")) return;
    orch_engine_ctx *ctx = kv_ctx(ENG);
    /* Reference: each sequence alone. */
    const int32_t t1[3] = { 0, 1, 2 }, t2[2] = { 9, 8 };
    float ref1[V], ref2[V], both[2 * V];
    orch_seq_input s1 = test_seq_input(prompt, PLEN, 0, t1, 3, ORCH_LOGITS_LAST);
    orch_seq_input s2 = test_seq_input(prompt + 3, 6, 0, t2, 2, ORCH_LOGITS_LAST);
    ck_assert_int_eq(test_infer(API, ctx, &s1, 1, ref1, V), ORCH_OK);
    ck_assert_int_eq(test_infer(API, ctx, &s2, 1, ref2, V), ORCH_OK);
    /* Together, in fresh blocks, with a stride larger than the struct. */
    struct {
        orch_seq_input s;
        uint64_t future_member;
    } wide[2];
    const int32_t u1[3] = { 30, 31, 32 }, u2[2] = { 33, 34 };
    wide[0].s = test_seq_input(prompt, PLEN, 0, u1, 3, ORCH_LOGITS_LAST);
    wide[1].s = test_seq_input(prompt + 3, 6, 0, u2, 2, ORCH_LOGITS_LAST);
    wide[0].future_member = wide[1].future_member = 0;
    orch_infer_batch b = { sizeof b, 2, sizeof wide[0], 0, &wide[0].s };
    ck_assert_msg(API->infer_forward(ctx, &b, both, 2 * V) == ORCH_OK, "%s: %s", ENAME,
                  API->last_error(ctx));
    rows_close(ENG, both, ref1, 1, "sequence 0 in a batch");
    rows_close(ENG, both + V, ref2, 1, "sequence 1 in a batch");
    /* A shared read-only prefix block is fine: both sequences read block 0
     * (positions 0..3 = prompt[0..3], written above) and each writes position
     * 4 into its own block. References: the same tokens in fresh blocks. */
    const int32_t alt[5] = { prompt[0], prompt[1], prompt[2], prompt[3], prompt[5] };
    const int32_t r1[2] = { 23, 24 }, r2[2] = { 25, 26 };
    orch_seq_input r = test_seq_input(prompt, 5, 0, r1, 2, ORCH_LOGITS_LAST);
    ck_assert_int_eq(test_infer(API, ctx, &r, 1, ref1, V), ORCH_OK);
    r = test_seq_input(alt, 5, 0, r2, 2, ORCH_LOGITS_LAST);
    ck_assert_int_eq(test_infer(API, ctx, &r, 1, ref2, V), ORCH_OK);
    const int32_t p1[2] = { 0, 35 }, p2[2] = { 0, 36 };
    orch_seq_input sh[2] = { test_seq_input(prompt + 4, 1, 4, p1, 2, ORCH_LOGITS_LAST),
                             test_seq_input(prompt + 5, 1, 4, p2, 2, ORCH_LOGITS_LAST) };
    ck_assert_msg(test_infer(API, ctx, sh, 2, both, 2 * V) == ORCH_OK,
                  "%s: shared read-only prefix block rejected: %s", ENAME,
                  API->last_error(ctx));
    rows_close(ENG, both, ref1, 1, "shared prefix, sequence 0");
    rows_close(ENG, both + V, ref2, 1, "shared prefix, sequence 1");
    API->context_destroy(ctx);
}
END_TEST

START_TEST(test_kv_copy_blocks) {
    if (!need(ENG, ORCH_CAP_KV_COPY, "kv-copy")) return;
    orch_engine_ctx *ctx = kv_ctx(ENG);
    const int32_t ta[3] = { 3, 7, 1 };
    float a[V], b[V];
    orch_seq_input s = test_seq_input(prompt, PLEN, 0, ta, 3, ORCH_LOGITS_NONE);
    ck_assert_int_eq(test_infer(API, ctx, &s, 1, NULL, 0), ORCH_OK);
    /* Copy-on-write of the partial last block, then decode the same token in
     * both branches, in one batch (they share blocks 3 and 7 read-only). */
    const int32_t src[1] = { 1 }, dst[1] = { 12 };
    ck_assert_msg(API->kv_copy_blocks(ctx, src, dst, 1) == ORCH_OK, "%s: %s", ENAME,
                  API->last_error(ctx));
    const int32_t tc[3] = { 3, 7, 12 };
    const int32_t next = 77;
    orch_seq_input two[2] = { test_seq_input(&next, 1, PLEN, ta, 3, ORCH_LOGITS_LAST),
                              test_seq_input(&next, 1, PLEN, tc, 3, ORCH_LOGITS_LAST) };
    float both[2 * V];
    ck_assert_msg(test_infer(API, ctx, two, 2, both, 2 * V) == ORCH_OK, "%s: %s", ENAME,
                  API->last_error(ctx));
    memcpy(a, both, sizeof a);
    memcpy(b, both + V, sizeof b);
    rows_close(ENG, a, b, 1, "decode from the copy vs the original");
    /* Copy several blocks at once, then decode a different token from them. */
    const int32_t src2[3] = { 3, 7, 1 }, dst2[3] = { 20, 21, 22 };
    ck_assert_int_eq(API->kv_copy_blocks(ctx, src2, dst2, 3), ORCH_OK);
    const int32_t t3[3] = { 20, 21, 22 };
    const int32_t other = 5;
    s = test_seq_input(&other, 1, PLEN + 1, ta, 3, ORCH_LOGITS_LAST);
    ck_assert_int_eq(test_infer(API, ctx, &s, 1, a, V), ORCH_OK);
    s = test_seq_input(&other, 1, PLEN + 1, t3, 3, ORCH_LOGITS_LAST);
    ck_assert_int_eq(test_infer(API, ctx, &s, 1, b, V), ORCH_OK);
    rows_close(ENG, a, b, 1, "decode after a 3-block copy");
    /* Bad copies. */
    const int32_t bad[1] = { (int32_t)NB }, neg[1] = { -1 };
    expect_error(ENG, ctx, API->kv_copy_blocks(ctx, src, bad, 1),
                 "copy to a block past the pool");
    expect_error(ENG, ctx, API->kv_copy_blocks(ctx, neg, dst, 1), "copy from block -1");
    const int32_t os[2] = { 4, 5 }, od[2] = { 5, 6 };
    expect_error(ENG, ctx, API->kv_copy_blocks(ctx, os, od, 2), "overlapping copy sets");
    API->context_destroy(ctx);
}
END_TEST

/* Run a bad batch: it must fail, explain itself, and write no logits. */
static void bad_batch(const conf_engine *e, orch_engine_ctx *ctx,
                      const orch_seq_input *seqs, uint32_t n, uint64_t cap,
                      const char *what, int strict_invalid) {
    float *logits = malloc((size_t)(2 * V + 1) * sizeof(float));
    for (uint32_t j = 0; j < 2 * V + 1; j++) logits[j] = 31337.0f;
    int32_t st = test_infer(e->h.api, ctx, seqs, n, logits, cap);
    expect_error(e, ctx, st, what);
    if (strict_invalid)
        ck_assert_msg(st == ORCH_ERR_INVALID_ARGUMENT,
                      "%s: %s gave %s, expected invalid argument", e->label, what,
                      e->h.api->status_string(st));
    else
        ck_assert_msg(st == ORCH_ERR_INVALID_ARGUMENT || st == ORCH_ERR_CAPACITY,
                      "%s: %s gave %s", e->label, what, e->h.api->status_string(st));
    for (uint32_t j = 0; j < 2 * V + 1; j++)
        ck_assert_msg(logits[j] == 31337.0f, "%s: %s wrote logits", e->label, what);
    free(logits);
}

START_TEST(test_kv_bad_calls) {
    if (!need(ENG, ORCH_CAP_INFER, "infer")) return;
    /* No pool yet. */
    orch_engine_ctx *ctx = make_ctx(ENG);
    const int32_t t0[1] = { 0 };
    orch_seq_input s = test_seq_input(prompt, 1, 0, t0, 1, ORCH_LOGITS_LAST);
    float row[V];
    expect_error(ENG, ctx, test_infer(API, ctx, &s, 1, row, V),
                 "infer_forward before kv_configure");
    uint64_t bytes = 9;
    expect_error(ENG, ctx, API->kv_block_bytes(ctx, BS, NULL),
                 "kv_block_bytes into NULL");
    expect_error(ENG, ctx, API->kv_block_bytes(ctx, 0, &bytes),
                 "kv_block_bytes of size 0");
    ck_assert(bytes == 9);
    expect_error(ENG, ctx, API->kv_configure(ctx, 0, NB), "block size 0");
    expect_error(ENG, ctx, API->kv_configure(ctx, BS, 0), "zero blocks");
    API->context_destroy(ctx);

    ctx = kv_ctx(ENG);
    const int32_t table[3] = { 0, 1, 2 };
    /* Token ids out of range. */
    int32_t badtok[2] = { 5, (int32_t)V };
    s = test_seq_input(badtok, 2, 0, table, 1, ORCH_LOGITS_LAST);
    bad_batch(ENG, ctx, &s, 1, V, "token == vocab", 1);
    badtok[1] = -1;
    bad_batch(ENG, ctx, &s, 1, V, "token -1", 1);
    /* Past the context: start T-1, two tokens, enough blocks. */
    int32_t long_table[T / BS + 1];
    for (uint32_t j = 0; j < T / BS + 1; j++) long_table[j] = (int32_t)j;
    s = test_seq_input(prompt, 2, T - 1, long_table, T / BS + 1, ORCH_LOGITS_LAST);
    bad_batch(ENG, ctx, &s, 1, V, "positions past the context", 1);
    /* Block ids outside the pool. */
    const int32_t out1[1] = { (int32_t)NB }, out2[1] = { -1 };
    s = test_seq_input(prompt, 2, 0, out1, 1, ORCH_LOGITS_LAST);
    bad_batch(ENG, ctx, &s, 1, V, "block id == pool size", 1);
    s = test_seq_input(prompt, 2, 0, out2, 1, ORCH_LOGITS_LAST);
    bad_batch(ENG, ctx, &s, 1, V, "block id -1", 1);
    /* Too few blocks: 6 tokens, one block of 4. */
    s = test_seq_input(prompt, 6, 0, table, 1, ORCH_LOGITS_LAST);
    bad_batch(ENG, ctx, &s, 1, V, "too few blocks", 0);
    /* logits_cap too small, for LAST and for ALL. */
    s = test_seq_input(prompt, 3, 0, table, 1, ORCH_LOGITS_LAST);
    bad_batch(ENG, ctx, &s, 1, V - 1, "logits_cap one short", 0);
    s = test_seq_input(prompt, 3, 0, table, 1, ORCH_LOGITS_ALL);
    bad_batch(ENG, ctx, &s, 1, 2 * V, "logits_cap of 2 rows for 3", 0);
    /* adapter_id must be 0. */
    s = test_seq_input(prompt, 2, 0, table, 1, ORCH_LOGITS_LAST);
    s.adapter_id = 1;
    bad_batch(ENG, ctx, &s, 1, V, "adapter_id 1", 0);
    /* The same block written by two sequences. */
    const int32_t same[1] = { 5 };
    orch_seq_input two[2] = { test_seq_input(prompt, 2, 0, same, 1, ORCH_LOGITS_LAST),
                              test_seq_input(prompt + 2, 2, 0, same, 1,
                                             ORCH_LOGITS_LAST) };
    bad_batch(ENG, ctx, two, 2, 2 * V, "one block written by two sequences", 1);
    /* A block written by one sequence and read by another. */
    const int32_t full[1] = { 21 };
    s = test_seq_input(prompt, 4, 0, full, 1, ORCH_LOGITS_NONE);
    ck_assert_int_eq(test_infer(API, ctx, &s, 1, NULL, 0), ORCH_OK);
    const int32_t reader[2] = { 21, 22 };
    two[0] = test_seq_input(prompt, 1, 2, full, 1, ORCH_LOGITS_LAST);   /* rewrites 21 */
    two[1] = test_seq_input(prompt, 1, 4, reader, 2, ORCH_LOGITS_LAST); /* reads 21 */
    bad_batch(ENG, ctx, two, 2, 2 * V, "a block written by one sequence, read by another",
              1);
    /* The context still works after all that. */
    s = test_seq_input(prompt, PLEN, 0, (const int32_t[3]){ 30, 31, 32 }, 3,
                       ORCH_LOGITS_LAST);
    ck_assert_msg(test_infer(API, ctx, &s, 1, row, V) == ORCH_OK, "%s: %s", ENAME,
                  API->last_error(ctx));
    API->context_destroy(ctx);
}
END_TEST

START_TEST(test_kv_reconfigure) {
    if (!need(ENG, ORCH_CAP_INFER, "infer")) return;
    orch_engine_ctx *ctx = kv_ctx(ENG);
    float a[V], b[V];
    const int32_t t[3] = { 1, 2, 3 };
    orch_seq_input s = test_seq_input(prompt, PLEN, 0, t, 3, ORCH_LOGITS_LAST);
    ck_assert_int_eq(test_infer(API, ctx, &s, 1, a, V), ORCH_OK);
    /* A new pool with another block size gives the same answer. */
    ck_assert_int_eq(API->kv_configure(ctx, 16, 4), ORCH_OK);
    const int32_t t16[1] = { 2 };
    s = test_seq_input(prompt, PLEN, 0, t16, 1, ORCH_LOGITS_LAST);
    ck_assert_int_eq(test_infer(API, ctx, &s, 1, b, V), ORCH_OK);
    rows_close(ENG, a, b, 1, "block size 4 vs 16");
    /* Old ids beyond the new pool are rejected. */
    s = test_seq_input(prompt, 1, 0, (const int32_t[1]){ 10 }, 1, ORCH_LOGITS_LAST);
    expect_error(ENG, ctx, test_infer(API, ctx, &s, 1, b, V), "block id of the old pool");
    API->context_destroy(ctx);
}
END_TEST

START_TEST(test_engines_loaded) {
    ck_assert_msg(load_failures[0] == '\0', "engines failed to load:%s", load_failures);
    ck_assert_msg(n_engines > 0, "no engine could be tested");
}
END_TEST

/* ------------------------------------------------------------------------- */
/* Engine discovery and main                                                  */
/* ------------------------------------------------------------------------- */

static void try_engine(const char *value) {
    if (n_engines >= MAX_ENGINES) return;
    conf_engine *e = &engines[n_engines];
    char err[2048];
    if (engine_load(value, &e->h, err, sizeof err) != 0) {
        if (strstr(err, "cannot run here")) {
            printf("conformance: skipping %s: %s\n", value, err);
        } else {
            size_t used = strlen(load_failures);
            snprintf(load_failures + used, sizeof load_failures - used, " [%s]", err);
        }
        return;
    }
    snprintf(e->label, sizeof e->label, "%s", e->h.api->name);
    printf("conformance: testing engine %s (%s) from %s\n", e->h.api->name,
           e->h.api->version ? e->h.api->version : "?", e->h.path);
    n_engines++;
}

static void discover(void) {
    const char *list = getenv("ORCH_CONFORMANCE_ENGINES");
    if (list && *list) {
        char buf[4096];
        snprintf(buf, sizeof buf, "%s", list);
        char *save = NULL;
        for (char *tok = strtok_r(buf, ", \t", &save); tok;
             tok = strtok_r(NULL, ", \t", &save))
            try_engine(tok);
        if (n_engines == 0) try_engine("mock"); /* at least the mock runs */
        return;
    }
    char pattern[4200];
    snprintf(pattern, sizeof pattern, "%s/libengine_*.so", test_build_dir());
    glob_t g;
    int found = 0;
    if (glob(pattern, 0, NULL, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc; i++, found++) try_engine(g.gl_pathv[i]);
        globfree(&g);
    }
    if (!found) try_engine("mock");
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    test_default_engine_path();
    discover();
    Suite *s = suite_create("conformance");
    TCase *tc = tcase_create("engines");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_engines_loaded);
    if (n_engines > 0) {
        tcase_add_loop_test(tc, test_lifecycle, 0, n_engines);
        tcase_add_loop_test(tc, test_bad_model_rejected, 0, n_engines);
        tcase_add_loop_test(tc, test_unknown_option_rejected, 0, n_engines);
        tcase_add_loop_test(tc, test_last_error, 0, n_engines);
        tcase_add_loop_test(tc, test_status_strings, 0, n_engines);
        tcase_add_loop_test(tc, test_tensor_table, 0, n_engines);
        tcase_add_loop_test(tc, test_tensor_init, 0, n_engines);
        tcase_add_loop_test(tc, test_tensor_roundtrip, 0, n_engines);
        tcase_add_loop_test(tc, test_grads_flat, 0, n_engines);
        tcase_add_loop_test(tc, test_forward_backward_accumulates, 0, n_engines);
        tcase_add_loop_test(tc, test_ignored_targets, 0, n_engines);
        tcase_add_loop_test(tc, test_eval_loss_matches, 0, n_engines);
        tcase_add_loop_test(tc, test_optimizer_lowers_loss, 0, n_engines);
        tcase_add_loop_test(tc, test_optimizer_nonfinite, 0, n_engines);
        tcase_add_loop_test(tc, test_determinism, 0, n_engines);
        tcase_add_loop_test(tc, test_forward_backward_notify, 0, n_engines);
        tcase_add_loop_test(tc, test_param_flat, 0, n_engines);
        tcase_add_loop_test(tc, test_optimizer_step_range, 0, n_engines);
        tcase_add_loop_test(tc, test_optimizer_shard_rules, 0, n_engines);
        tcase_add_loop_test(tc, test_kv_all_vs_incremental, 0, n_engines);
        tcase_add_loop_test(tc, test_kv_batch_of_sequences, 0, n_engines);
        tcase_add_loop_test(tc, test_kv_copy_blocks, 0, n_engines);
        tcase_add_loop_test(tc, test_kv_bad_calls, 0, n_engines);
        tcase_add_loop_test(tc, test_kv_reconfigure, 0, n_engines);
    }
    suite_add_tcase(s, tc);
    int rc = test_run_suite(s);
    for (int i = 0; i < n_engines; i++) engine_unload(&engines[i].h);
    return rc;
}
