/*
 * test_state_numbers.c - Check suite for the numbers read back from
 * checkpoint files (issue 12, defect 8): json_read_u64/json_read_f64
 * (core/json_read.h) refuse every out-of-range, fractional, non-finite or
 * mistyped value before it is converted; train_state_from_json refuses them
 * in every numeric field of state.json with a message naming the field (so
 * "step": 1e300 can no longer become step 0); ckpt_read_step does the same
 * for meta.json. Values at the limits are accepted and exact. Built with
 * `make SAN=1` this suite also runs under UBSan, which would flag any
 * conversion that slipped through.
 */
#include <check.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "orchestrator/core/config.h"
#include "orchestrator/core/fsio.h"
#include "orchestrator/core/json_read.h"
#include "orchestrator/store/checkpoint.h"
#include "orchestrator/train/train_state.h"
#include "tests/test_util.h"

/* The bad values every integer field is tried with. */
static const char *const bad_ints[] = {
    "1e300",   "-1",     "1.5",
    "\"NaN\"", "\"12\"", "18446744073709551616",
    "1e999",   "-1e999", "9007199254740993e3",
    "true",    "null",   "[1]",
    "{}",
};

/* ---- json_read ----------------------------------------------------------- */

static cJSON *doc_with(const char *value_text) {
    char text[256];
    snprintf(text, sizeof text, "{\"a\": {\"n\": %s}, \"s\": \"x\"}", value_text);
    cJSON *d = cJSON_Parse(text);
    ck_assert_msg(d != NULL, "test JSON does not parse: %s", text);
    return d;
}

START_TEST(u64_accepts_and_refuses) {
    static const struct {
        const char *v;
        uint64_t want;
    } ok[] = {
        { "0", 0 },   { "-0", 0 },     { "7", 7 },
        { "4.0", 4 }, { "1e3", 1000 }, { "9007199254740992", (uint64_t)1 << 53 },
    };
    char err[256];
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        cJSON *d = doc_with(ok[i].v);
        uint64_t out = 99;
        ck_assert_msg(json_read_u64(d, "a.n", JSON_READ_REQUIRED, 0, 0, JSON_READ_U64_MAX,
                                    &out, err, sizeof err) == 0,
                      "%s: %s", ok[i].v, err);
        ck_assert_uint_eq(out, ok[i].want);
        cJSON_Delete(d);
    }
    for (size_t i = 0; i < sizeof bad_ints / sizeof bad_ints[0]; i++) {
        cJSON *d = doc_with(bad_ints[i]);
        uint64_t out = 99;
        err[0] = '\0';
        ck_assert_msg(json_read_u64(d, "a.n", JSON_READ_REQUIRED, 0, 0, JSON_READ_U64_MAX,
                                    &out, err, sizeof err) == -1,
                      "%s accepted (got %llu)", bad_ints[i], (unsigned long long)out);
        ck_assert_uint_eq(out, 99); /* untouched */
        ck_assert_msg(strncmp(err, "a.n: ", 5) == 0, "%s: message '%s'", bad_ints[i],
                      err);
        cJSON_Delete(d);
    }
    /* The exact messages of the common cases. */
    cJSON *d = doc_with("1e300");
    uint64_t out;
    ck_assert_int_eq(json_read_u64(d, "a.n", 0, 0, 0, 100, &out, err, sizeof err), -1);
    ck_assert_str_eq(err, "a.n: 1e+300 is out of range (0..100)");
    cJSON_Delete(d);
    d = doc_with("1.5");
    ck_assert_int_eq(json_read_u64(d, "a.n", 0, 0, 0, 100, &out, err, sizeof err), -1);
    ck_assert_str_eq(err, "a.n: expected an integer, got 1.5");
    cJSON_Delete(d);
    d = doc_with("\"5\"");
    ck_assert_int_eq(json_read_u64(d, "a.n", 0, 0, 0, 100, &out, err, sizeof err), -1);
    ck_assert_str_eq(err, "a.n: expected an integer, got a string");
    /* A range below 2^53; a maximum above it is capped at 2^53. */
    cJSON_Delete(d);
    d = doc_with("101");
    ck_assert_int_eq(json_read_u64(d, "a.n", 0, 0, 0, 100, &out, err, sizeof err), -1);
    ck_assert_int_eq(json_read_u64(d, "a.n", 0, 0, 102, 200, &out, err, sizeof err), -1);
    ck_assert_int_eq(json_read_u64(d, "a.n", 0, 0, 0, UINT64_MAX, &out, err, sizeof err),
                     0);
    ck_assert_uint_eq(out, 101);
    cJSON_Delete(d);
    d = doc_with("9007199254740994");
    ck_assert_int_eq(json_read_u64(d, "a.n", 0, 0, 0, UINT64_MAX, &out, err, sizeof err),
                     -1);
    cJSON_Delete(d);
    /* Absent: the default, or "missing" when required; a non-object parent. */
    d = doc_with("1");
    out = 0;
    ck_assert_int_eq(json_read_u64(d, "a.m", 0, 42, 0, 100, &out, err, sizeof err), 0);
    ck_assert_uint_eq(out, 42);
    ck_assert_int_eq(json_read_u64(d, "b.m", 0, 43, 0, 100, &out, err, sizeof err), 0);
    ck_assert_uint_eq(out, 43);
    ck_assert_int_eq(
        json_read_u64(d, "a.m", JSON_READ_REQUIRED, 0, 0, 100, &out, err, sizeof err),
        -1);
    ck_assert_str_eq(err, "a.m: missing");
    ck_assert_int_eq(json_read_u64(d, "s.m", 0, 0, 0, 100, &out, err, sizeof err), -1);
    ck_assert_str_eq(err, "s: expected an object, got a string");
    cJSON_Delete(d);
}
END_TEST

