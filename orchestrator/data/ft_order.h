/*
 * ft_order.h - the order in which LoRA fine-tuning visits the packed rows of
 * its training set (finetune_data.h), shared by `orch finetune` and the
 * fine-tuning jobs of `orch serve`, so the same data and seed give the same
 * micro-batches in both: each epoch is a Fisher-Yates permutation of the
 * rows drawn from the epoch's rng (the first epoch's seeded by the run's
 * seed, each next one's the generator state the previous shuffle left);
 * micro-batches take consecutive rows of the permutation and run across an
 * epoch's end into the next.
 * Memory: an ft_order owns its permutation (ft_order_free). Threads: one
 * thread at a time. Errors: ft_order_init returns -1 when out of memory.
 */
#ifndef ORCH_FT_ORDER_H
#define ORCH_FT_ORDER_H

#include <stdint.h>

#include "orchestrator/core/rng.h"
#include "orchestrator/data/finetune_data.h"

typedef struct ft_order {
    uint64_t rows;
    uint64_t *perm;
    orch_rng rng;       /* after this epoch's shuffle */
    orch_rng epoch_rng; /* before it (what a checkpoint records) */
    uint64_t epoch;     /* 0-based */
    uint64_t cursor;    /* next index into perm */
} ft_order;

/* The first epoch of `rows` rows from seed. */
int ft_order_init(ft_order *o, uint64_t rows, uint64_t seed);
/* Continue from a checkpoint's (epoch, cursor, epoch_rng). */
int ft_order_restore(ft_order *o, uint64_t rows, uint64_t epoch, uint64_t cursor,
                     const orch_rng *epoch_rng);
void ft_order_free(ft_order *o);

/* The next `batch` rows of d into tokens/targets ([batch * d->seq_len] each). */
void ft_order_next(ft_order *o, const ft_dataset *d, uint32_t batch, int32_t *tokens,
                   int32_t *targets);

#endif
