/*
 * radix_text.c - the approximate byte radix tree of the cache-aware router
 * (see radix_text.h): match, insert with edge splits, LRU leaf eviction
 * through a binary min-heap of leaves ordered by their stamp.
 */
#include "orchestrator/route/radix_text.h"

#include <stdlib.h>
#include <string.h>

typedef struct rnode rnode;
struct rnode {
    char *label; /* the edge into this node (root: none) */
    size_t len;
    rnode *parent;
    rnode **kids;
    uint32_t n_kids, cap;
    uint64_t stamp; /* logical time of the last match or insert through it */
};

struct radix_text {
    rnode root;
    uint64_t clock;
    size_t bytes, nodes;
};

radix_text *radix_text_create(void) { return calloc(1, sizeof(radix_text)); }

static void free_node(rnode *n) {
    for (uint32_t i = 0; i < n->n_kids; i++) free_node(n->kids[i]);
    free(n->kids);
    free(n->label);
    free(n);
}

void radix_text_free(radix_text *t) {
    if (!t) return;
    for (uint32_t i = 0; i < t->root.n_kids; i++) free_node(t->root.kids[i]);
    free(t->root.kids);
    free(t);
}

size_t radix_text_size(const radix_text *t) { return t ? t->bytes : 0; }
size_t radix_text_nodes(const radix_text *t) { return t ? t->nodes : 0; }

static rnode *child_of(const rnode *n, unsigned char c) {
    for (uint32_t i = 0; i < n->n_kids; i++)
        if ((unsigned char)n->kids[i]->label[0] == c) return n->kids[i];
    return NULL;
}

static size_t common(const char *a, size_t na, const char *b, size_t nb) {
    size_t m = na < nb ? na : nb, i = 0;
    while (i < m && a[i] == b[i]) i++;
    return i;
}

size_t radix_text_match(radix_text *t, const char *s, size_t n) {
    if (!t || !s) return 0;
    uint64_t now = ++t->clock;
    rnode *cur = &t->root;
    size_t i = 0;
    cur->stamp = now;
    while (i < n) {
        rnode *k = child_of(cur, (unsigned char)s[i]);
        if (!k) break;
        size_t c = common(k->label, k->len, s + i, n - i);
        k->stamp = now;
        i += c;
        if (c < k->len) break;
        cur = k;
    }
    return i;
}

static int add_kid(rnode *p, rnode *k) {
    if (p->n_kids == p->cap) {
        uint32_t cap = p->cap ? p->cap * 2 : 2;
        rnode **nk = realloc(p->kids, cap * sizeof *nk);
        if (!nk) return -1;
        p->kids = nk;
        p->cap = cap;
    }
    p->kids[p->n_kids++] = k;
    k->parent = p;
    return 0;
}

static rnode *new_node(const char *s, size_t n, uint64_t stamp) {
    rnode *k = calloc(1, sizeof *k);
    if (!k) return NULL;
    k->label = malloc(n);
    if (!k->label) {
        free(k);
        return NULL;
    }
    memcpy(k->label, s, n);
    k->len = n;
    k->stamp = stamp;
    return k;
}

/* Split k after c bytes: k keeps the head, a new child takes the tail and
 * k's children. 0 or -1. */
static int split(radix_text *t, rnode *k, size_t c) {
    rnode *tail = new_node(k->label + c, k->len - c, k->stamp);
    char *head = tail ? malloc(c) : NULL;
    if (!head) {
        if (tail) free_node(tail);
        return -1;
    }
    memcpy(head, k->label, c);
    tail->kids = k->kids;
    tail->n_kids = k->n_kids;
    tail->cap = k->cap;
    for (uint32_t i = 0; i < tail->n_kids; i++) tail->kids[i]->parent = tail;
    k->kids = NULL;
    k->n_kids = k->cap = 0;
    free(k->label);
    k->label = head;
    k->len = c;
    if (add_kid(k, tail) != 0) { /* undo: k takes its tail back */
        char *whole = malloc(c + tail->len);
        if (whole) {
            memcpy(whole, head, c);
            memcpy(whole + c, tail->label, tail->len);
            free(k->label);
            k->label = whole;
            k->len += tail->len;
        }
        k->kids = tail->kids;
        k->n_kids = tail->n_kids;
        k->cap = tail->cap;
        for (uint32_t i = 0; i < k->n_kids; i++) k->kids[i]->parent = k;
        tail->kids = NULL;
        tail->n_kids = 0;
        free_node(tail);
        return -1;
    }
    t->nodes++;
    return 0;
}

