/*
 * lr_schedule.c - learning-rate schedules (warmup, cosine/linear decay,
 * constant). See lr_schedule.h for the formulas.
 */
#include "orchestrator/train/lr_schedule.h"

#include <math.h>
#include <string.h>

int lr_schedule_parse_kind(const char *name, lr_schedule_kind *out) {
    if (!name) return -1;
    if (strcmp(name, "cosine") == 0)
        *out = LR_SCHEDULE_COSINE;
    else if (strcmp(name, "linear") == 0)
        *out = LR_SCHEDULE_LINEAR;
    else if (strcmp(name, "constant") == 0)
        *out = LR_SCHEDULE_CONSTANT;
    else
        return -1;
    return 0;
}

const char *lr_schedule_kind_name(lr_schedule_kind kind) {
    switch (kind) {
    case LR_SCHEDULE_COSINE: return "cosine";
    case LR_SCHEDULE_LINEAR: return "linear";
    case LR_SCHEDULE_CONSTANT: return "constant";
    }
    return "unknown";
}

double lr_schedule_at(const lr_schedule *s, uint64_t t) {
    if (t == 0) t = 1;
    if (s->warmup_steps > 0 && t <= s->warmup_steps)
        return s->lr * (double)t / (double)s->warmup_steps;
    if (s->kind == LR_SCHEDULE_CONSTANT) return s->lr;
    double p = 1.0;
    if (s->total_steps > s->warmup_steps)
        p = (double)(t - s->warmup_steps) / (double)(s->total_steps - s->warmup_steps);
    if (p < 0.0) p = 0.0;
    if (p > 1.0) p = 1.0;
    if (s->kind == LR_SCHEDULE_LINEAR) return s->lr - (s->lr - s->min_lr) * p;
    return s->min_lr + 0.5 * (s->lr - s->min_lr) * (1.0 + cos(M_PI * p));
}
