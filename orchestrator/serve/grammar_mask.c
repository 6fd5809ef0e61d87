/*
 * grammar_mask.c - vocabulary trie, per-state token masks, jump-forward, the
 * grammar cache and the scheduler hooks. See grammar_mask.h.
 */
#include "orchestrator/serve/grammar_mask.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/core/utf8.h"
#include "orchestrator/core/util.h"
#include "orchestrator/serve/sampler.h"

/* ------------------------------------------------------------------------- */
/* Vocabulary trie                                                            */
/* ------------------------------------------------------------------------- */
typedef struct tnode {
    int32_t child, sib; /* first child, next sibling (-1: none) */
    int32_t token;      /* a token ending here, or -1 */
    uint8_t byte;
} tnode;

typedef struct trie {
    tnode *n;
    uint32_t count, cap;
    int32_t *same_next; /* [vocab] next token with the same bytes, or -1 */
    uint32_t depth;     /* longest token */
} trie;

static int32_t trie_add_node(trie *t, uint8_t b) {
    if (t->count == t->cap) {
        uint32_t c = t->cap ? t->cap * 2 : 1024;
        tnode *x = realloc(t->n, c * sizeof *x);
        if (!x) return -1;
        t->n = x;
        t->cap = c;
    }
    t->n[t->count] = (tnode){ -1, -1, -1, b };
    return (int32_t)t->count++;
}

static int trie_build(trie *t, const tokenizer *tok, uint32_t vocab, int32_t eot) {
    memset(t, 0, sizeof *t);
    t->same_next = malloc((vocab ? vocab : 1) * sizeof *t->same_next);
    if (!t->same_next || trie_add_node(t, 0) < 0) return -1;
    for (uint32_t v = 0; v < vocab; v++) {
        t->same_next[v] = -1;
        const char *b;
        size_t n;
        if ((int32_t)v == eot || tokenizer_token_bytes(tok, (int32_t)v, &b, &n) != 0 ||
            n == 0)
            continue;
        if (n > t->depth) t->depth = (uint32_t)n;
        int32_t cur = 0;
        for (size_t i = 0; i < n; i++) {
            int32_t c = t->n[cur].child, found = -1;
            for (; c >= 0; c = t->n[c].sib)
                if (t->n[c].byte == (uint8_t)b[i]) {
                    found = c;
                    break;
                }
            if (found < 0) {
                found = trie_add_node(t, (uint8_t)b[i]);
                if (found < 0) return -1;
                t->n[found].sib = t->n[cur].child;
                t->n[cur].child = found;
            }
            cur = found;
        }
        t->same_next[v] = t->n[cur].token;
        t->n[cur].token = (int32_t)v;
    }
    return 0;
}

/* ------------------------------------------------------------------------- */
/* Grammars and the cache                                                     */
/* ------------------------------------------------------------------------- */
struct grammar {
    grammar_cache *cache;
    atomic_int refs;
    regex_dfa *dfa;
    char *key;
    size_t key_len;
    uint64_t hash;
    uint64_t last_use;
    pthread_mutex_t mu; /* masks */
    uint32_t **masks;   /* [n_states] lazily computed */
    size_t mask_bytes;
    grammar *next; /* cache list */
};

struct grammar_cache {
    const tokenizer *tok;
    uint32_t vocab, words, max_entries;
    int32_t eot;
    trie t;
    atomic_int refs;          /* the owner's + one per live grammar */
    atomic_size_t mask_bytes; /* cached masks of every grammar */
    pthread_mutex_t mu;
    grammar *head;
    uint32_t entries;
    uint64_t clock, hits, misses;
};