START_TEST(f64_accepts_and_refuses) {
    char err[256];
    double out = 0;
    cJSON *d = doc_with("0.25");
    ck_assert_int_eq(json_read_f64(d, "a.n", 0, 0, 0, 1, &out, err, sizeof err), 0);
    ck_assert(out == 0.25);
    ck_assert_int_eq(json_read_f64(d, "a.n", 0, 0, 0.5, 1, &out, err, sizeof err), -1);
    ck_assert_str_eq(err, "a.n: 0.25 is out of range (0.5..1)");
    cJSON_Delete(d);
    d = doc_with("1e999");
    ck_assert_int_eq(
        json_read_f64(d, "a.n", 0, 0, -HUGE_VAL, HUGE_VAL, &out, err, sizeof err), -1);
    ck_assert_str_eq(err, "a.n: must be finite");
    cJSON_Delete(d);
    /* null: the default when nullable (NaN here), an error otherwise. */
    d = doc_with("null");
    ck_assert_int_eq(
        json_read_f64(d, "a.n", JSON_READ_NULLABLE, NAN, 0, 1, &out, err, sizeof err), 0);
    ck_assert(isnan(out));
    ck_assert_int_eq(json_read_f64(d, "a.n", 0, 0, 0, 1, &out, err, sizeof err), -1);
    ck_assert_str_eq(err, "a.n: expected a number, got null");
    cJSON_Delete(d);
}
END_TEST

/* ---- state.json ------------------------------------------------------------ */

/* A state.json as a run writes it (step 3 of 10, one evaluation). */
static char *good_state(void) {
    static const char cfg_text[] =
        "{\"model\": {\"vocab_size\": 256, \"context\": 32, \"layers\": 1, \"heads\": 2,"
        " \"width\": 8}, \"train\": {\"micro_batch\": 1, \"seq_len\": 8, "
        "\"max_steps\": 10, \"lr\": 0.01}, \"data\": {\"tokenizer\": \"byte\", "
        "\"train\": \"/d/t_*.bin\", \"val\": \"/d/v_*.bin\"}, \"engine\": {\"name\": "
        "\"mock\"}}";
    orch_config *cfg = NULL;
    char err[512];
    ck_assert_msg(config_parse_text(cfg_text, NULL, &cfg, err, sizeof err) == 0, "%s",
                  err);
    train_state s;
    memset(&s, 0, sizeof s);
    s.step = 3;
    s.total_steps = 10;
    data_rng_seed(&s.rng, 1);
    s.tokens_seen = 24;
    s.best_val_loss = 5.5;
    s.best_val_step = 2;
    s.evals_since_best = 1;
    s.last_loss = 5.4;
    s.last_val_loss = 5.6;
    s.last_lr = 0.001;
    s.elapsed_s = 1.5;
    s.tokens_per_s = 100;
    lr_schedule sch = { LR_SCHEDULE_COSINE, 0.01, 0, 2, 10 };
    char *text = train_state_to_json(&s, "mock", &sch, cfg);
    config_free(cfg);
    ck_assert_ptr_nonnull(text);
    return text;
}