int radix_text_insert(radix_text *t, const char *s, size_t n) {
    if (!t || (!s && n)) return -1;
    uint64_t now = ++t->clock;
    rnode *cur = &t->root;
    size_t i = 0;
    cur->stamp = now;
    while (i < n) {
        rnode *k = child_of(cur, (unsigned char)s[i]);
        if (!k) {
            rnode *leaf = new_node(s + i, n - i, now);
            if (!leaf) return -1;
            if (add_kid(cur, leaf) != 0) {
                free_node(leaf);
                return -1;
            }
            t->nodes++;
            t->bytes += n - i;
            return 0;
        }
        size_t c = common(k->label, k->len, s + i, n - i);
        /* the tail keeps the old stamp: it is not on this path */
        if (c < k->len && split(t, k, c) != 0) return -1;
        k->stamp = now;
        i += c;
        cur = k;
    }
    return 0;
}

/* ---- eviction: a min-heap of leaves by stamp ---------------------------- */
typedef struct heap {
    rnode **a;
    size_t n, cap;
} heap;

static int heap_push(heap *h, rnode *x) {
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        rnode **na = realloc(h->a, cap * sizeof *na);
        if (!na) return -1;
        h->a = na;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h->a[p]->stamp <= x->stamp) break;
        h->a[i] = h->a[p];
        i = p;
    }
    h->a[i] = x;
    return 0;
}

static rnode *heap_pop(heap *h) {
    rnode *top = h->a[0], *last = h->a[--h->n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const rnode *best = last;
        if (l < h->n && h->a[l]->stamp < best->stamp) m = l, best = h->a[l];
        if (r < h->n && h->a[r]->stamp < best->stamp) m = r;
        if (m == i) break;
        h->a[i] = h->a[m];
        i = m;
    }
    if (h->n) h->a[i] = last;
    return top;
}

static int collect_leaves(rnode *n, heap *h) {
    if (n->n_kids == 0) return heap_push(h, n);
    for (uint32_t i = 0; i < n->n_kids; i++)
        if (collect_leaves(n->kids[i], h) != 0) return -1;
    return 0;
}

static void unlink_kid(rnode *p, const rnode *k) {
    for (uint32_t i = 0; i < p->n_kids; i++)
        if (p->kids[i] == k) {
            p->kids[i] = p->kids[--p->n_kids];
            return;
        }
}

size_t radix_text_evict(radix_text *t, size_t max_bytes) {
    if (!t || t->bytes <= max_bytes) return 0;
    heap h = { 0 };
    size_t removed = 0;
    int ok = 1;
    for (uint32_t i = 0; i < t->root.n_kids && ok; i++)
        ok = collect_leaves(t->root.kids[i], &h) == 0;
    while (t->bytes > max_bytes && h.n) {
        rnode *leaf = heap_pop(&h);
        rnode *p = leaf->parent;
        unlink_kid(p, leaf);
        t->bytes -= leaf->len;
        removed += leaf->len;
        t->nodes--;
        free(leaf->label);
        free(leaf->kids);
        free(leaf);
        if (p != &t->root && p->n_kids == 0 && heap_push(&h, p) != 0) break;
    }
    free(h.a);
    /* out of memory while collecting: drop everything rather than overflow */
    if (!ok && t->bytes > max_bytes) {
        for (uint32_t i = 0; i < t->root.n_kids; i++) free_node(t->root.kids[i]);
        t->root.n_kids = 0;
        removed += t->bytes;
        t->bytes = 0;
        t->nodes = 0;
    }
    return removed;
}
