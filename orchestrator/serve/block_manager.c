/*
 * block_manager.c - reference-counted KV block allocation and per-sequence
 * block tables. See block_manager.h.
 */
#include "orchestrator/serve/block_manager.h"

#include <stdlib.h>
#include <string.h>

#include "orchestrator/core/util.h"

struct block_manager {
    uint32_t total, block_size;
    uint32_t n_free;
    int32_t *free_stack;       /* n_free ids; top = free_stack[n_free-1] */
    uint32_t *refcount;        /* per block; 0 = free */
    block_reclaimer reclaimer; /* reclaim NULL: none */
};

block_manager *block_manager_create(uint32_t num_blocks, uint32_t block_size) {
    if (num_blocks == 0 || block_size == 0 || num_blocks > (uint32_t)INT32_MAX)
        return NULL;
    block_manager *bm = util_calloc(1, sizeof *bm);
    if (!bm) return NULL;
    bm->free_stack = util_calloc(num_blocks, sizeof *bm->free_stack);
    bm->refcount = util_calloc(num_blocks, sizeof *bm->refcount);
    if (!bm->free_stack || !bm->refcount) {
        block_manager_free(bm);
        return NULL;
    }
    bm->total = num_blocks;
    bm->block_size = block_size;
    /* Stack so that block 0 is handed out first. */
    for (uint32_t i = 0; i < num_blocks; i++)
        bm->free_stack[i] = (int32_t)(num_blocks - 1 - i);
    bm->n_free = num_blocks;
    return bm;
}

void block_manager_free(block_manager *bm) {
    if (!bm) return;
    free(bm->free_stack);
    free(bm->refcount);
    free(bm);
}

uint32_t block_manager_block_size(const block_manager *bm) { return bm->block_size; }
uint32_t block_manager_total(const block_manager *bm) { return bm->total; }
uint32_t block_manager_free_count(const block_manager *bm) { return bm->n_free; }
uint32_t block_manager_used(const block_manager *bm) { return bm->total - bm->n_free; }

uint32_t block_manager_blocks_for(const block_manager *bm, uint64_t n_tokens) {
    uint64_t n = (n_tokens + bm->block_size - 1) / bm->block_size;
    return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

void block_manager_set_reclaimer(block_manager *bm, const block_reclaimer *r) {
    if (r && r->reclaim && r->reclaimable)
        bm->reclaimer = *r;
    else
        memset(&bm->reclaimer, 0, sizeof bm->reclaimer);
}

static uint32_t reclaimable(const block_manager *bm) {
    return bm->reclaimer.reclaim ? bm->reclaimer.reclaimable(bm->reclaimer.arg) : 0;
}

uint32_t block_manager_available(const block_manager *bm) {
    uint64_t n = (uint64_t)bm->n_free + reclaimable(bm);
    return n > bm->total ? bm->total : (uint32_t)n;
}

/* Make at least n blocks free, evicting through the reclaimer; 0 when done,
 * -1 (nothing evicted) when not enough are available. */
static int ensure_free(block_manager *bm, uint32_t n) {
    if (n <= bm->n_free) return 0;
    if (!bm->reclaimer.reclaim || n > block_manager_available(bm)) return -1;
    (void)bm->reclaimer.reclaim(bm->reclaimer.arg, n - bm->n_free);
    return n <= bm->n_free ? 0 : -1;
}

int block_manager_alloc(block_manager *bm, uint32_t n, int32_t *out) {
    if (n && !out) return -1;
    if (ensure_free(bm, n) != 0) return -1;
    for (uint32_t i = 0; i < n; i++) {
        int32_t id = bm->free_stack[--bm->n_free];
        bm->refcount[id] = 1;
        out[i] = id;
    }
    return 0;
}

static int allocated(const block_manager *bm, int32_t id) {
    return id >= 0 && (uint32_t)id < bm->total && bm->refcount[id] > 0;
}

int block_manager_ref(block_manager *bm, int32_t id) {
    if (!allocated(bm, id) || bm->refcount[id] == UINT32_MAX) return -1;
    bm->refcount[id]++;
    return 0;
}

int block_manager_release(block_manager *bm, int32_t id) {
    if (!allocated(bm, id)) return -1;
    if (--bm->refcount[id] == 0) bm->free_stack[bm->n_free++] = id;
    return 0;
}

uint32_t block_manager_refcount(const block_manager *bm, int32_t id) {
    if (id < 0 || (uint32_t)id >= bm->total) return 0;
    return bm->refcount[id];
}

/* ------------------------------------------------------------------------- */
/* Block tables                                                               */
/* ------------------------------------------------------------------------- */
static int table_grow(block_table *t, uint32_t need) {
    if (need <= t->cap) return 0;
    uint32_t cap = t->cap ? t->cap : 8;
    while (cap < need) cap = cap > UINT32_MAX / 2 ? need : cap * 2;
    int32_t *ids = realloc(t->ids, (size_t)cap * sizeof *ids);
    if (!ids) return -1;
    t->ids = ids;
    t->cap = cap;
    return 0;
}

uint32_t block_table_missing(const block_manager *bm, const block_table *t,
                             uint64_t n_tokens) {
    uint32_t need = block_manager_blocks_for(bm, n_tokens);
    return need > t->n ? need - t->n : 0;
}

int block_table_reserve(block_manager *bm, block_table *t, uint64_t n_tokens) {
    uint32_t need = block_manager_blocks_for(bm, n_tokens);
    if (need <= t->n) return 0;
    uint32_t extra = need - t->n;
    if (extra > block_manager_available(bm) || table_grow(t, need) != 0) return -1;
    if (block_manager_alloc(bm, extra, t->ids + t->n) != 0) return -1;
    t->n = need;
    return 0;
}

int block_table_append(block_manager *bm, block_table *t, int32_t id) {
    if (!allocated(bm, id) || t->n == UINT32_MAX || table_grow(t, t->n + 1) != 0)
        return -1;
    if (block_manager_ref(bm, id) != 0) return -1;
    t->ids[t->n++] = id;
    return 0;
}

void block_table_release(block_manager *bm, block_table *t) {
    for (uint32_t j = 0; j < t->n; j++) (void)block_manager_release(bm, t->ids[j]);
    t->n = 0;
}

void block_table_free(block_manager *bm, block_table *t) {
    block_table_release(bm, t);
    free(t->ids);
    memset(t, 0, sizeof *t);
}

int block_table_fork(block_manager *bm, const block_table *src, uint32_t n_blocks,
                     block_table *dst) {
    if (!src || !dst || dst->n != 0 || n_blocks > src->n) return -1;
    if (table_grow(dst, n_blocks) != 0) return -1;
    for (uint32_t j = 0; j < n_blocks; j++) {
        if (block_manager_ref(bm, src->ids[j]) != 0) {
            for (uint32_t k = 0; k < j; k++) (void)block_manager_release(bm, src->ids[k]);
            return -1;
        }
        dst->ids[j] = src->ids[j];
    }
    dst->n = n_blocks;
    return 0;
}

int block_table_prepare_write(block_manager *bm, block_table *t, uint32_t j,
                              int32_t *copy_src, int32_t *copy_dst) {
    if (j >= t->n) return -1;
    int32_t id = t->ids[j];
    if (block_manager_refcount(bm, id) <= 1) return 0;
    int32_t fresh;
    if (block_manager_alloc(bm, 1, &fresh) != 0) return -1;
    (void)block_manager_release(bm, id);
    t->ids[j] = fresh;
    if (copy_src) *copy_src = id;
    if (copy_dst) *copy_dst = fresh;
    return 1;
}
