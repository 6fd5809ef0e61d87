/*
 * radix_text.h - the approximate radix tree of `orch route`'s cache-aware
 * policy: one per worker, over the raw text (bytes) of the requests routed to
 * that worker, never tokenized. It approximates what the worker's prefix
 * cache holds: the longest stored prefix of a new request is what the worker
 * is likely to have cached for it.
 *
 * Edges carry byte strings; a node's children start with distinct bytes.
 * Every match and insert stamps the nodes on its path with a logical clock,
 * so a parent is never older than its children and eviction can take the
 * least recently used leaves first (radix_text_evict) until the tree holds
 * at most a given number of bytes. Eviction removes whole leaves; a node
 * whose last child went becomes a leaf and a candidate in turn.
 *
 * Memory: the tree owns copies of every string inserted; radix_text_free
 * releases all. Threads: none inside; a tree must be used by one thread at a
 * time (the worker set locks it). Errors: radix_text_create returns NULL and
 * radix_text_insert -1 when out of memory (a failed insert leaves the tree
 * valid, possibly with a shorter prefix stored).
 */
#ifndef ORCH_RADIX_TEXT_H
#define ORCH_RADIX_TEXT_H

#include <stddef.h>
#include <stdint.h>

typedef struct radix_text radix_text;

radix_text *radix_text_create(void);
void radix_text_free(radix_text *t); /* NULL is a no-op */

/* Bytes of the longest prefix of s[0..n) stored in the tree (a match may end
 * inside an edge). Refreshes the matched path's LRU stamp. */
size_t radix_text_match(radix_text *t, const char *s, size_t n);

/* Store s[0..n) (shared prefixes are stored once). 0, or -1 out of memory. */
int radix_text_insert(radix_text *t, const char *s, size_t n);

/* Bytes held on the edges (the tree's size for --max-tree-size). */
size_t radix_text_size(const radix_text *t);

/* Nodes, the root excluded (for tests). */
size_t radix_text_nodes(const radix_text *t);

/* Remove least recently used leaves until the size is <= max_bytes; returns
 * the bytes removed. */
size_t radix_text_evict(radix_text *t, size_t max_bytes);

#endif
