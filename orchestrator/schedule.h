/*
 * schedule.h - the learning-rate schedule: linear warmup, then cosine or
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
#ifndef ORCH_SCHEDULE_H
#define ORCH_SCHEDULE_H

#include <stdint.h>

typedef enum schedule_kind {
    SCHEDULE_COSINE = 0,
    SCHEDULE_LINEAR = 1,
    SCHEDULE_CONSTANT = 2
} schedule_kind;

typedef struct schedule {
    schedule_kind kind;
    double lr;             /* peak rate */
    double min_lr;         /* floor of the decay */
    uint64_t warmup_steps; /* 0 = no warmup */
    uint64_t total_steps;  /* step at which the decay reaches min_lr */
} schedule;

/* "cosine" | "linear" | "constant" -> kind. Returns 0, or -1 if unknown. */
int schedule_parse_kind(const char *name, schedule_kind *out);

/* Name of a kind ("cosine", ...). */
const char *schedule_kind_name(schedule_kind kind);

/* Learning rate for 1-based step t (t = 0 is treated as 1). */
double schedule_lr(const schedule *s, uint64_t t);

#endif
