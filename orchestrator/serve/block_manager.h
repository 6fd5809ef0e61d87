/*
 * block_manager.h - the paged KV cache's bookkeeping: which of the engine's
 * fixed-size KV blocks are free, and which blocks each sequence uses (its
 * block table). The engine owns the memory (kv_configure); this module only
 * hands out block ids.
 *
 * Blocks are reference-counted so that several sequences can share read-only
 * blocks (prefix caching, n > 1 choices of one prompt): a block returns to the
 * free list when its last reference is released. A block with more than one
 * reference must be copied (engine kv_copy_blocks) before a sequence writes
 * into it; block_table_prepare_write tells the caller which copy to make.
 *
 * Free blocks are handed out last-freed-first (a stack), which keeps recently
 * used memory warm.
 *
 * A reclaimer (the prefix cache, prefix_cache.h) may keep unreferenced blocks
 * allocated for later reuse: when an allocation finds too few free blocks it
 * asks the reclaimer to release some (eviction), and block_manager_available
 * counts them as obtainable.
 *
 * Memory: the manager owns its arrays; a block_table owns its id array
 * (block_table_free). Threads: not thread-safe; the scheduler thread owns the
 * manager and every table. Errors: functions return 0 on success and -1 when
 * there are not enough free blocks (nothing changes) or on bad arguments;
 * allocation failure at create returns NULL.
 */
#ifndef ORCH_BLOCK_MANAGER_H
#define ORCH_BLOCK_MANAGER_H

#include <stddef.h>
#include <stdint.h>

/* Positions per KV block: the one block size of the orchestrator (`orch serve`
 * and `orch generate` configure the engine's pool with it, kv_configure). */
#define ORCH_KV_BLOCK_TOKENS 16u

typedef struct block_manager block_manager;

/* A manager over num_blocks blocks (ids 0..num_blocks-1) of block_size
 * positions. NULL on bad arguments (0 blocks, 0 size) or out of memory. */
block_manager *block_manager_create(uint32_t num_blocks, uint32_t block_size);
void block_manager_free(block_manager *bm); /* NULL is a no-op */

uint32_t block_manager_block_size(const block_manager *bm);
uint32_t block_manager_total(const block_manager *bm);
uint32_t block_manager_free_count(const block_manager *bm);
uint32_t block_manager_used(const block_manager *bm); /* total - free */

/* The reclaimer: reclaimable(arg) is how many allocated blocks it could give
 * back now; reclaim(arg, n) releases up to n of them (block_manager_release)
 * and returns how many it released. Called from inside allocations on the
 * manager's thread. fn NULL removes the reclaimer. */
typedef struct block_reclaimer {
    uint32_t (*reclaimable)(void *arg);
    uint32_t (*reclaim)(void *arg, uint32_t n);
    void *arg;
} block_reclaimer;
void block_manager_set_reclaimer(block_manager *bm, const block_reclaimer *r);
/* Free blocks plus what the reclaimer could give back. */
uint32_t block_manager_available(const block_manager *bm);

/* Blocks needed to hold n_tokens positions (ceil(n_tokens / block_size)). */
uint32_t block_manager_blocks_for(const block_manager *bm, uint64_t n_tokens);

/* Take n free blocks (refcount 1 each) into out[0..n): all or nothing (the
 * reclaimer is asked first when fewer than n are free but enough are
 * available; blocks it evicts stay evicted). */
int block_manager_alloc(block_manager *bm, uint32_t n, int32_t *out);
/* Add a reference to an allocated block (sharing). -1 if id is not
 * allocated. */
int block_manager_ref(block_manager *bm, int32_t id);
/* Drop a reference; the block is free again at zero. -1 if id is not
 * allocated (double free), which leaves everything unchanged. */
int block_manager_release(block_manager *bm, int32_t id);
/* Current reference count of a block (0 = free or out of range). */
uint32_t block_manager_refcount(const block_manager *bm, int32_t id);

/* ---- block tables ---- */
typedef struct block_table {
    int32_t *ids; /* logical block j -> pool block ids[j] */
    uint32_t n;   /* blocks in the table */
    uint32_t cap; /* capacity of ids */
} block_table;

/* Grow t so that it covers n_tokens positions, allocating new blocks at the
 * end. All or nothing: -1 (t unchanged) when the pool lacks free blocks or
 * memory. Never shrinks. */
int block_table_reserve(block_manager *bm, block_table *t, uint64_t n_tokens);
/* Blocks t still needs to cover n_tokens positions (0 if it covers them). */
uint32_t block_table_missing(const block_manager *bm, const block_table *t,
                             uint64_t n_tokens);
/* Append the allocated block id to t with one more reference (sharing a
 * cached block). -1 when id is not allocated or out of memory (t unchanged). */
int block_table_append(block_manager *bm, block_table *t, int32_t id);
/* Release every block of t (n = 0); keeps the id array for reuse. */
void block_table_release(block_manager *bm, block_table *t);
/* Release blocks and free the id array (t is zeroed). */
void block_table_free(block_manager *bm, block_table *t);
/* Make dst share the first n_blocks blocks of src (one more reference each).
 * dst must be empty. -1 on bad arguments or out of memory. */
int block_table_fork(block_manager *bm, const block_table *src, uint32_t n_blocks,
                     block_table *dst);
/* Before writing positions into logical block j of t: if that block is
 * shared, allocate a private copy target, put it in the table, drop one
 * reference of the shared block and report *copy_src / *copy_dst (the caller
 * must have the engine copy src -> dst before the write) and return 1.
 * Returns 0 when the block is already private, -1 when no block is free
 * (table unchanged) or j is out of range. */
int block_table_prepare_write(block_manager *bm, block_table *t, uint32_t j,
                              int32_t *copy_src, int32_t *copy_dst);

#endif