/* good_state with the value at dotted path replaced by raw JSON text. */
static char *state_with(const char *path, const char *raw) {
    char *text = good_state();
    cJSON *root = cJSON_Parse(text);
    free(text);
    ck_assert_ptr_nonnull(root);
    cJSON *node = root;
    char walk[64];
    snprintf(walk, sizeof walk, "%s", path);
    char *dot = strchr(walk, '.');
    if (dot) {
        *dot = '\0';
        node = cJSON_GetObjectItemCaseSensitive(root, walk);
        ck_assert_ptr_nonnull(node);
    }
    const char *key = dot ? dot + 1 : walk;
    ck_assert_msg(cJSON_GetObjectItemCaseSensitive(node, key) != NULL, "no %s", path);
    ck_assert(cJSON_ReplaceItemInObjectCaseSensitive(node, key, cJSON_CreateRaw(raw)));
    char *out = cJSON_Print(root);
    cJSON_Delete(root);
    return out;
}

START_TEST(state_round_trip) {
    char *text = good_state();
    train_state s;
    char tok[16], err[512];
    ck_assert_msg(train_state_from_json(text, &s, tok, sizeof tok, err, sizeof err) == 0,
                  "%s", err);
    free(text);
    ck_assert_uint_eq(s.step, 3);
    ck_assert_uint_eq(s.total_steps, 10);
    ck_assert_uint_eq(s.tokens_seen, 24);
    ck_assert_uint_eq(s.best_val_step, 2);
    ck_assert_uint_eq(s.evals_since_best, 1);
    ck_assert(s.best_val_loss == 5.5 && s.last_loss == 5.4 && s.last_lr == 0.001);
    ck_assert_str_eq(tok, "byte");
    /* The largest step is exact; nulls are "none yet". */
    text = state_with("step", "9007199254740992");
    ck_assert_int_eq(train_state_from_json(text, &s, NULL, 0, err, sizeof err), 0);
    ck_assert_uint_eq(s.step, (uint64_t)1 << 53);
    free(text);
    text = state_with("best_val_loss", "null");
    ck_assert_int_eq(train_state_from_json(text, &s, NULL, 0, err, sizeof err), 0);
    ck_assert(isnan(s.best_val_loss));
    free(text);
}
END_TEST

/* Every integer field, every bad value: refused, naming the field. */
START_TEST(state_refuses_bad_integers) {
    static const char *const fields[] = {
        "step",
        "total_steps",
        "data.tokens_seen",
        "best_val_step",
        "evals_since_best",
        "engine_threads",
        "schedule.warmup_steps",
        "schedule.total_steps",
    };
    char err[512];
    for (size_t f = 0; f < sizeof fields / sizeof fields[0]; f++) {
        for (size_t b = 0; b < sizeof bad_ints / sizeof bad_ints[0]; b++) {
            char *text = state_with(fields[f], bad_ints[b]);
            train_state s;
            s.step = 12345;
            err[0] = '\0';
            int rc = train_state_from_json(text, &s, NULL, 0, err, sizeof err);
            free(text);
            char want[96];
            snprintf(want, sizeof want, "state.json: %s: ", fields[f]);
            ck_assert_msg(rc == -1, "%s = %s accepted", fields[f], bad_ints[b]);
            ck_assert_msg(strncmp(err, want, strlen(want)) == 0, "%s = %s: '%s'",
                          fields[f], bad_ints[b], err);
        }
    }
    /* The message of the example. */
    char *text = state_with("step", "1e300");
    train_state s;
    ck_assert_int_eq(train_state_from_json(text, &s, NULL, 0, err, sizeof err), -1);
    ck_assert_str_eq(err,
                     "state.json: step: 1e+300 is out of range (0..9007199254740992)");
    free(text);
    /* 32-bit fields: one past their range. */
    text = state_with("evals_since_best", "4294967296");
    ck_assert_int_eq(train_state_from_json(text, &s, NULL, 0, err, sizeof err), -1);
    free(text);
    /* best_val_step cannot lie after step. */
    text = state_with("best_val_step", "4");
    ck_assert_int_eq(train_state_from_json(text, &s, NULL, 0, err, sizeof err), -1);
    ck_assert_str_eq(err, "state.json: best_val_step: 4 is out of range (0..3)");
    free(text);
}
END_TEST

