/*
 * test_block_manager.c - KV block bookkeeping: allocation is all-or-nothing,
 * blocks come back on release, reference counting for shared blocks, double
 * release is refused, block tables grow to cover positions, forks share,
 * copy-on-write before writing into a shared block, and a randomized
 * conservation check (free + used == total, refcounts match the tables).
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/serve/block_manager.h"
#include "tests/test_util.h"

START_TEST(alloc_release_all_or_nothing) {
    ck_assert_ptr_null(block_manager_create(0, 16));
    ck_assert_ptr_null(block_manager_create(4, 0));
    block_manager *bm = block_manager_create(4, 16);
    ck_assert_uint_eq(block_manager_total(bm), 4);
    ck_assert_uint_eq(block_manager_free_count(bm), 4);
    ck_assert_uint_eq(block_manager_block_size(bm), 16);
    int32_t ids[5];
    ck_assert_int_eq(block_manager_alloc(bm, 5, ids), -1);
    ck_assert_uint_eq(block_manager_free_count(bm), 4);
    ck_assert_int_eq(block_manager_alloc(bm, 3, ids), 0);
    ck_assert_int_eq(ids[0], 0); /* lowest ids first */
    ck_assert_int_eq(ids[1], 1);
    ck_assert_uint_eq(block_manager_used(bm), 3);
    int32_t two[2];
    ck_assert_int_eq(block_manager_alloc(bm, 2, two), -1);
    ck_assert_uint_eq(block_manager_free_count(bm), 1);
    ck_assert_int_eq(block_manager_release(bm, ids[1]), 0);
    ck_assert_int_eq(block_manager_release(bm, ids[1]), -1); /* double free */
    ck_assert_int_eq(block_manager_release(bm, 99), -1);
    ck_assert_int_eq(block_manager_release(bm, -1), -1);
    ck_assert_uint_eq(block_manager_free_count(bm), 2);
    /* last freed is handed out first */
    ck_assert_int_eq(block_manager_alloc(bm, 1, two), 0);
    ck_assert_int_eq(two[0], ids[1]);
    ck_assert_uint_eq(block_manager_blocks_for(bm, 0), 0);
    ck_assert_uint_eq(block_manager_blocks_for(bm, 1), 1);
    ck_assert_uint_eq(block_manager_blocks_for(bm, 16), 1);
    ck_assert_uint_eq(block_manager_blocks_for(bm, 17), 2);
    block_manager_free(bm);
    block_manager_free(NULL);
}
END_TEST

START_TEST(refcounts_share_blocks) {
    block_manager *bm = block_manager_create(2, 16);
    int32_t id;
    ck_assert_int_eq(block_manager_alloc(bm, 1, &id), 0);
    ck_assert_uint_eq(block_manager_refcount(bm, id), 1);
    ck_assert_int_eq(block_manager_ref(bm, id), 0);
    ck_assert_int_eq(block_manager_ref(bm, id), 0);
    ck_assert_uint_eq(block_manager_refcount(bm, id), 3);
    ck_assert_int_eq(block_manager_release(bm, id), 0);
    ck_assert_int_eq(block_manager_release(bm, id), 0);
    ck_assert_uint_eq(block_manager_free_count(bm), 1); /* still held once */
    ck_assert_int_eq(block_manager_release(bm, id), 0);
    ck_assert_uint_eq(block_manager_free_count(bm), 2);
    ck_assert_int_eq(block_manager_ref(bm, id), -1); /* free blocks cannot be shared */
    block_manager_free(bm);
}
END_TEST

