/*
 * prefix_cache.c - the hash-chain index of full KV blocks with LRU eviction of
 * unreferenced leaves. See prefix_cache.h.
 *
 * One entry per pool block (entry i describes block i), so the index never
 * allocates after create. Entries with the same hash bucket form a singly
 * linked chain; evictable entries form a doubly linked list, oldest at the
 * head.
 */
#include "orchestrator/serve/prefix_cache.h"

#include <stdlib.h>
#include <string.h>

#include "orchestrator/core/util.h"

#define ROOT_HASH 0x6a09e667f3bcc909ull /* the parent hash of a first block */

typedef struct pc_entry {
    uint64_t hash;
    int32_t parent;      /* block id, -1 for a first block */
    int32_t hnext;       /* next entry of the bucket, -1 at the end */
    int32_t prev, next;  /* evictable list links, -1 at the ends */
    uint32_t n_children; /* indexed blocks whose parent this is */
    uint32_t adapter;
    uint8_t cached, evictable;
} pc_entry;

struct prefix_cache {
    block_manager *bm;
    uint32_t total, bs;
    pc_entry *e;     /* [total] */
    int32_t *tokens; /* [total * bs]: the token ids of each indexed block */
    int32_t *bucket; /* [n_buckets], -1 empty */
    uint32_t mask;   /* n_buckets - 1 */
    int32_t lru_head, lru_tail;
    uint32_t n_cached, n_evictable;
    uint64_t n_evicted;
};

/* splitmix64's finaliser: a strong 64-bit mix. */
static uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

static uint64_t block_hash(uint64_t parent_hash, uint32_t adapter, const int32_t *tok,
                           uint32_t bs) {
    uint64_t h = mix64(parent_hash ^ ((uint64_t)adapter << 32 | 0x9e3779b9u));
    for (uint32_t i = 0; i < bs; i++) h = mix64(h ^ (uint64_t)(uint32_t)tok[i]) + i;
    return h;
}

/* The entry with this key, or -1. */
static int32_t find(const prefix_cache *pc, uint64_t h, int32_t parent, uint32_t adapter,
                    const int32_t *tok) {
    for (int32_t i = pc->bucket[h & pc->mask]; i >= 0; i = pc->e[i].hnext) {
        const pc_entry *x = &pc->e[i];
        if (x->hash == h && x->parent == parent && x->adapter == adapter &&
            memcmp(pc->tokens + (size_t)i * pc->bs, tok, pc->bs * sizeof *tok) == 0)
            return i;
    }
    return -1;
}

static void lru_unlink(prefix_cache *pc, int32_t i) {
    pc_entry *x = &pc->e[i];
    if (!x->evictable) return;
    if (x->prev >= 0)
        pc->e[x->prev].next = x->next;
    else
        pc->lru_head = x->next;
    if (x->next >= 0)
        pc->e[x->next].prev = x->prev;
    else
        pc->lru_tail = x->prev;
    x->prev = x->next = -1;
    x->evictable = 0;
    pc->n_evictable--;
}

static void lru_push_back(prefix_cache *pc, int32_t i) {
    pc_entry *x = &pc->e[i];
    x->prev = pc->lru_tail;
    x->next = -1;
    if (pc->lru_tail >= 0)
        pc->e[pc->lru_tail].next = i;
    else
        pc->lru_head = i;
    pc->lru_tail = i;
    x->evictable = 1;
    pc->n_evictable++;
}

/* Drop entry i from the index and release the cache's reference. */
static void evict(prefix_cache *pc, int32_t i) {
    pc_entry *x = &pc->e[i];
    lru_unlink(pc, i);
    int32_t *p = &pc->bucket[x->hash & pc->mask];
    while (*p != i) p = &pc->e[*p].hnext;
    *p = x->hnext;
    if (x->parent >= 0) pc->e[x->parent].n_children--;
    x->cached = 0;
    x->hnext = -1;
    pc->n_cached--;
    (void)block_manager_release(pc->bm, i);
}

static uint32_t rc_reclaimable(void *arg) { return ((prefix_cache *)arg)->n_evictable; }

/* Evict up to n evictable leaves, oldest first. */
static uint32_t rc_reclaim(void *arg, uint32_t n) {
    prefix_cache *pc = arg;
    uint32_t done = 0;
    while (done < n) {
        int32_t i = pc->lru_head;
        while (i >= 0 && pc->e[i].n_children > 0) i = pc->e[i].next;
        if (i < 0) break; /* cannot happen while the header's invariant holds */
        evict(pc, i);
        pc->n_evicted++;
        done++;
    }
    return done;
}

prefix_cache *prefix_cache_create(block_manager *bm) {
    if (!bm) return NULL;
    prefix_cache *pc = util_calloc(1, sizeof *pc);
    if (!pc) return NULL;
    pc->bm = bm;
    pc->total = block_manager_total(bm);
    pc->bs = block_manager_block_size(bm);
    uint32_t nb = 16;
    while (nb < 2u * pc->total && nb < (1u << 30)) nb *= 2;
    pc->mask = nb - 1;
    pc->e = util_calloc(pc->total, sizeof *pc->e);
    pc->tokens = util_calloc((size_t)pc->total * pc->bs, sizeof *pc->tokens);
    pc->bucket = util_calloc(nb, sizeof *pc->bucket);
    if (!pc->e || !pc->tokens || !pc->bucket) {
        free(pc->e);
        free(pc->tokens);
        free(pc->bucket);
        free(pc);
        return NULL;
    }
    for (uint32_t i = 0; i < nb; i++) pc->bucket[i] = -1;
    for (uint32_t i = 0; i < pc->total; i++) {
        pc->e[i].parent = pc->e[i].hnext = -1;
        pc->e[i].prev = pc->e[i].next = -1;
    }
    pc->lru_head = pc->lru_tail = -1;
    block_reclaimer r = { rc_reclaimable, rc_reclaim, pc };
    block_manager_set_reclaimer(bm, &r);
    return pc;
}

