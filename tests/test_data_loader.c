/*
 * test_data_loader.c - Check suite for orchestrator/data/data_loader.{c,h}: the
 * seeded RNG (determinism, state round trip, bounds), training windows
 * (contiguous, targets shifted by one, taken from the dataset), prefetch and
 * synchronous loaders agree, a loader restarted from a saved RNG state
 * continues exactly, rank slices of a world, and the fixed validation set.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "orchestrator/data/data_loader.h"
#include "orchestrator/data/shard.h"
#include "tests/test_util.h"

#define N_TOKENS 5000u
static char dir[64];
static char path[128];
static dataset *ds;
static char err[1024];

/* token i of the dataset is f(i), so a window is recognisable. */
static int32_t f(uint64_t i) {
    uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull;
    return (int32_t)((x ^ (x >> 29)) % 251);
}

static void setup(void) {
    test_tmpdir(dir, sizeof dir, "data_loader");
    snprintf(path, sizeof path, "%s/train_000.bin", dir);
    int32_t *ids = malloc(N_TOKENS * sizeof *ids);
    for (uint32_t i = 0; i < N_TOKENS; i++) ids[i] = f(i);
    ck_assert_int_eq(shard_write_file(path, "byte", 256, ids, N_TOKENS, err, sizeof err),
                     0);
    free(ids);
    ck_assert_int_eq(dataset_open(path, &ds, err, sizeof err), 0);
}

static void teardown(void) {
    dataset_close(ds);
    test_rmdir(dir);
}

/* Offset of a window in the dataset, or -1 when it is not a window. */
static int64_t window_offset(const int32_t *tok, const int32_t *tgt, uint32_t T) {
    for (uint64_t off = 0; off + T + 1 <= N_TOKENS; off++) {
        int ok = 1;
        for (uint32_t j = 0; j < T && ok; j++)
            ok = tok[j] == f(off + j) && tgt[j] == f(off + j + 1);
        if (ok) return (int64_t)off;
    }
    return -1;
}

START_TEST(test_rng) {
    data_rng a, b;
    data_rng_seed(&a, 1337);
    data_rng_seed(&b, 1337);
    for (int i = 0; i < 100; i++) ck_assert_uint_eq(data_rng_next(&a), data_rng_next(&b));
    data_rng_seed(&b, 1338);
    ck_assert_uint_ne(data_rng_next(&a), data_rng_next(&b));
    char hex[65];
    data_rng_to_hex(&a, hex);
    ck_assert_uint_eq(strlen(hex), 64);
    data_rng c;
    ck_assert_int_eq(data_rng_from_hex(hex, &c), 0);
    ck_assert_mem_eq(&a, &c, sizeof a);
    ck_assert_uint_eq(data_rng_next(&a), data_rng_next(&c));
    ck_assert_int_eq(data_rng_from_hex("xyz", &c), -1);
    ck_assert_int_eq(
        data_rng_from_hex("0000000000000000000000000000000000000000000000000000"
                          "000000000000",
                          &c),
        -1); /* the all-zero state is invalid for xoshiro */
    /* bounds, and every value of a small range shows up */
    int seen[7] = { 0 };
    for (int i = 0; i < 7000; i++) {
        uint64_t v = data_rng_below(&a, 7);
        ck_assert_uint_lt(v, 7);
        seen[v]++;
    }
    for (int i = 0; i < 7; i++) ck_assert_int_gt(seen[i], 800);
    ck_assert_uint_eq(data_rng_below(&a, 1), 0);
}
END_TEST

START_TEST(test_windows_and_prefetch) {
    data_rng start;
    data_rng_seed(&start, 42);
    data_loader_opts po = { 4, 16, 0, 1, 1 }, so = { 4, 16, 0, 1, 0 };
    data_loader *p, *s;
    ck_assert_int_eq(data_loader_open(ds, &po, &start, &p, err, sizeof err), 0);
    ck_assert_int_eq(data_loader_open(ds, &so, &start, &s, err, sizeof err), 0);
    int64_t first_off = -1;
    int differs = 0;
    for (int b = 0; b < 20; b++) {
        const int32_t *pt, *pg, *st, *sg;
        ck_assert_int_eq(data_loader_next(p, &pt, &pg, err, sizeof err), 0);
        ck_assert_int_eq(data_loader_next(s, &st, &sg, err, sizeof err), 0);
        ck_assert_mem_eq(pt, st, 4 * 16 * sizeof(int32_t));
        ck_assert_mem_eq(pg, sg, 4 * 16 * sizeof(int32_t));
        for (int r = 0; r < 4; r++) {
            int64_t off = window_offset(pt + r * 16, pg + r * 16, 16);
            ck_assert_int_ge(off, 0);
            if (first_off < 0)
                first_off = off;
            else if (off != first_off)
                differs = 1;
        }
        data_rng a, c;
        data_loader_rng_state(p, &a);
        data_loader_rng_state(s, &c);
        ck_assert_mem_eq(&a, &c, sizeof a);
    }
    ck_assert(differs); /* offsets are random, not constant */
    data_loader_close(p);
    data_loader_close(s);
}
END_TEST