START_TEST(tables_reserve_fork_and_copy_on_write) {
    block_manager *bm = block_manager_create(6, 16);
    block_table a = { 0 }, b = { 0 };
    ck_assert_int_eq(block_table_reserve(bm, &a, 33), 0); /* 3 blocks */
    ck_assert_uint_eq(a.n, 3);
    ck_assert_uint_eq(block_table_missing(bm, &a, 48), 0);
    ck_assert_uint_eq(block_table_missing(bm, &a, 49), 1);
    ck_assert_int_eq(block_table_reserve(bm, &a, 40), 0); /* covered: no-op */
    ck_assert_uint_eq(a.n, 3);
    ck_assert_int_eq(block_table_reserve(bm, &a, 16 * 7), -1); /* needs 7 > 6 */
    ck_assert_uint_eq(a.n, 3);
    ck_assert_uint_eq(block_manager_free_count(bm), 3);
    /* fork the first two blocks (a shared prompt prefix) */
    ck_assert_int_eq(block_table_fork(bm, &a, 2, &b), 0);
    ck_assert_int_eq(b.ids[0], a.ids[0]);
    ck_assert_uint_eq(block_manager_refcount(bm, a.ids[1]), 2);
    ck_assert_int_eq(block_table_fork(bm, &a, 2, &b), -1); /* dst not empty */
    /* writing into shared block 1 of b: copy-on-write */
    int32_t src = -1, dst = -1;
    int32_t shared = b.ids[1];
    ck_assert_int_eq(block_table_prepare_write(bm, &b, 1, &src, &dst), 1);
    ck_assert_int_eq(src, shared);
    ck_assert_int_ne(dst, shared);
    ck_assert_int_eq(b.ids[1], dst);
    ck_assert_uint_eq(block_manager_refcount(bm, shared), 1);
    ck_assert_int_eq(block_table_prepare_write(bm, &b, 1, &src, &dst),
                     0); /* now private */
    ck_assert_int_eq(block_table_prepare_write(bm, &b, 5, &src, &dst), -1);
    /* releasing a keeps b's shared block 0 alive */
    int32_t b0 = b.ids[0];
    block_table_release(bm, &a);
    ck_assert_uint_eq(a.n, 0);
    ck_assert_uint_eq(block_manager_refcount(bm, b0), 1);
    ck_assert_uint_eq(block_manager_used(bm), 2);
    block_table_free(bm, &b);
    block_table_free(bm, &a);
    ck_assert_uint_eq(block_manager_free_count(bm), 6);
    block_manager_free(bm);
}
END_TEST

START_TEST(cow_fails_cleanly_when_full) {
    block_manager *bm = block_manager_create(2, 4);
    block_table a = { 0 }, b = { 0 };
    ck_assert_int_eq(block_table_reserve(bm, &a, 8), 0);
    ck_assert_int_eq(block_table_fork(bm, &a, 2, &b), 0);
    int32_t s, d;
    ck_assert_int_eq(block_table_prepare_write(bm, &b, 0, &s, &d), -1);
    ck_assert_int_eq(b.ids[0], a.ids[0]);
    ck_assert_uint_eq(block_manager_refcount(bm, a.ids[0]), 2);
    block_table_free(bm, &a);
    block_table_free(bm, &b);
    ck_assert_uint_eq(block_manager_free_count(bm), 2);
    block_manager_free(bm);
}
END_TEST

/* Random reserves, forks and releases: refcounts always equal the number of
 * tables holding each block, and free + used == total. */
START_TEST(randomized_conservation) {
    enum { NB = 64, NT = 12 };
    block_manager *bm = block_manager_create(NB, 16);
    block_table t[NT];
    memset(t, 0, sizeof t);
    unsigned seed = 12345;
    for (int step = 0; step < 5000; step++) {
        int k = rand_r(&seed) % NT, op = rand_r(&seed) % 4;
        if (op == 0 || op == 1) {
            uint64_t want = (uint64_t)(rand_r(&seed) % 200);
            uint32_t before = t[k].n, freeb = block_manager_free_count(bm);
            int rc = block_table_reserve(bm, &t[k], want);
            if (rc == 0)
                ck_assert(t[k].n >= block_manager_blocks_for(bm, want));
            else
                ck_assert(t[k].n == before && block_manager_free_count(bm) == freeb);
        } else if (op == 2) {
            block_table_release(bm, &t[k]);
        } else {
            int j = rand_r(&seed) % NT;
            if (j != k && t[j].n == 0 && t[k].n > 0)
                ck_assert_int_eq(
                    block_table_fork(bm, &t[k], (uint32_t)(rand_r(&seed) % (t[k].n + 1)),
                                     &t[j]),
                    0);
        }
        uint32_t refs[NB] = { 0 };
        for (int i = 0; i < NT; i++)
            for (uint32_t j = 0; j < t[i].n; j++) refs[t[i].ids[j]]++;
        uint32_t used = 0;
        for (int b = 0; b < NB; b++) {
            ck_assert_uint_eq(refs[b], block_manager_refcount(bm, b));
            used += refs[b] > 0;
        }
        ck_assert_uint_eq(used, block_manager_used(bm));
        ck_assert_uint_eq(block_manager_used(bm) + block_manager_free_count(bm), NB);
    }
    for (int i = 0; i < NT; i++) block_table_free(bm, &t[i]);
    ck_assert_uint_eq(block_manager_free_count(bm), NB);
    block_manager_free(bm);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("block_manager");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, alloc_release_all_or_nothing);
    tcase_add_test(tc, refcounts_share_blocks);
    tcase_add_test(tc, tables_reserve_fork_and_copy_on_write);
    tcase_add_test(tc, cow_fails_cleanly_when_full);
    tcase_add_test(tc, randomized_conservation);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return test_run_suite(suite()); }