void prefix_cache_free(prefix_cache *pc) {
    if (!pc) return;
    block_manager_set_reclaimer(pc->bm, NULL);
    for (uint32_t i = 0; i < pc->total; i++)
        if (pc->e[i].cached) (void)block_manager_release(pc->bm, (int32_t)i);
    free(pc->e);
    free(pc->tokens);
    free(pc->bucket);
    free(pc);
}

uint32_t prefix_cache_lookup(const prefix_cache *pc, uint32_t adapter_id,
                             const int32_t *tokens, uint32_t max_blocks, int32_t *out,
                             uint32_t *n_idle) {
    uint32_t n = 0, idle = 0;
    int32_t parent = -1;
    uint64_t ph = ROOT_HASH;
    while (n < max_blocks) {
        const int32_t *tok = tokens + (size_t)n * pc->bs;
        uint64_t h = block_hash(ph, adapter_id, tok, pc->bs);
        int32_t i = find(pc, h, parent, adapter_id, tok);
        if (i < 0) break;
        if (pc->e[i].evictable) idle++;
        out[n++] = i;
        parent = i;
        ph = h;
    }
    if (n_idle) *n_idle = idle;
    return n;
}

int prefix_cache_acquire(prefix_cache *pc, block_table *t, const int32_t *ids,
                         uint32_t n) {
    for (uint32_t k = 0; k < n; k++)
        if (ids[k] < 0 || (uint32_t)ids[k] >= pc->total || !pc->e[ids[k]].cached)
            return -1;
    uint32_t n0 = t->n;
    for (uint32_t k = 0; k < n; k++) {
        if (block_table_append(pc->bm, t, ids[k]) != 0) {
            /* undo (out of memory): the blocks were evictable or shared */
            while (t->n > n0) {
                int32_t id = t->ids[--t->n];
                (void)block_manager_release(pc->bm, id);
                if (block_manager_refcount(pc->bm, id) == 1 && !pc->e[id].evictable)
                    lru_push_back(pc, id);
            }
            return -1;
        }
        lru_unlink(pc, ids[k]);
    }
    return 0;
}

int32_t prefix_cache_insert(prefix_cache *pc, uint32_t adapter_id, int32_t parent,
                            const int32_t *tokens, int32_t id) {
    if (id < 0 || (uint32_t)id >= pc->total || pc->e[id].cached ||
        block_manager_refcount(pc->bm, id) == 0)
        return -1;
    if (parent >= 0 && ((uint32_t)parent >= pc->total || !pc->e[parent].cached))
        return -1;
    uint64_t ph = parent >= 0 ? pc->e[parent].hash : ROOT_HASH;
    uint64_t h = block_hash(ph, adapter_id, tokens, pc->bs);
    int32_t have = find(pc, h, parent, adapter_id, tokens);
    if (have >= 0) return have;
    if (block_manager_ref(pc->bm, id) != 0) return -1;
    pc_entry *x = &pc->e[id];
    x->hash = h;
    x->parent = parent;
    x->adapter = adapter_id;
    x->n_children = 0;
    x->cached = 1;
    x->evictable = 0;
    x->prev = x->next = -1;
    memcpy(pc->tokens + (size_t)id * pc->bs, tokens, pc->bs * sizeof *tokens);
    x->hnext = pc->bucket[h & pc->mask];
    pc->bucket[h & pc->mask] = id;
    if (parent >= 0) pc->e[parent].n_children++;
    pc->n_cached++;
    return id;
}

/* One reference less on block id; an indexed block left with the cache's
 * reference only becomes evictable. */
static void release_block(prefix_cache *pc, int32_t id) {
    if (block_manager_release(pc->bm, id) != 0) return;
    if (pc->e[id].cached && !pc->e[id].evictable &&
        block_manager_refcount(pc->bm, id) == 1)
        lru_push_back(pc, id);
}

int prefix_cache_adopt(prefix_cache *pc, block_table *t, uint32_t j, int32_t id) {
    if (j >= t->n || id < 0 || (uint32_t)id >= pc->total || !pc->e[id].cached ||
        t->ids[j] == id)
        return -1;
    if (block_manager_ref(pc->bm, id) != 0) return -1;
    lru_unlink(pc, id);
    release_block(pc, t->ids[j]);
    t->ids[j] = id;
    return 0;
}

void prefix_cache_release_table(prefix_cache *pc, block_table *t) {
    for (uint32_t j = t->n; j-- > 0;) release_block(pc, t->ids[j]);
    t->n = 0;
}

uint32_t prefix_cache_blocks(const prefix_cache *pc) { return pc ? pc->n_cached : 0; }
uint32_t prefix_cache_evictable(const prefix_cache *pc) {
    return pc ? pc->n_evictable : 0;
}
uint64_t prefix_cache_evictions(const prefix_cache *pc) { return pc ? pc->n_evicted : 0; }
int prefix_cache_contains(const prefix_cache *pc, int32_t id) {
    return pc && id >= 0 && (uint32_t)id < pc->total && pc->e[id].cached;
}
