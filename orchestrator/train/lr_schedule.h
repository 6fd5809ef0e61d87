/*
 * lr_schedule.h - the learning-rate schedule: linear warmup, then cosine or
 * linear decay to min_lr, or constant.
 *
 * Steps are 1-based (the step number t passed to AdamW). For t <= warmup the
 * rate rises linearly: lr * t / warmup. After warmup, with
 * p = (t - warmup) / (total - warmup) clamped to [0, 1]:
 *   cosine:   min_lr + 0.5 * (lr - min_lr) * (1 + cos(pi * p))
 *   linear:   lr - (lr - min_lr) * p
 *   constant: lr
 * so the last step (t = total) runs at min_lr for cosine and linear.
 *
 * Pure functions; thread-safe; no allocation.
 */
#ifndef ORCH_LR_SCHEDULE_H
#define ORCH_LR_SCHEDULE_H

#include <stdint.h>

typedef enum lr_schedule_kind {
    LR_SCHEDULE_COSINE = 0,
    LR_SCHEDULE_LINEAR = 1,
    LR_SCHEDULE_CONSTANT = 2
} lr_schedule_kind;

typedef struct lr_schedule {
    lr_schedule_kind kind;
    double lr;             /* peak rate */
    double min_lr;         /* floor of the decay */
    uint64_t warmup_steps; /* 0 = no warmup */
    uint64_t total_steps;  /* step at which the decay reaches min_lr */
} lr_schedule;

/* "cosine" | "linear" | "constant" -> kind. Returns 0, or -1 if unknown. */
int lr_schedule_parse_kind(const char *name, lr_schedule_kind *out);

/* Name of a kind ("cosine", ...). */
const char *lr_schedule_kind_name(lr_schedule_kind kind);

/* Learning rate for 1-based step t (t = 0 is treated as 1). */
double lr_schedule_at(const lr_schedule *s, uint64_t t);

#endif
