/*
 * ft_order.c - the row order of LoRA fine-tuning (see ft_order.h).
 */
#include "orchestrator/data/ft_order.h"

#include <stdlib.h>
#include <string.h>

static void shuffle(ft_order *o) {
    o->rng = o->epoch_rng;
    for (uint64_t i = 0; i < o->rows; i++) o->perm[i] = i;
    for (uint64_t i = o->rows; i > 1; i--) {
        uint64_t j = rng_below(&o->rng, i);
        uint64_t x = o->perm[i - 1];
        o->perm[i - 1] = o->perm[j];
        o->perm[j] = x;
    }
}

int ft_order_restore(ft_order *o, uint64_t rows, uint64_t epoch, uint64_t cursor,
                     const orch_rng *epoch_rng) {
    memset(o, 0, sizeof *o);
    o->perm = malloc((size_t)(rows ? rows : 1) * sizeof *o->perm);
    if (!o->perm) return -1;
    o->rows = rows;
    o->epoch = epoch;
    o->cursor = cursor > rows ? rows : cursor;
    o->epoch_rng = *epoch_rng;
    shuffle(o);
    return 0;
}

int ft_order_init(ft_order *o, uint64_t rows, uint64_t seed) {
    orch_rng r;
    rng_seed(&r, seed);
    return ft_order_restore(o, rows, 0, 0, &r);
}

void ft_order_free(ft_order *o) {
    if (!o) return;
    free(o->perm);
    memset(o, 0, sizeof *o);
}

void ft_order_next(ft_order *o, const ft_dataset *d, uint32_t batch, int32_t *tokens,
                   int32_t *targets) {
    const uint32_t T = d->seq_len;
    for (uint32_t b = 0; b < batch; b++) {
        if (o->cursor == o->rows) {
            o->epoch++;
            o->cursor = 0;
            o->epoch_rng = o->rng;
            shuffle(o);
        }
        uint64_t r = o->perm[o->cursor++];
        memcpy(tokens + (size_t)b * T, d->tokens + r * T, T * sizeof(int32_t));
        memcpy(targets + (size_t)b * T, d->targets + r * T, T * sizeof(int32_t));
    }
}