START_TEST(state_refuses_bad_reals) {
    static const struct {
        const char *field, *value;
    } bad[] = {
        { "best_val_loss", "1e999" },     { "best_val_loss", "\"low\"" },
        { "metrics.loss", "-1e999" },     { "metrics.val_loss", "[]" },
        { "metrics.elapsed_s", "-1" },    { "metrics.elapsed_s", "1e999" },
        { "metrics.tokens_per_s", "-5" }, { "schedule.last_lr", "-0.1" },
        { "schedule.lr", "\"x\"" },       { "schedule.min_lr", "-1" },
    };
    char err[512];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *text = state_with(bad[i].field, bad[i].value);
        train_state s;
        int rc = train_state_from_json(text, &s, NULL, 0, err, sizeof err);
        free(text);
        char want[96];
        snprintf(want, sizeof want, "state.json: %s: ", bad[i].field);
        ck_assert_msg(rc == -1, "%s = %s accepted", bad[i].field, bad[i].value);
        ck_assert_msg(strncmp(err, want, strlen(want)) == 0, "%s = %s: '%s'",
                      bad[i].field, bad[i].value, err);
    }
    /* Not an object, trailing text, a missing step, a mistyped tokenizer. */
    static const char *const junk[] = { "[1]", "{\"format\": 1, \"step\": 1} x", "" };
    for (size_t i = 0; i < sizeof junk / sizeof junk[0]; i++) {
        train_state s;
        ck_assert_int_eq(train_state_from_json(junk[i], &s, NULL, 0, err, sizeof err),
                         -1);
        ck_assert_str_eq(err, "state.json is not a JSON object");
    }
    char *text = good_state();
    cJSON *root = cJSON_Parse(text);
    free(text);
    cJSON_DeleteItemFromObjectCaseSensitive(root, "step");
    text = cJSON_Print(root);
    train_state s;
    ck_assert_int_eq(train_state_from_json(text, &s, NULL, 0, err, sizeof err), -1);
    ck_assert_str_eq(err, "state.json: step: missing");
    free(text);
    cJSON_ReplaceItemInObjectCaseSensitive(root, "tokenizer", cJSON_CreateNumber(3));
    cJSON_AddNumberToObject(root, "step", 3);
    text = cJSON_Print(root);
    cJSON_Delete(root);
    ck_assert_int_eq(train_state_from_json(text, &s, NULL, 0, err, sizeof err), -1);
    ck_assert_str_eq(err, "state.json: tokenizer: expected a string, got a number");
    free(text);
}
END_TEST

/* ---- meta.json --------------------------------------------------------------- */

START_TEST(meta_step_checked) {
    char dir[128], ck[256], meta[300], err[1024];
    test_tmpdir(dir, sizeof dir, "statenum");
    snprintf(ck, sizeof ck, "%s/ckpt-00000007", dir);
    ck_assert_int_eq(mkdir(ck, 0755), 0);
    snprintf(meta, sizeof meta, "%s/meta.json", ck);
    uint64_t step = 0;
    /* No meta.json: the directory name. */
    ck_assert_int_eq(ckpt_read_step(ck, &step, err, sizeof err), 0);
    ck_assert_uint_eq(step, 7);
    static const struct {
        const char *text;
        int rc;
        uint64_t step;
    } cases[] = {
        { "{\"step\": 5}", 0, 5 },
        { "{\"format\": 1}", 0, 7 }, /* no step: the directory name */
        { "{\"step\": 1e300}", -1, 0 },
        { "{\"step\": -1}", -1, 0 },
        { "{\"step\": 2.5}", -1, 0 },
        { "{\"step\": \"5\"}", -1, 0 },
        { "{\"step\": 18446744073709551616}", -1, 0 },
        { "[5]", -1, 0 },
        { "{\"step\": 5} trailing", -1, 0 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ck_assert_int_eq(
            fsio_write_file(meta, cases[i].text, strlen(cases[i].text), err, sizeof err),
            0);
        step = 99;
        err[0] = '\0';
        int rc = ckpt_read_step(ck, &step, err, sizeof err);
        ck_assert_msg(rc == cases[i].rc, "%s: rc %d (%s)", cases[i].text, rc, err);
        if (rc == 0) {
            ck_assert_uint_eq(step, cases[i].step);
        } else {
            ck_assert_uint_eq(step, 99);
            ck_assert_msg(strstr(err, meta) != NULL, "%s: '%s' does not name %s",
                          cases[i].text, err, meta);
        }
    }
    ck_assert_int_eq(fsio_write_file(meta, "{\"step\": 1e300}", 15, err, sizeof err), 0);
    ck_assert_int_eq(ckpt_read_step(ck, &step, err, sizeof err), -1);
    char want[400];
    snprintf(want, sizeof want, "%s: step: 1e+300 is out of range (0..9007199254740992)",
             meta);
    ck_assert_str_eq(err, want);
    test_rmdir(dir);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("state_numbers");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, u64_accepts_and_refuses);
    tcase_add_test(tc, f64_accepts_and_refuses);
    tcase_add_test(tc, state_round_trip);
    tcase_add_test(tc, state_refuses_bad_integers);
    tcase_add_test(tc, state_refuses_bad_reals);
    tcase_add_test(tc, meta_step_checked);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return test_run_suite(suite()); }
