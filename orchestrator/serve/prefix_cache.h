/*
 * prefix_cache.h - automatic prefix caching of KV blocks (the idea of vLLM's
 * automatic prefix caching and SGLang's RadixAttention): every FULL KV block
 * a sequence computes is indexed by its content along the prefix, a hash
 * chain key(parent block, the block's block_size token ids, adapter id), so a
 * later sequence whose token ids start the same way reuses those blocks and
 * computes only the rest.
 *
 * The cache holds one reference (block_manager_ref) on every block it indexes.
 * A cached block that no sequence references any more (refcount 1: only the
 * cache) stays in the pool, "evictable"; it is evicted, least recently
 * released first and leaves of the prefix tree first, only when the block
 * manager needs free blocks (the cache is the manager's reclaimer,
 * block_manager.h). A block some sequence references is never evicted.
 *
 * Lookups compare the stored token ids and the parent block, not only the
 * hash, so a hash collision can never hand out wrong KV. The adapter id is
 * part of the key (0 today; a LoRA adapter's blocks must never be shared with
 * the base model's).
 *
 * Invariant the caller keeps (the scheduler does): a table's blocks
 * 0..k-1 that are registered (prefix_cache_insert / _acquire / _adopt) form a
 * chain from the root, block j's parent being block j-1 of the same table.
 * Then a cached block's ancestors are referenced at least as often as it is,
 * so every evictable block can be reached by evicting leaves first, and
 * prefix_cache_evictable is exactly what eviction can free.
 *
 * Memory: the cache owns its arrays (sized by the manager's pool at create).
 * Threads: not thread-safe; the thread that owns the block manager uses it.
 * Errors: as documented per function; nothing changes on failure.
 */
#ifndef ORCH_PREFIX_CACHE_H
#define ORCH_PREFIX_CACHE_H

#include <stdint.h>

#include "orchestrator/serve/block_manager.h"

typedef struct prefix_cache prefix_cache;

/* A cache over bm's blocks; installs itself as bm's reclaimer. bm must
 * outlive the cache. NULL on bad arguments or out of memory. */
prefix_cache *prefix_cache_create(block_manager *bm);
/* Drop the cache's references (evictable blocks return to the free list;
 * blocks sequences still hold stay theirs) and remove the reclaimer. NULL is
 * a no-op. */
void prefix_cache_free(prefix_cache *pc);

/* The longest run of cached blocks matching tokens[0 .. max_blocks *
 * block_size): block ids into out[0..return) (out holds max_blocks). No
 * reference is taken. *n_idle (may be NULL) = how many of them are evictable
 * now (taking them lowers block_manager_available by that much). */
uint32_t prefix_cache_lookup(const prefix_cache *pc, uint32_t adapter_id,
                             const int32_t *tokens, uint32_t max_blocks, int32_t *out,
                             uint32_t *n_idle);

/* Append ids[0..n) (from prefix_cache_lookup, nothing evicted since) to t,
 * one reference each; they stop being evictable. -1 (t unchanged) when an id
 * is not cached or out of memory. */
int prefix_cache_acquire(prefix_cache *pc, block_table *t, const int32_t *ids,
                         uint32_t n);

/* Index block `id`, now full with tokens[0..block_size), whose parent is
 * block `parent` (the previous block of the same table; -1 for the first).
 * Returns id when it is now cached (the cache took a reference), the id of an
 * already cached block with the same key (content computed twice: the caller
 * should switch to it with prefix_cache_adopt), or -1 when parent is not
 * cached (>= 0) or id is not allocated / already indexed. */
int32_t prefix_cache_insert(prefix_cache *pc, uint32_t adapter_id, int32_t parent,
                            const int32_t *tokens, int32_t id);

/* Replace block j of t by the cached block `id` with the same content (one
 * reference more on id, one less on the old block). -1 on bad arguments. */
int prefix_cache_adopt(prefix_cache *pc, block_table *t, uint32_t j, int32_t id);

/* Release every block of t, last block first (so leaves become evictable
 * before their parents); t->n = 0. Cached blocks left with only the cache's
 * reference become evictable (most recently used). */
void prefix_cache_release_table(prefix_cache *pc, block_table *t);

uint32_t prefix_cache_blocks(const prefix_cache *pc);    /* indexed blocks */
uint32_t prefix_cache_evictable(const prefix_cache *pc); /* of those, unreferenced */
uint64_t prefix_cache_evictions(const prefix_cache *pc); /* evicted so far */
/* 1 when block id is indexed. */
int prefix_cache_contains(const prefix_cache *pc, int32_t id);

#endif
