/*
 * test_prefix_cache.c - the prefix cache's index and eviction on its own:
 * chains are found by content along the prefix (same tokens under another
 * parent or adapter are different keys), duplicates are reported and
 * adopted, unreferenced blocks are evicted least recently released first and
 * leaves before their parents only when an allocation needs them, blocks in
 * use are never evicted, and reference counts return to zero (a randomized
 * run checks every block's count against the tables and the index).
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/serve/prefix_cache.h"
#include "tests/test_util.h"

enum { BS = 4 };

/* Fill t to cover n tokens and index its full blocks from block `from` on
 * (the ones before came from the cache); returns the full blocks. */
static uint32_t compute_from(block_manager *bm, prefix_cache *pc, block_table *t,
                             const int32_t *tok, uint32_t n, uint32_t adapter,
                             uint32_t from) {
    ck_assert_int_eq(block_table_reserve(bm, t, n), 0);
    uint32_t j = from;
    for (; j < n / BS; j++) {
        int32_t got = prefix_cache_insert(pc, adapter, j ? t->ids[j - 1] : -1,
                                          tok + j * BS, t->ids[j]);
        ck_assert_int_ge(got, 0);
        if (got != t->ids[j]) ck_assert_int_eq(prefix_cache_adopt(pc, t, j, got), 0);
    }
    return j;
}

static uint32_t compute(block_manager *bm, prefix_cache *pc, block_table *t,
                        const int32_t *tok, uint32_t n, uint32_t adapter) {
    return compute_from(bm, pc, t, tok, n, adapter, 0);
}

START_TEST(chain_lookup_by_content) {
    block_manager *bm = block_manager_create(16, BS);
    prefix_cache *pc = prefix_cache_create(bm);
    ck_assert_ptr_nonnull(pc);
    int32_t a[12] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12 };
    block_table t = { 0 };
    ck_assert_uint_eq(compute(bm, pc, &t, a, 10, 0), 2); /* 2 full, 1 partial */
    ck_assert_uint_eq(prefix_cache_blocks(pc), 2);
    ck_assert_uint_eq(prefix_cache_evictable(pc), 0);
    int32_t ids[4];
    uint32_t idle = 99;
    ck_assert_uint_eq(prefix_cache_lookup(pc, 0, a, 3, ids, &idle), 2);
    ck_assert_int_eq(ids[0], t.ids[0]);
    ck_assert_int_eq(ids[1], t.ids[1]);
    ck_assert_uint_eq(idle, 0);
    ck_assert_uint_eq(prefix_cache_lookup(pc, 0, a, 1, ids, NULL), 1); /* capped */
    /* another adapter, or a different first block, finds nothing */
    ck_assert_uint_eq(prefix_cache_lookup(pc, 1, a, 3, ids, NULL), 0);
    int32_t b[8] = { 1, 2, 3, 0, 5, 6, 7, 8 };
    ck_assert_uint_eq(prefix_cache_lookup(pc, 0, b, 2, ids, NULL), 0);
    /* the same second block under another parent is another key */
    block_table u = { 0 };
    ck_assert_uint_eq(compute(bm, pc, &u, b, 8, 0), 2);
    ck_assert_int_ne(u.ids[1], t.ids[1]);
    ck_assert_uint_eq(prefix_cache_blocks(pc), 4);
    /* parent not cached, block already indexed, unallocated block */
    ck_assert_int_eq(prefix_cache_insert(pc, 0, t.ids[2], a, u.ids[0]), -1);
    ck_assert_int_eq(prefix_cache_insert(pc, 0, -1, a + 4, t.ids[0]), -1);
    ck_assert_int_eq(prefix_cache_insert(pc, 0, -1, a + 4, 15), -1);
    ck_assert(prefix_cache_contains(pc, t.ids[1]));
    ck_assert(!prefix_cache_contains(pc, t.ids[2]));
    prefix_cache_release_table(pc, &t);
    prefix_cache_release_table(pc, &u);
    ck_assert_uint_eq(prefix_cache_evictable(pc), 4);
    ck_assert_uint_eq(block_manager_used(bm), 4); /* kept in the pool */
    ck_assert_uint_eq(block_manager_available(bm), 16);
    block_table_free(bm, &t);
    block_table_free(bm, &u);
    prefix_cache_free(pc);
    ck_assert_uint_eq(block_manager_free_count(bm), 16);
    block_manager_free(bm);
}
END_TEST