START_TEST(test_restart_from_state) {
    data_rng start;
    data_rng_seed(&start, 7);
    data_loader_opts o = { 3, 10, 0, 1, 1 };
    data_loader *a, *b;
    ck_assert_int_eq(data_loader_open(ds, &o, &start, &a, err, sizeof err), 0);
    const int32_t *t, *g;
    for (int i = 0; i < 5; i++)
        ck_assert_int_eq(data_loader_next(a, &t, &g, err, sizeof err), 0);
    data_rng saved;
    data_loader_rng_state(a, &saved); /* the prefetched 6th batch must not count */
    ck_assert_int_eq(data_loader_open(ds, &o, &saved, &b, err, sizeof err), 0);
    for (int i = 0; i < 5; i++) {
        const int32_t *t2, *g2;
        ck_assert_int_eq(data_loader_next(a, &t, &g, err, sizeof err), 0);
        ck_assert_int_eq(data_loader_next(b, &t2, &g2, err, sizeof err), 0);
        ck_assert_mem_eq(t, t2, 3 * 10 * sizeof(int32_t));
        ck_assert_mem_eq(g, g2, 3 * 10 * sizeof(int32_t));
    }
    data_loader_close(a);
    data_loader_close(b);
}
END_TEST

START_TEST(test_ranks) {
    data_rng start;
    data_rng_seed(&start, 99);
    data_loader_opts whole = { 4, 8, 0, 1, 0 };
    data_loader_opts r0 = { 2, 8, 0, 2, 1 }, r1 = { 2, 8, 1, 2, 1 };
    data_loader *w, *a, *b;
    ck_assert_int_eq(data_loader_open(ds, &whole, &start, &w, err, sizeof err), 0);
    ck_assert_int_eq(data_loader_open(ds, &r0, &start, &a, err, sizeof err), 0);
    ck_assert_int_eq(data_loader_open(ds, &r1, &start, &b, err, sizeof err), 0);
    for (int i = 0; i < 4; i++) {
        const int32_t *wt, *wg, *at, *ag, *bt, *bg;
        ck_assert_int_eq(data_loader_next(w, &wt, &wg, err, sizeof err), 0);
        ck_assert_int_eq(data_loader_next(a, &at, &ag, err, sizeof err), 0);
        ck_assert_int_eq(data_loader_next(b, &bt, &bg, err, sizeof err), 0);
        ck_assert_mem_eq(wt, at, 2 * 8 * sizeof(int32_t));
        ck_assert_mem_eq(wt + 16, bt, 2 * 8 * sizeof(int32_t));
        ck_assert_mem_eq(wg + 16, bg, 2 * 8 * sizeof(int32_t));
    }
    data_loader_close(w);
    data_loader_close(a);
    data_loader_close(b);
    data_loader_opts bad = { 2, 8, 2, 2, 1 };
    data_loader *x = NULL;
    ck_assert_int_eq(data_loader_open(ds, &bad, &start, &x, err, sizeof err), -1);
}
END_TEST

START_TEST(test_too_small) {
    data_rng start;
    data_rng_seed(&start, 1);
    data_loader_opts o = { 1, N_TOKENS, 0, 1, 1 };
    data_loader *l = NULL;
    ck_assert_int_eq(data_loader_open(ds, &o, &start, &l, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "fewer than seq_len+1"));
    data_eval_set e;
    ck_assert_int_eq(data_eval_set_build(ds, 1, 1, N_TOKENS, &e, err, sizeof err), -1);
    /* exactly seq_len+1 tokens is enough: one possible window */
    o.seq_len = N_TOKENS - 1;
    ck_assert_int_eq(data_loader_open(ds, &o, &start, &l, err, sizeof err), 0);
    const int32_t *t, *g;
    ck_assert_int_eq(data_loader_next(l, &t, &g, err, sizeof err), 0);
    ck_assert_int_eq(t[0], f(0));
    ck_assert_int_eq(g[N_TOKENS - 2], f(N_TOKENS - 1));
    data_loader_close(l);
}
END_TEST

START_TEST(test_eval_set) {
    data_eval_set e, e2;
    ck_assert_int_eq(data_eval_set_build(ds, 3, 2, 32, &e, err, sizeof err), 0);
    ck_assert_int_eq(data_eval_set_build(ds, 3, 2, 32, &e2, err, sizeof err), 0);
    ck_assert_mem_eq(e.tokens, e2.tokens, 6 * 32 * sizeof(int32_t));
    /* evenly spaced from the start to the very end */
    ck_assert_int_eq(window_offset(e.tokens, e.targets, 32), 0);
    ck_assert_int_eq(window_offset(e.tokens + 5 * 32, e.targets + 5 * 32, 32),
                     N_TOKENS - 33);
    int64_t prev = -1;
    for (int w = 0; w < 6; w++) {
        int64_t off = window_offset(e.tokens + w * 32, e.targets + w * 32, 32);
        ck_assert_int_gt(off, prev);
        prev = off;
    }
    data_eval_set_free(&e);
    data_eval_set_free(&e2);
}
END_TEST

int main(void) {
    Suite *s = suite_create("data_loader");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_rng);
    tcase_add_test(tc, test_windows_and_prefetch);
    tcase_add_test(tc, test_restart_from_state);
    tcase_add_test(tc, test_ranks);
    tcase_add_test(tc, test_too_small);
    tcase_add_test(tc, test_eval_set);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
