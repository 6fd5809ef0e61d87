/*
 * fuzz_config.c - libFuzzer harness of the config loader (core/config.h):
 * the input is JSON text for config_parse_text, optionally followed by a NUL
 * byte and `--set` overrides, one "a.b=value" per line, for
 * config_apply_overrides.
 *
 * Checked besides the sanitizers: a loaded config obeys the schema of
 * config.h (choices, heads divide width, kv_heads divide heads, seq_len
 * within the context, 0 < lr, min_lr <= lr, max_steps or epochs, vocab_size
 * covers the tokenizer); it survives a round trip (config_to_json, parsed
 * again, gives the same model and the same text) and a clone; a failed
 * override leaves the config unchanged, a successful one gives a config
 * that round-trips too; every refusal has a message.
 *
 * Memory: everything is freed per input (leaks are findings).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/core/config.h"
#include "tests/fuzz/fuzz_util.h"

#define MAX_SETS 16

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_schema(const orch_config *c) {
    const config_model *m = &c->model;
    const config_train *t = &c->train;
    FUZZ_CHECK(strcmp(m->arch, "gpt2") == 0 || strcmp(m->arch, "llama") == 0, "arch %s",
               m->arch);
    FUZZ_CHECK(m->heads > 0 && m->width % m->heads == 0, "heads %u width %u", m->heads,
               m->width);
    FUZZ_CHECK(m->kv_heads > 0 && m->heads % m->kv_heads == 0, "kv_heads %u",
               m->kv_heads);
    FUZZ_CHECK(m->context > 0 && t->seq_len > 0 && t->seq_len <= m->context,
               "seq_len %u context %u", t->seq_len, m->context);
    FUZZ_CHECK(t->lr > 0 && t->min_lr >= 0 && t->min_lr <= t->lr, "lr %g min_lr %g",
               t->lr, t->min_lr);
    FUZZ_CHECK((t->max_steps > 0) != (t->epochs > 0), "max_steps %llu epochs %g",
               (unsigned long long)t->max_steps, t->epochs);
    FUZZ_CHECK(strcmp(t->schedule, "cosine") == 0 || strcmp(t->schedule, "linear") == 0 ||
                   strcmp(t->schedule, "constant") == 0,
               "schedule %s", t->schedule);
    int gpt2 = strcmp(c->data.tokenizer, "gpt2") == 0;
    FUZZ_CHECK(gpt2 || strcmp(c->data.tokenizer, "byte") == 0, "tokenizer %s",
               c->data.tokenizer);
    FUZZ_CHECK(m->vocab_size >= (gpt2 ? 50257u : 256u), "vocab_size %u", m->vocab_size);
    FUZZ_CHECK(c->data.train[0] && c->data.val[0], "empty data path");
    orch_model_desc d;
    config_model_desc(c, &d);
    FUZZ_CHECK(d.vocab_size == m->vocab_size && d.width == m->width, "model desc");
}

/* The config's JSON parses back into the same config. Returns the text. */
static char *check_round_trip(const orch_config *c) {
    char *j = config_to_json(c);
    FUZZ_CHECK(j != NULL, "config_to_json");
    orch_config *c2 = NULL;
    char err[8192];
    FUZZ_CHECK(config_parse_text(j, "<round trip>", &c2, err, sizeof err) == 0,
               "own JSON refused: %s\n%s", err, j);
    FUZZ_CHECK(config_same_model(c, c2), "model changed in the round trip");
    char *j2 = config_to_json(c2);
    FUZZ_CHECK(j2 != NULL, "config_to_json");
    FUZZ_CHECK(strcmp(j, j2) == 0, "round trip changed the text:\n%s\n%s", j, j2);
    orch_config *c3 = config_clone(c2);
    FUZZ_CHECK(c3 != NULL, "config_clone");
    char *j3 = config_to_json(c3);
    FUZZ_CHECK(j3 && strcmp(j, j3) == 0, "clone differs");
    free(j2);
    free(j3);
    config_free(c2);
    config_free(c3);
    return j;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = fuzz_cstr(data, size);
    orch_config *cfg = NULL;
    char err[8192] = "";
    if (config_parse_text(text, "<fuzz>", &cfg, err, sizeof err) != 0) {
        FUZZ_CHECK(err[0] != '\0', "refusal without a message");
        FUZZ_CHECK(cfg == NULL, "output set on failure");
        free(text);
        return 0;
    }
    check_schema(cfg);
    char *before = check_round_trip(cfg);

    /* Overrides: the lines after the first NUL. */
    size_t tl = strlen(text);
    const char *sets[MAX_SETS];
    size_t n_sets = 0;
    if (tl < size) {
        char *p = text + tl + 1, *end = text + size;
        while (p < end && n_sets < MAX_SETS) {
            char *nl = memchr(p, '\n', (size_t)(end - p));
            if (nl) *nl = '\0';
            sets[n_sets++] = p; /* ends at the newline or at the final NUL */
            if (!nl) break;
            p = nl + 1;
        }
    }
    if (n_sets > 0) {
        err[0] = '\0';
        if (config_apply_overrides(cfg, sets, n_sets, err, sizeof err) != 0) {
            FUZZ_CHECK(err[0] != '\0', "override refused without a message");
            char *after = config_to_json(cfg);
            FUZZ_CHECK(after && strcmp(before, after) == 0,
                       "a failed override changed the config");
            free(after);
        } else {
            check_schema(cfg);
            free(check_round_trip(cfg));
        }
    }
    free(before);
    config_free(cfg);
    free(text);
    return 0;
}