START_TEST(duplicates_are_adopted) {
    block_manager *bm = block_manager_create(8, BS);
    prefix_cache *pc = prefix_cache_create(bm);
    int32_t a[8] = { 9, 9, 9, 9, 8, 8, 8, 8 };
    block_table t = { 0 }, u = { 0 };
    compute(bm, pc, &t, a, 8, 0);
    /* u computed the same content in its own blocks before looking */
    ck_assert_int_eq(block_table_reserve(bm, &u, 8), 0);
    int32_t own0 = u.ids[0];
    int32_t got = prefix_cache_insert(pc, 0, -1, a, u.ids[0]);
    ck_assert_int_eq(got, t.ids[0]);
    ck_assert_int_eq(prefix_cache_adopt(pc, &u, 0, got), 0);
    ck_assert_int_eq(u.ids[0], t.ids[0]);
    ck_assert_uint_eq(block_manager_refcount(bm, own0), 0);     /* freed */
    ck_assert_uint_eq(block_manager_refcount(bm, t.ids[0]), 3); /* t, u, cache */
    ck_assert_int_eq(prefix_cache_adopt(pc, &u, 0, got), -1);   /* same block */
    ck_assert_int_eq(prefix_cache_adopt(pc, &u, 5, got), -1);   /* out of range */
    block_table_free(bm, &t);
    prefix_cache_release_table(pc, &u);
    block_table_free(bm, &u);
    prefix_cache_free(pc);
    ck_assert_uint_eq(block_manager_free_count(bm), 8);
    block_manager_free(bm);
}
END_TEST

START_TEST(evicts_lru_leaves_only_when_needed) {
    block_manager *bm = block_manager_create(6, BS);
    prefix_cache *pc = prefix_cache_create(bm);
    int32_t a[8] = { 1, 1, 1, 1, 2, 2, 2, 2 }, b[8] = { 3, 3, 3, 3, 4, 4, 4, 4 };
    block_table ta = { 0 }, tb = { 0 };
    compute(bm, pc, &ta, a, 8, 0);
    compute(bm, pc, &tb, b, 8, 0);
    int32_t a0 = ta.ids[0], a1 = ta.ids[1], b0 = tb.ids[0], b1 = tb.ids[1];
    prefix_cache_release_table(pc, &ta); /* a released first: least recent */
    ck_assert_uint_eq(block_manager_free_count(bm), 2);
    ck_assert_uint_eq(block_manager_available(bm), 4);
    /* tb still holds b: only a's blocks can go */
    block_table c = { 0 };
    ck_assert_int_eq(block_table_reserve(bm, &c, 12), 0); /* 3 blocks: evicts 1 */
    ck_assert_uint_eq(prefix_cache_evictions(pc), 1);
    ck_assert(!prefix_cache_contains(pc, a1)); /* the leaf first */
    ck_assert(prefix_cache_contains(pc, a0));
    ck_assert_int_eq(block_table_reserve(bm, &c, 20), -1); /* needs 2, 1 left */
    ck_assert_uint_eq(prefix_cache_evictions(pc), 1);      /* nothing evicted */
    ck_assert_int_eq(block_table_reserve(bm, &c, 16), 0);
    ck_assert(!prefix_cache_contains(pc, a0));
    ck_assert(prefix_cache_contains(pc, b0) && prefix_cache_contains(pc, b1));
    ck_assert_uint_eq(block_manager_available(bm), 0);
    int32_t x;
    ck_assert_int_eq(block_manager_alloc(bm, 1, &x), -1); /* b is in use */
    /* released b is evictable and found again until then */
    prefix_cache_release_table(pc, &tb);
    int32_t ids[2];
    ck_assert_uint_eq(prefix_cache_lookup(pc, 0, b, 2, ids, NULL), 2);
    block_table d = { 0 };
    ck_assert_int_eq(prefix_cache_acquire(pc, &d, ids, 2), 0);
    ck_assert_uint_eq(prefix_cache_evictable(pc), 0);
    ck_assert_uint_eq(block_manager_refcount(bm, b1), 2);
    prefix_cache_release_table(pc, &d);
    ck_assert_int_eq(block_manager_alloc(bm, 1, &x), 0); /* evicts b1, not b0 */
    ck_assert_int_eq(x, b1);
    ck_assert(prefix_cache_contains(pc, b0));
    ck_assert_int_eq(block_manager_release(bm, x), 0);
    ck_assert_int_eq(prefix_cache_acquire(pc, &d, &x, 1), -1); /* not cached */
    block_table_free(bm, &c);
    block_table_free(bm, &d);
    block_table_free(bm, &ta);
    block_table_free(bm, &tb);
    prefix_cache_free(pc);
    ck_assert_uint_eq(block_manager_free_count(bm), 6);
    block_manager_free(bm);
}
END_TEST

