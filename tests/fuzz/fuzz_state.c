/*
 * fuzz_state.c - libFuzzer harness of the checkpoint state.json readers: the
 * input is the text of a state.json, given to train_state_from_json
 * (train/train_state.h) and, as DIR/state.json in a scratch directory, to
 * ckpt_read_config (store/checkpoint.h), which reads its "config" object.
 *
 * Checked besides the sanitizers: refusals have messages and leave the
 * outputs alone; the tokenizer string fits its buffer; when both readers
 * accept, the state written back by train_state_to_json (with that config)
 * reads back to the same state, field for field, and ckpt_read_config
 * accepts the written text with the same model and tokenizer.
 *
 * Memory: everything is freed per input (leaks are findings).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/core/config.h"
#include "orchestrator/store/checkpoint.h"
#include "orchestrator/train/lr_schedule.h"
#include "orchestrator/train/train_state.h"
#include "tests/fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Equal, both NaN, or (finite) within cJSON's printing precision: cJSON_Print
 * writes "%1.15g" whenever that reads back within DBL_EPSILON (relative) of
 * the value, so the last bit of a double may not survive state.json. */
static int same_double(double a, double b) {
    if ((isnan(a) && isnan(b)) || a == b) return 1;
    double m = fmax(fabs(a), fabs(b));
    return isfinite(a) && isfinite(b) && fabs(a - b) <= 2 * DBL_EPSILON * m;
}

static void check_same_state(const train_state *a, const train_state *b) {
    FUZZ_CHECK(a->step == b->step, "step %llu / %llu", (unsigned long long)a->step,
               (unsigned long long)b->step);
    FUZZ_CHECK(a->total_steps == b->total_steps, "total_steps");
    FUZZ_CHECK(memcmp(&a->rng, &b->rng, sizeof a->rng) == 0, "data rng");
    FUZZ_CHECK(a->tokens_seen == b->tokens_seen, "tokens_seen");
    FUZZ_CHECK(same_double(a->best_val_loss, b->best_val_loss), "best_val_loss %g / %g",
               a->best_val_loss, b->best_val_loss);
    FUZZ_CHECK(a->best_val_step == b->best_val_step, "best_val_step");
    FUZZ_CHECK(a->evals_since_best == b->evals_since_best, "evals_since_best");
    FUZZ_CHECK(same_double(a->last_loss, b->last_loss), "last_loss %g / %g", a->last_loss,
               b->last_loss);
    FUZZ_CHECK(same_double(a->last_val_loss, b->last_val_loss), "last_val_loss");
    FUZZ_CHECK(same_double(a->last_lr, b->last_lr), "last_lr %g / %g", a->last_lr,
               b->last_lr);
    FUZZ_CHECK(same_double(a->elapsed_s, b->elapsed_s), "elapsed_s %g / %g", a->elapsed_s,
               b->elapsed_s);
    FUZZ_CHECK(same_double(a->tokens_per_s, b->tokens_per_s), "tokens_per_s %g / %g",
               a->tokens_per_s, b->tokens_per_s);
}

/* Write text as DIR/state.json and read its config. */
static int read_config(const char *text, size_t len, orch_config **cfg, char *tok,
                       size_t tok_cap, char *err, size_t err_cap) {
    char path[8192];
    fuzz_write_scratch("state.json", text, len, path, sizeof path);
    return ckpt_read_config(fuzz_scratch_dir(), cfg, tok, tok_cap, err, err_cap);
}

static void round_trip(const train_state *s, const orch_config *cfg, const char *tok) {
    lr_schedule sched = { .kind = LR_SCHEDULE_COSINE,
                          .lr = cfg->train.lr,
                          .min_lr = cfg->train.min_lr,
                          .warmup_steps = cfg->train.warmup_steps,
                          .total_steps = s->total_steps };
    (void)lr_schedule_parse_kind(cfg->train.schedule, &sched.kind);
    char *text = train_state_to_json(s, "cpu", &sched, cfg);
    FUZZ_CHECK(text != NULL, "train_state_to_json");
    train_state s2;
    char tok2[64], err[8192];
    FUZZ_CHECK(train_state_from_json(text, &s2, tok2, sizeof tok2, err, sizeof err) == 0,
               "own state.json refused: %s\n%s", err, text);
    check_same_state(s, &s2);
    FUZZ_CHECK(strcmp(tok2, cfg->data.tokenizer) == 0, "tokenizer %s / %s", tok2,
               cfg->data.tokenizer);
    orch_config *cfg2 = NULL;
    char tok3[64];
    FUZZ_CHECK(
        read_config(text, strlen(text), &cfg2, tok3, sizeof tok3, err, sizeof err) == 0,
        "own state.json's config refused: %s", err);
    FUZZ_CHECK(config_same_model(cfg, cfg2), "model changed");
    FUZZ_CHECK(strcmp(tok3, cfg->data.tokenizer) == 0, "tokenizer");
    (void)tok;
    config_free(cfg2);
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = fuzz_cstr(data, size);
    train_state s;
    memset(&s, 0xa5, sizeof s);
    char tok[16], err[8192] = "";
    memset(tok, 'x', sizeof tok);
    int rc = train_state_from_json(text, &s, tok, sizeof tok, err, sizeof err);
    if (rc != 0) {
        FUZZ_CHECK(err[0] != '\0', "refusal without a message");
    } else {
        FUZZ_CHECK(memchr(tok, '\0', sizeof tok) != NULL, "tokenizer not terminated");
    }

    orch_config *cfg = NULL;
    char ctok[64];
    char cerr[16384] = "";
    int crc = read_config(text, size, &cfg, ctok, sizeof ctok, cerr, sizeof cerr);
    if (crc != 0) {
        FUZZ_CHECK(cerr[0] != '\0' && cfg == NULL, "config refusal without a message");
    } else {
        FUZZ_CHECK(cfg != NULL && memchr(ctok, '\0', sizeof ctok), "config output");
        if (rc == 0) round_trip(&s, cfg, ctok);
        config_free(cfg);
    }
    free(text);
    return 0;
}