static void cache_unref(grammar_cache *c) {
    if (atomic_fetch_sub(&c->refs, 1) != 1) return;
    free(c->t.n);
    free(c->t.same_next);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

grammar_cache *grammar_cache_create(const tokenizer *tok, uint32_t vocab,
                                    uint32_t max_entries) {
    grammar_cache *c = util_calloc(1, sizeof *c);
    if (!c) return NULL;
    c->tok = tok;
    c->vocab = vocab;
    c->words = (uint32_t)SAMPLER_MASK_WORDS(vocab);
    c->max_entries = max_entries ? max_entries : 1;
    c->eot = tokenizer_eot(tok);
    if (c->eot >= (int32_t)vocab) c->eot = -1;
    atomic_init(&c->refs, 1);
    atomic_init(&c->mask_bytes, 0);
    pthread_mutex_init(&c->mu, NULL);
    if (trie_build(&c->t, tok, vocab, c->eot) != 0) {
        grammar_cache_free(c);
        return NULL;
    }
    return c;
}

static void grammar_destroy(grammar *g) {
    if (g->masks && g->dfa)
        for (uint32_t i = 0; i < regex_dfa_states(g->dfa); i++) free(g->masks[i]);
    atomic_fetch_sub(&g->cache->mask_bytes, g->mask_bytes);
    free(g->masks);
    regex_dfa_free(g->dfa);
    free(g->key);
    pthread_mutex_destroy(&g->mu);
    grammar_cache *c = g->cache;
    free(g);
    cache_unref(c);
}

void grammar_cache_free(grammar_cache *c) {
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    grammar *g = c->head;
    c->head = NULL;
    c->entries = 0;
    pthread_mutex_unlock(&c->mu);
    while (g) {
        grammar *n = g->next;
        grammar_release(g);
        g = n;
    }
    cache_unref(c); /* freed with the last grammar still referenced elsewhere */
}

void grammar_release(grammar *g) {
    if (g && atomic_fetch_sub(&g->refs, 1) == 1) grammar_destroy(g);
}

static uint64_t fnv(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

int grammar_cache_get(grammar_cache *c, const char *re, size_t len, grammar **out,
                      char *err, size_t err_cap) {
    *out = NULL;
    uint64_t h = fnv(re, len);
    pthread_mutex_lock(&c->mu);
    for (grammar *g = c->head; g; g = g->next)
        if (g->hash == h && g->key_len == len && memcmp(g->key, re, len) == 0) {
            atomic_fetch_add(&g->refs, 1);
            g->last_use = ++c->clock;
            c->hits++;
            pthread_mutex_unlock(&c->mu);
            *out = g;
            return 0;
        }
    c->misses++;
    pthread_mutex_unlock(&c->mu);
    /* compile outside the lock (two requests may compile the same text; the
     * second insert then simply adds a duplicate entry that ages out) */
    grammar *g = util_calloc(1, sizeof *g);
    if (!g) {
        util_set_err(err, err_cap, "out of memory");
        return -1;
    }
    pthread_mutex_init(&g->mu, NULL);
    atomic_init(&g->refs, 1);
    atomic_fetch_add(&c->refs, 1);
    g->cache = c;
    g->hash = h;
    if (regex_dfa_compile(re, len, &g->dfa, err, err_cap) != 0) {
        grammar_destroy(g);
        return -1;
    }
    if (regex_dfa_states(g->dfa) == 0) {
        util_set_err(err, err_cap, "the grammar admits no output at all");
        grammar_destroy(g);
        return -1;
    }
    g->key = malloc(len + 1);
    g->masks = util_calloc(regex_dfa_states(g->dfa), sizeof *g->masks);
    if (!g->key || !g->masks) {
        util_set_err(err, err_cap, "out of memory");
        grammar_destroy(g);
        return -1;
    }
    memcpy(g->key, re, len);
    g->key[len] = '\0';
    g->key_len = len;
    pthread_mutex_lock(&c->mu);
    atomic_fetch_add(&g->refs, 1); /* the cache's */
    g->last_use = ++c->clock;
    g->next = c->head;
    c->head = g;
    c->entries++;
    grammar *evict = NULL;
    if (c->entries > c->max_entries) { /* least recently used */
        grammar **pp = &c->head, **victim = NULL;
        for (; *pp; pp = &(*pp)->next)
            if (*pp != g && (!victim || (*pp)->last_use < (*victim)->last_use))
                victim = pp;
        if (victim) {
            evict = *victim;
            *victim = evict->next;
            c->entries--;
        }
    }
    pthread_mutex_unlock(&c->mu);
    grammar_release(evict);
    *out = g;
    return 0;
}

void grammar_cache_get_stats(grammar_cache *c, grammar_cache_stats *st) {
    pthread_mutex_lock(&c->mu);
    st->hits = c->hits;
    st->misses = c->misses;
    st->entries = c->entries;
    pthread_mutex_unlock(&c->mu);
}

const regex_dfa *grammar_dfa(const grammar *g) { return g->dfa; }

/* ------------------------------------------------------------------------- */
/* Masks                                                                      */
/* ------------------------------------------------------------------------- */
/* Fill mask (c->words words) for DFA state s. */
static int compute_mask(const grammar *g, int32_t s, uint32_t *mask) {
    const grammar_cache *c = g->cache;
    const trie *t = &c->t;
    memset(mask, 0, c->words * sizeof *mask);
    if (s < 0) return 0;
    if (c->eot >= 0 && regex_dfa_accepting(g->dfa, s))
        mask[c->eot >> 5] |= 1u << (c->eot & 31);
    /* DFS: the stack holds (node, state) pairs; at most depth x fan-out */
    size_t cap = 256, sp = 0;
    int32_t *st = malloc(cap * 2 * sizeof *st);
    if (!st) return -1;
    st[sp * 2] = 0;
    st[sp * 2 + 1] = s;
    sp++;
    while (sp) {
        sp--;
        int32_t node = st[sp * 2], state = st[sp * 2 + 1];
        for (int32_t ch = t->n[node].child; ch >= 0; ch = t->n[ch].sib) {
            int32_t ns = regex_dfa_step(g->dfa, state, t->n[ch].byte);
            if (ns < 0) continue;
            for (int32_t tk = t->n[ch].token; tk >= 0; tk = t->same_next[tk])
                mask[(uint32_t)tk >> 5] |= 1u << ((uint32_t)tk & 31);
            if (t->n[ch].child < 0) continue;
            if (sp == cap) {
                cap *= 2;
                int32_t *x = realloc(st, cap * 2 * sizeof *x);
                if (!x) {
                    free(st);
                    return -1;
                }
                st = x;
            }
            st[sp * 2] = ch;
            st[sp * 2 + 1] = ns;
            sp++;
        }
    }
    free(st);
    return 0;
}

int grammar_matcher_init(grammar_matcher *m, grammar *g) {
    memset(m, 0, sizeof *m);
    m->scratch = malloc(g->cache->words * sizeof *m->scratch);
    if (!m->scratch) return -1;
    atomic_fetch_add(&g->refs, 1);
    m->g = g;
    m->state = regex_dfa_start(g->dfa);
    return 0;
}

void grammar_matcher_reset(grammar_matcher *m) {
    if (!m) return;
    grammar_release(m->g);
    free(m->scratch);
    memset(m, 0, sizeof *m);
}

int grammar_matcher_feed(grammar_matcher *m, const int32_t *ids, uint32_t n) {
    const grammar_cache *c = m->g->cache;
    for (uint32_t i = 0; i < n && m->state >= 0; i++) {
        if (m->ended) {
            m->state = -1;
            break;
        }
        if (c->eot >= 0 && ids[i] == c->eot) {
            if (!regex_dfa_accepting(m->g->dfa, m->state)) m->state = -1;
            m->ended = 1;
            continue;
        }
        const char *b;
        size_t len;
        if (tokenizer_token_bytes(c->tok, ids[i], &b, &len) != 0) {
            m->state = -1;
            break;
        }
        m->state = regex_dfa_walk(m->g->dfa, m->state, b, len);
    }
    return m->state >= 0 ? 0 : -1;
}

const uint32_t *grammar_matcher_mask(grammar_matcher *m) {
    grammar *g = m->g;
    const grammar_cache *c = g->cache;
    size_t bytes = c->words * sizeof(uint32_t);
    m->mask_calls++;
    if (m->state >= 0 && !m->ended) {
        pthread_mutex_lock(&g->mu);
        uint32_t *have = g->masks[m->state];
        if (!have) { /* reserve room in the cache-wide budget first */
            size_t before = atomic_fetch_add(&g->cache->mask_bytes, bytes);
            if (before + bytes <= GRAMMAR_MASK_CACHE_BYTES) have = malloc(bytes);
            if (have && compute_mask(g, m->state, have) == 0) {
                g->masks[m->state] = have;
                g->mask_bytes += bytes;
            } else {
                atomic_fetch_sub(&g->cache->mask_bytes, bytes);
                free(have);
                have = NULL;
            }
        }
        pthread_mutex_unlock(&g->mu);
        if (have) return have;
    }
    if (m->ended || compute_mask(g, m->state, m->scratch) != 0)
        memset(m->scratch, 0, bytes);
    return m->scratch;
}

int grammar_matcher_complete(const grammar_matcher *m) {
    return m->ended || regex_dfa_complete(m->g->dfa, m->state);
}

uint32_t grammar_matcher_forced(grammar_matcher *m, int32_t *out, uint32_t cap,
                                int *complete) {
    const regex_dfa *d = m->g->dfa;
    const grammar_cache *c = m->g->cache;
    *complete = grammar_matcher_complete(m);
    if (*complete || m->state < 0 || cap == 0) return 0;
    char run[GRAMMAR_MAX_FORCED];
    size_t n = 0;
    int32_t s = m->state;
    while (n < sizeof run && !regex_dfa_accepting(d, s)) {
        int b = regex_dfa_forced_byte(d, s);
        if (b < 0) break;
        run[n++] = (char)b;
        s = regex_dfa_step(d, s, (uint8_t)b);
    }
    n = utf8_complete_prefix_len(run, n);
    if (n == 0) return 0;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    char err[128];
    if (tokenizer_encode(c->tok, run, n, &ids, &n_ids, err, sizeof err) != 0) return 0;
    /* keep the tokens that stay inside the run (each must walk) */
    uint32_t k = 0;
    s = m->state;
    for (size_t i = 0; i < n_ids && k < cap; i++) {
        const char *b;
        size_t len;
        if (ids[i] == c->eot || tokenizer_token_bytes(c->tok, ids[i], &b, &len) != 0 ||
            len == 0)
            break;
        int32_t ns = regex_dfa_walk(d, s, b, len);
        if (ns < 0) break;
        s = ns;
        out[k++] = ids[i];
    }
    free(ids);
    *complete = k > 0 && regex_dfa_complete(d, s);
    m->forced_tokens += k;
    return k;
}

/* ------------------------------------------------------------------------- */
/* Scheduler hooks                                                            */
/* ------------------------------------------------------------------------- */
/* Bring the matcher up to the sequence's generated tokens (scheduler thread;
 * out_tokens is only written by it). */
static grammar_matcher *sync(sched_seq *q) {
    grammar_matcher *m = q->constraint;
    if (q->n_out > m->consumed) {
        grammar_matcher_feed(m, q->out_tokens + m->consumed, q->n_out - m->consumed);
        m->consumed = q->n_out;
    }
    return m;
}

static const uint32_t *hook_mask(sched_seq *q) { return grammar_matcher_mask(sync(q)); }

static uint32_t hook_forced(sched_seq *q, int32_t *out, uint32_t cap, int *complete) {
    return grammar_matcher_forced(sync(q), out, cap, complete);
}

void grammar_matcher_attach(grammar_matcher *m, sched_seq *q) {
    q->constraint = m;
    q->token_mask = hook_mask;
    q->forced_tokens = hook_forced;
}