/* Random tables over a small alphabet (many shared prefixes) acquire, compute,
 * release and fork; after each step every block's count must equal its
 * table references plus the index's one. */
START_TEST(randomized_refcounts_balance) {
    enum { NB = 24, NT = 6, MAXT = 24 };
    block_manager *bm = block_manager_create(NB, BS);
    prefix_cache *pc = prefix_cache_create(bm);
    block_table t[NT];
    memset(t, 0, sizeof t);
    uint32_t rng = 12345;
    for (int step = 0; step < 4000; step++) {
        rng = rng * 1103515245u + 12345u;
        uint32_t k = (rng >> 8) % NT;
        if (t[k].n == 0) {
            int32_t tok[MAXT];
            uint32_t n = 1 + (rng >> 16) % MAXT;
            for (uint32_t i = 0; i < n; i++) {
                rng = rng * 1103515245u + 12345u;
                tok[i] = (int32_t)((rng >> 20) % 2);
            }
            int32_t ids[MAXT / BS];
            uint32_t idle;
            uint32_t m = prefix_cache_lookup(pc, 0, tok, (n - 1) / BS, ids, &idle);
            uint32_t need = block_manager_blocks_for(bm, n) - m;
            if (block_manager_available(bm) - idle < need) continue;
            ck_assert_int_eq(prefix_cache_acquire(pc, &t[k], ids, m), 0);
            ck_assert_uint_eq(compute_from(bm, pc, &t[k], tok, n, 0, m), n / BS);
        } else {
            prefix_cache_release_table(pc, &t[k]);
        }
        uint32_t refs[NB] = { 0 };
        for (uint32_t i = 0; i < NT; i++)
            for (uint32_t j = 0; j < t[i].n; j++) refs[t[i].ids[j]]++;
        uint32_t used = 0, idle = 0;
        for (int32_t b = 0; b < NB; b++) {
            uint32_t want = refs[b] + (prefix_cache_contains(pc, b) ? 1u : 0u);
            ck_assert_uint_eq(block_manager_refcount(bm, b), want);
            used += want > 0;
            idle += prefix_cache_contains(pc, b) && refs[b] == 0;
        }
        ck_assert_uint_eq(block_manager_used(bm), used);
        ck_assert_uint_eq(prefix_cache_evictable(pc), idle);
    }
    ck_assert_uint_gt(prefix_cache_evictions(pc), 0);
    for (uint32_t i = 0; i < NT; i++) {
        prefix_cache_release_table(pc, &t[i]);
        block_table_free(bm, &t[i]);
    }
    ck_assert_uint_eq(prefix_cache_evictable(pc), prefix_cache_blocks(pc));
    prefix_cache_free(pc);
    ck_assert_uint_eq(block_manager_free_count(bm), NB);
    for (int32_t b = 0; b < NB; b++) ck_assert_uint_eq(block_manager_refcount(bm, b), 0);
    block_manager_free(bm);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("prefix_cache");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, chain_lookup_by_content);
    tcase_add_test(tc, duplicates_are_adopted);
    tcase_add_test(tc, evicts_lru_leaves_only_when_needed);
    tcase_add_test(tc, randomized_refcounts_balance);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return test_run_suite(suite()); }
