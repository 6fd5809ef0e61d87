/*
 * test_config.c - Check suite for orchestrator/core/config.{c,h}: one test per
 * error kind (each asserting the message names the JSON path), defaults,
 * overrides, serialisation and the model description.
 */
#include <check.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "orchestrator/core/config.h"
#include "tests/test_util.h"

#define MODEL                                                                \
    "\"model\": {\"arch\": \"gpt2\", \"vocab_size\": 256, \"context\": 64, " \
    "\"layers\": 2, \"heads\": 4, \"width\": 64}"
#define TRAIN                                                              \
    "\"train\": {\"micro_batch\": 4, \"seq_len\": 32, \"max_steps\": 10, " \
    "\"lr\": 0.001}"
#define DATA                                                             \
    "\"data\": {\"tokenizer\": \"byte\", \"train\": \"d/train_*.bin\", " \
    "\"val\": \"d/val_*.bin\"}"
#define DOC(m, t, d, extra) "{" m ", " t ", " d extra "}"

static char err[2048];

/* Parse text; expect failure and that the message contains every needle. */
static void expect_error(const char *text, const char *n1, const char *n2) {
    orch_config *c = NULL;
    err[0] = '\0';
    int rc = config_parse_text(text, "cfg.json", &c, err, sizeof err);
    ck_assert_msg(rc == -1, "expected failure for %s", text);
    ck_assert_ptr_null(c);
    ck_assert_msg(strstr(err, n1) != NULL, "'%s' lacks '%s'", err, n1);
    if (n2) ck_assert_msg(strstr(err, n2) != NULL, "'%s' lacks '%s'", err, n2);
    ck_assert_msg(strncmp(err, "cfg.json: ", 10) == 0, "no origin in '%s'", err);
    ck_assert_msg(strchr(err, '\n') == NULL, "not one line: '%s'", err);
}

static orch_config *load_ok(const char *text) {
    orch_config *c = NULL;
    int rc = config_parse_text(text, "cfg.json", &c, err, sizeof err);
    ck_assert_msg(rc == 0, "unexpected error: %s", err);
    ck_assert_ptr_nonnull(c);
    return c;
}

START_TEST(test_valid_and_defaults) {
    orch_config *c = load_ok(DOC(MODEL, TRAIN, DATA, ""));
    ck_assert_str_eq(c->model.arch, "gpt2");
    ck_assert_uint_eq(c->model.mlp_width, 256); /* 4 * width */
    ck_assert_uint_eq(c->model.kv_heads, 4);    /* = heads */
    ck_assert(c->model.layernorm_eps == 1e-5);
    ck_assert_uint_eq(c->train.grad_accum, 1);
    ck_assert_str_eq(c->train.schedule, "cosine");
    ck_assert(c->train.beta1 == 0.9 && c->train.beta2 == 0.95);
    ck_assert(c->train.eps == 1e-8 && c->train.grad_clip == 1.0);
    ck_assert_uint_eq(c->train.seed, 1337);
    ck_assert_uint_eq(c->train.eval_every, 100);
    ck_assert_uint_eq(c->train.eval_batches, 8);
    ck_assert_uint_eq(c->train.keep_checkpoints, 3);
    ck_assert_uint_eq(c->train.early_stop_patience, 0);
    ck_assert_str_eq(c->engine.name, "cpu");
    ck_assert_uint_eq(c->engine.threads, 0);
    ck_assert_str_eq(c->engine.options, "");
    ck_assert_str_eq(c->data.train, "d/train_*.bin");
    config_free(c);
}
END_TEST

START_TEST(test_shipped_configs_valid) {
    const char *files[] = { "configs/default.json", "configs/tiny-test.json",
                            "configs/gpt2-124m.json" };
    for (size_t i = 0; i < 3; i++) {
        orch_config *c = NULL;
        int rc = config_load_file(files[i], &c, err, sizeof err);
        ck_assert_msg(rc == 0, "%s: %s", files[i], err);
        config_free(c);
    }
}
END_TEST

START_TEST(test_unknown_key_nearest) {
    expect_error(DOC(MODEL,
                     "\"train\": {\"micro_batch\": 4, \"seq_len\": 32, "
                     "\"max_steps\": 10, \"lrr\": 0.001}",
                     DATA, ""),
                 "train.lrr: unknown key", "did you mean train.lr?");
    expect_error(DOC(MODEL, TRAIN, DATA, ", \"modle\": {}"), "modle: unknown key",
                 "did you mean model?");
    /* A key from another section points there. */
    expect_error(DOC(MODEL,
                     "\"train\": {\"micro_batch\": 4, \"seq_len\": 32, "
                     "\"max_steps\": 10, \"lr\": 0.001, \"vocab_size\": 3}",
                     DATA, ""),
                 "train.vocab_size: unknown key", "did you mean model.vocab_size?");
}
END_TEST

START_TEST(test_wrong_type) {
    expect_error(DOC(MODEL,
                     "\"train\": {\"micro_batch\": 4, \"seq_len\": 32, "
                     "\"max_steps\": 10, \"lr\": \"0.001\"}",
                     DATA, ""),
                 "train.lr: expected a number, got a string", NULL);
    expect_error(DOC("\"model\": {\"vocab_size\": 256, \"context\": 64, "
                     "\"layers\": 2.5, \"heads\": 4, \"width\": 64}",
                     TRAIN, DATA, ""),
                 "model.layers: expected an integer", "2.5");
    expect_error(DOC(MODEL, TRAIN,
                     "\"data\": {\"tokenizer\": 7, \"train\": \"a\", \"val\": "
                     "\"b\"}",
                     ""),
                 "data.tokenizer: expected a string, got a number", NULL);
    expect_error("{\"model\": [], " TRAIN ", " DATA "}",
                 "model: expected an object, got an array", NULL);
    expect_error("[1, 2]", "top level: expected an object", NULL);
}
END_TEST

START_TEST(test_heads_not_dividing_width) {
    expect_error(DOC("\"model\": {\"vocab_size\": 256, \"context\": 64, "
                     "\"layers\": 2, \"heads\": 5, \"width\": 64}",
                     TRAIN, DATA, ""),
                 "model.heads", "does not divide model.width");
}
END_TEST

START_TEST(test_seq_len_over_context) {
    expect_error(DOC(MODEL,
                     "\"train\": {\"micro_batch\": 4, \"seq_len\": 65, "
                     "\"max_steps\": 10, \"lr\": 0.001}",
                     DATA, ""),
                 "train.seq_len", "exceeds model.context (64)");
}
END_TEST

START_TEST(test_lr_not_positive) {
    expect_error(DOC(MODEL,
                     "\"train\": {\"micro_batch\": 4, \"seq_len\": 32, "
                     "\"max_steps\": 10, \"lr\": 0}",
                     DATA, ""),
                 "train.lr: out of range", "> 0");
    expect_error(DOC(MODEL,
                     "\"train\": {\"micro_batch\": 4, \"seq_len\": 32, "
                     "\"max_steps\": 10, \"lr\": -1e-3}",
                     DATA, ""),
                 "train.lr: out of range", NULL);
}
END_TEST

START_TEST(test_min_lr_over_lr) {
    expect_error(DOC(MODEL,
                     "\"train\": {\"micro_batch\": 4, \"seq_len\": 32, "
                     "\"max_steps\": 10, \"lr\": 0.001, \"min_lr\": 0.01}",
                     DATA, ""),
                 "train.min_lr", "exceeds train.lr");
}
END_TEST

START_TEST(test_other_ranges) {
    expect_error(DOC(MODEL,
                     "\"train\": {\"micro_batch\": 0, \"seq_len\": 32, "
                     "\"max_steps\": 10, \"lr\": 0.001}",
                     DATA, ""),
                 "train.micro_batch: out of range", NULL);
    expect_error(DOC(MODEL,
                     "\"train\": {\"micro_batch\": 4, \"seq_len\": 32, "
                     "\"max_steps\": 10, \"lr\": 0.001, \"beta2\": 1}",
                     DATA, ""),
                 "train.beta2: out of range", "< 1");
    expect_error(DOC(MODEL,
                     "\"train\": {\"micro_batch\": 4, \"seq_len\": 32, "
                     "\"max_steps\": 10, \"lr\": 0.001, \"schedule\": "
                     "\"cosin\"}",
                     DATA, ""),
                 "train.schedule", "not one of cosine,linear,constant");
    expect_error(DOC(MODEL, TRAIN,
                     "\"data\": {\"tokenizer\": \"gpt2\", \"train\": \"a\", "
                     "\"val\": \"b\"}",
                     ""),
                 "model.vocab_size", "50257");
    expect_error(DOC(MODEL, TRAIN,
                     "\"data\": {\"tokenizer\": \"byte\", \"train\": \"\", "
                     "\"val\": \"b\"}",
                     ""),
                 "data.train: must not be empty", NULL);
    expect_error(DOC(MODEL,
                     "\"train\": {\"micro_batch\": 4, \"seq_len\": 32, "
                     "\"max_steps\": 10, \"epochs\": 2, \"lr\": 0.001}",
                     DATA, ""),
                 "train.epochs", "not both");
}
END_TEST

/* Numbers no integer field can hold are refused before any conversion
 * (issue 12, defect 8): the message names the key. */
START_TEST(test_huge_and_fractional_numbers) {
    static const char *const keys[] = {
        "model.vocab_size",       "model.context",
        "model.layers",           "model.width",
        "train.micro_batch",      "train.max_steps",
        "train.warmup_steps",     "train.seed",
        "train.eval_every",       "train.eval_batches",
        "train.checkpoint_every", "train.keep_checkpoints",
        "engine.threads",
    };
    static const char *const values[] = { "1e300", "-1",
                                          "1.5",   "18446744073709551616",
                                          "1e999", "9007199254740994" };
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        for (size_t v = 0; v < sizeof values / sizeof values[0]; v++) {
            orch_config *c = load_ok(DOC(MODEL, TRAIN, DATA, ""));
            orch_config before = *c;
            char set[128];
            snprintf(set, sizeof set, "%s=%s", keys[k], values[v]);
            const char *sets[] = { set };
            err[0] = '\0';
            ck_assert_msg(config_apply_overrides(c, sets, 1, err, sizeof err) == -1,
                          "%s accepted", set);
            char want[160];
            snprintf(want, sizeof want, "%s: ", keys[k]);
            ck_assert_msg(strstr(err, want) != NULL, "%s: '%s'", set, err);
            ck_assert(memcmp(&before, c, offsetof(orch_config, source)) == 0);
            config_free(c);
        }
    }
    /* The limits themselves are fine. */
    orch_config *c = load_ok(DOC(MODEL, TRAIN, DATA, ""));
    const char *sets[] = { "train.max_steps=9007199254740992", "train.seed=0" };
    ck_assert_msg(config_apply_overrides(c, sets, 2, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(c->train.max_steps, (uint64_t)1 << 53);
    config_free(c);
}
END_TEST

START_TEST(test_missing_required) {
    expect_error(DOC("\"model\": {\"vocab_size\": 256, \"context\": 64, "
                     "\"layers\": 2, \"heads\": 4}",
                     TRAIN, DATA, ""),
                 "model.width: missing required key", NULL);
    expect_error(DOC(MODEL,
                     "\"train\": {\"micro_batch\": 4, \"seq_len\": 32, "
                     "\"lr\": 0.001}",
                     DATA, ""),
                 "train.max_steps: missing required key", "train.epochs");
    expect_error("{" MODEL ", " TRAIN "}", "data: missing required section", NULL);
}
END_TEST

START_TEST(test_duplicate_key) {
    expect_error(DOC(MODEL,
                     "\"train\": {\"micro_batch\": 4, \"seq_len\": 32, "
                     "\"max_steps\": 10, \"lr\": 0.001, \"lr\": 0.002}",
                     DATA, ""),
                 "train.lr: duplicate key", NULL);
}
END_TEST

START_TEST(test_invalid_json_position) {
    expect_error("{\n  \"model\": {\n    \"width\": 64,,\n  }\n}", "line 3, column",
                 "invalid JSON");
}
END_TEST

START_TEST(test_file_errors) {
    orch_config *c = NULL;
    ck_assert_int_eq(config_load_file("/nonexistent/x.json", &c, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "/nonexistent/x.json"));
    char path[] = "/tmp/test_config_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    const char *bad = DOC(MODEL,
                          "\"train\": {\"micro_batch\": 4, \"seq_len\": 32, "
                          "\"max_steps\": 10, \"lrr\": 0.001}",
                          DATA, "");
    ck_assert_int_eq(write(fd, bad, strlen(bad)), (ssize_t)strlen(bad));
    close(fd);
    ck_assert_int_eq(config_load_file(path, &c, err, sizeof err), -1);
    unlink(path);
    ck_assert_msg(strstr(err, path) && strstr(err, "train.lrr"), "%s", err);
    /* A missing file, a directory, a FIFO (refused at once, not read). */
    ck_assert_int_eq(config_load_file("/nonexistent/x.json", &c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "x.json: cannot open: No such file"), "%s", err);
    ck_assert_int_eq(config_load_file("/tmp", &c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "/tmp: cannot open: not a regular file"), "%s", err);
    char d[64], fifo[128];
    test_tmpdir(d, sizeof d, "config");
    snprintf(fifo, sizeof fifo, "%s/fifo.json", d);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    ck_assert_int_eq(config_load_file(fifo, &c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "not a regular file"), "%s", err);
    test_rmdir(d);
    ck_assert_ptr_null(c);
}
END_TEST

/* Relative data globs become absolute: the directory part through
 * realpath(3) when it exists, else joined to the working directory. */
START_TEST(test_absolute_data_paths) {
    char d[64], cwd[4096], real[4096], want[8192];
    test_tmpdir(d, sizeof d, "config");
    ck_assert_ptr_nonnull(getcwd(cwd, sizeof cwd));
    ck_assert_ptr_nonnull(realpath(d, real));
    char sub[128];
    snprintf(sub, sizeof sub, "%s/shards", d);
    ck_assert_int_eq(mkdir(sub, 0755), 0);
    ck_assert_int_eq(chdir(d), 0);
    orch_config *c = load_ok(DOC(MODEL, TRAIN,
                                 "\"data\": {\"tokenizer\": \"byte\", \"train\": "
                                 "\"./shards/../shards/train_*.bin\", "
                                 "\"val\": \"missing/val_*.bin\"}",
                                 ""));
    ck_assert_msg(config_absolute_data_paths(c, err, sizeof err) == 0, "%s", err);
    snprintf(want, sizeof want, "%s/shards/train_*.bin", real);
    ck_assert_str_eq(c->data.train, want);
    ck_assert_int_eq(chdir(cwd), 0);
    char here[4096];
    /* The missing directory is joined to the directory we were in. */
    snprintf(want, sizeof want, "/missing/val_*.bin");
    ck_assert_msg(c->data.val[0] == '/' && strstr(c->data.val, want), "%s", c->data.val);
    snprintf(here, sizeof here, "%.4000s", c->data.val);
    here[strlen(here) - strlen(want)] = '\0';
    ck_assert_ptr_nonnull(realpath(here, want));
    ck_assert_str_eq(want, real);
    /* Serialised (what state.json stores) and idempotent; absolute paths
     * are left alone. */
    char *text = config_to_json(c);
    ck_assert_ptr_nonnull(strstr(text, "/shards/train_*.bin"));
    free(text);
    char before[4096];
    snprintf(before, sizeof before, "%s", c->data.train);
    ck_assert_int_eq(config_absolute_data_paths(c, err, sizeof err), 0);
    ck_assert_str_eq(c->data.train, before);
    /* A glob without a directory part lives in the working directory. */
    const char *set[] = { "data.val=val_*.bin" };
    ck_assert_int_eq(config_apply_overrides(c, set, 1, err, sizeof err), 0);
    ck_assert_int_eq(config_absolute_data_paths(c, err, sizeof err), 0);
    snprintf(want, sizeof want, "%s/val_*.bin", cwd);
    ck_assert_str_eq(c->data.val, want);
    /* The model section is untouched. */
    ck_assert_uint_eq(c->model.width, 64);
    config_free(c);
    test_rmdir(d);
}
END_TEST

START_TEST(test_overrides) {
    orch_config *c = load_ok(DOC(MODEL, TRAIN, DATA, ""));
    const char *sets[] = { "train.lr=3e-4", "engine.name=123",
                           "engine.options=sleep_ms=5", "train.schedule=linear",
                           "model.mlp_width=100" };
    ck_assert_int_eq(config_apply_overrides(c, sets, 5, err, sizeof err), 0);
    ck_assert(c->train.lr == 3e-4);
    ck_assert_str_eq(c->engine.name, "123"); /* string key: raw text */
    ck_assert_str_eq(c->engine.options, "sleep_ms=5");
    ck_assert_str_eq(c->train.schedule, "linear");
    ck_assert_uint_eq(c->model.mlp_width, 100);

    /* Bad overrides name the override and the path; cfg is unchanged. */
    const char *bad1[] = { "train.lrr=1" };
    ck_assert_int_eq(config_apply_overrides(c, bad1, 1, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "train.lrr") && strstr(err, "train.lr?"), "%s", err);
    const char *bad2[] = { "model.heads=5" };
    ck_assert_int_eq(config_apply_overrides(c, bad2, 1, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "--set model.heads=5: model.heads"), "%s", err);
    ck_assert_uint_eq(c->model.heads, 4);
    const char *bad3[] = { "train.lr=fast" };
    ck_assert_int_eq(config_apply_overrides(c, bad3, 1, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "train.lr: expected a number, got a string"), "%s", err);
    ck_assert(c->train.lr == 3e-4);
    const char *bad4[] = { "train" };
    ck_assert_int_eq(config_apply_overrides(c, bad4, 1, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "KEY=VALUE"), "%s", err);
    const char *bad5[] = { "train.lr.x=1" };
    ck_assert_int_eq(config_apply_overrides(c, bad5, 1, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "train.lr is not an object"), "%s", err);

    /* null removes a key (its default returns); sets apply in order. */
    const char *sets2[] = { "train.max_steps=null", "train.epochs=1.5",
                            "model.mlp_width=null" };
    ck_assert_int_eq(config_apply_overrides(c, sets2, 3, err, sizeof err), 0);
    ck_assert_uint_eq(c->train.max_steps, 0);
    ck_assert(c->train.epochs == 1.5);
    ck_assert_uint_eq(c->model.mlp_width, 256);
    config_free(c);
}
END_TEST

START_TEST(test_serialise_round_trip) {
    /* Model section without optional keys and with an odd key order. */
    const char *text = "{\"model\": {\"width\": 64, \"heads\": 4, \"layers\": 2, "
                       "\"context\": 64, \"vocab_size\": 300},"
                       " " TRAIN ", " DATA "}";
    orch_config *c = load_ok(text);
    char *json = config_to_json(c);
    ck_assert_ptr_nonnull(json);
    /* Model kept exactly: no defaults added. */
    ck_assert_ptr_null(strstr(json, "mlp_width"));
    ck_assert_ptr_null(strstr(json, "layernorm_eps"));
    ck_assert_ptr_nonnull(strstr(json, "\"vocab_size\":\t300"));
    /* Other sections complete. */
    ck_assert_ptr_nonnull(strstr(json, "\"beta2\":\t0.95"));
    ck_assert_ptr_nonnull(strstr(json, "\"schedule\":\t\"cosine\""));
    ck_assert_ptr_null(strstr(json, "epochs"));
    orch_config *c2 = load_ok(json);
    ck_assert(config_same_model(c, c2));
    ck_assert_mem_eq(&c->model, &c2->model, sizeof c->model);
    ck_assert_mem_eq(&c->train, &c2->train, sizeof c->train);
    ck_assert_mem_eq(&c->data, &c2->data, sizeof c->data);
    ck_assert_mem_eq(&c->engine, &c2->engine, sizeof c->engine);
    char *json2 = config_to_json(c2);
    ck_assert_str_eq(json, json2);
    free(json);
    free(json2);

    orch_config *c3 = config_clone(c);
    const char *s[] = { "model.layers=3" };
    ck_assert_int_eq(config_apply_overrides(c3, s, 1, err, sizeof err), 0);
    ck_assert(!config_same_model(c, c3));
    ck_assert_uint_eq(c->model.layers, 2);
    config_free(c3);
    config_free(c2);
    config_free(c);
}
END_TEST

START_TEST(test_model_description) {
    orch_config *c =
        load_ok("{\"model\": {\"vocab_size\": 260, \"context\": 64, \"layers\": 3, "
                "\"heads\": 4, \"width\": 64, \"mlp_width\": 200, "
                "\"layernorm_eps\": 1e-6}, " TRAIN ", " DATA "}");
    orch_model_desc d;
    memset(&d, 0xab, sizeof d);
    config_model_desc(c, &d);
    ck_assert_uint_eq(d.struct_size, sizeof d);
    ck_assert_uint_eq(d.arch, ORCH_ARCH_GPT2);
    ck_assert_uint_eq(d.vocab_size, 260);
    ck_assert_uint_eq(d.context, 64);
    ck_assert_uint_eq(d.layers, 3);
    ck_assert_uint_eq(d.heads, 4);
    ck_assert_uint_eq(d.kv_heads, 4);
    ck_assert_uint_eq(d.width, 64);
    ck_assert_uint_eq(d.mlp_width, 200);
    ck_assert(d.layernorm_eps == 1e-6f);
    /* gpt2: the ABI 1.1 members and the reserved words are all zero. */
    ck_assert(d.rope_theta == 0.0f);
    ck_assert_uint_eq(d.flags, 0);
    ck_assert_uint_eq(d.rope_scaling, ORCH_ROPE_NONE);
    ck_assert(d.rope_factor == 0.0f && d.rope_low_freq_factor == 0.0f);
    ck_assert(d.rope_high_freq_factor == 0.0f);
    ck_assert_uint_eq(d.rope_original_context, 0);
    for (size_t i = 0; i < sizeof d.reserved / sizeof d.reserved[0]; i++)
        ck_assert_uint_eq(d.reserved[i], 0);
    config_free(c);
}
END_TEST

#define LLAMA_MODEL(extra)                                                    \
    "\"model\": {\"arch\": \"llama\", \"vocab_size\": 256, \"context\": 64, " \
    "\"layers\": 2, \"heads\": 4, \"kv_heads\": 2, \"width\": 64" extra "}"

START_TEST(test_llama_model) {
    /* Defaults: rope_theta 10000, untied head (HF LlamaConfig), no scaling,
     * mlp_width 4*width. */
    orch_config *c = load_ok(DOC(LLAMA_MODEL(""), TRAIN, DATA, ""));
    orch_model_desc d;
    memset(&d, 0xab, sizeof d);
    config_model_desc(c, &d);
    ck_assert_uint_eq(d.arch, ORCH_ARCH_LLAMA);
    ck_assert_uint_eq(d.kv_heads, 2);
    ck_assert_uint_eq(d.mlp_width, 256);
    ck_assert(d.rope_theta == 10000.0f);
    ck_assert_uint_eq(d.flags, ORCH_MODEL_FLAG_UNTIED_HEAD);
    ck_assert_uint_eq(d.rope_scaling, ORCH_ROPE_NONE);
    ck_assert(d.rope_factor == 0.0f);
    for (size_t i = 0; i < sizeof d.reserved / sizeof d.reserved[0]; i++)
        ck_assert_uint_eq(d.reserved[i], 0);
    config_free(c);
    /* Tied head, linear scaling, given theta. */
    c = load_ok(
        DOC(LLAMA_MODEL(", \"tie_embeddings\": true, \"rope_theta\": 500000, "
                        "\"rope_scaling\": {\"type\": \"linear\", \"factor\": 2}"),
            TRAIN, DATA, ""));
    config_model_desc(c, &d);
    ck_assert_uint_eq(d.flags, 0);
    ck_assert(d.rope_theta == 500000.0f);
    ck_assert_uint_eq(d.rope_scaling, ORCH_ROPE_LINEAR);
    ck_assert(d.rope_factor == 2.0f);
    /* The model section is kept as given: serialised back, it still parses
     * to the same model. */
    char *text = config_to_json(c);
    ck_assert_ptr_nonnull(strstr(text, "\"rope_scaling\""));
    orch_config *c2 = load_ok(text);
    ck_assert(config_same_model(c, c2));
    free(text);
    config_free(c2);
    config_free(c);
    /* llama3 scaling; null is no scaling. */
    c = load_ok(DOC(LLAMA_MODEL(", \"rope_scaling\": {\"type\": \"llama3\", "
                                "\"factor\": 8, \"low_freq_factor\": 1, "
                                "\"high_freq_factor\": 4, \"original_context\": 32}"),
                    TRAIN, DATA, ""));
    config_model_desc(c, &d);
    ck_assert_uint_eq(d.rope_scaling, ORCH_ROPE_LLAMA3);
    ck_assert(d.rope_factor == 8.0f && d.rope_low_freq_factor == 1.0f);
    ck_assert(d.rope_high_freq_factor == 4.0f);
    ck_assert_uint_eq(d.rope_original_context, 32);
    config_free(c);
    c = load_ok(DOC(LLAMA_MODEL(", \"rope_scaling\": null"), TRAIN, DATA, ""));
    config_model_desc(c, &d);
    ck_assert_uint_eq(d.rope_scaling, ORCH_ROPE_NONE);
    config_free(c);
}
END_TEST

START_TEST(test_llama_errors) {
    /* One line each, naming the field and the value. */
    expect_error(DOC(LLAMA_MODEL(", \"rope_scaling\": {\"type\": \"yarn\", "
                                 "\"factor\": 4}"),
                     TRAIN, DATA, ""),
                 "cfg.json: model.rope_scaling.type: 'yarn' is not one of linear,llama3",
                 NULL);
    expect_error(DOC(LLAMA_MODEL(", \"rope_scaling\": {\"factor\": 4}"), TRAIN, DATA, ""),
                 "model.rope_scaling.type: missing required key", NULL);
    expect_error(
        DOC(LLAMA_MODEL(", \"rope_scaling\": {\"type\": \"linear\"}"), TRAIN, DATA, ""),
        "model.rope_scaling.factor: missing required key", NULL);
    expect_error(DOC(LLAMA_MODEL(", \"rope_scaling\": {\"type\": \"linear\", "
                                 "\"factor\": 0}"),
                     TRAIN, DATA, ""),
                 "model.rope_scaling.factor: out of range: 0 must be > 0", NULL);
    expect_error(DOC(LLAMA_MODEL(", \"rope_scaling\": {\"type\": \"linear\", "
                                 "\"factor\": 2, \"low_freq_factor\": 1}"),
                     TRAIN, DATA, ""),
                 "model.rope_scaling.low_freq_factor: belongs to type llama3, not linear",
                 NULL);
    expect_error(DOC(LLAMA_MODEL(", \"rope_scaling\": {\"type\": \"llama3\", "
                                 "\"factor\": 8, \"low_freq_factor\": 4, "
                                 "\"high_freq_factor\": 1, \"original_context\": 32}"),
                     TRAIN, DATA, ""),
                 "model.rope_scaling.high_freq_factor: out of range: 1 must be > 4",
                 NULL);
    expect_error(DOC(LLAMA_MODEL(", \"rope_scaling\": {\"type\": \"linear\", "
                                 "\"factr\": 2}"),
                     TRAIN, DATA, ""),
                 "model.rope_scaling.factr: unknown key (did you mean "
                 "model.rope_scaling.factor?)",
                 NULL);
    expect_error(DOC(LLAMA_MODEL(", \"rope_scaling\": 2"), TRAIN, DATA, ""),
                 "model.rope_scaling: expected an object or null, got a number", NULL);
    expect_error(DOC(LLAMA_MODEL(", \"rope_theta\": 1"), TRAIN, DATA, ""),
                 "model.rope_theta: out of range: 1 must be > 1", NULL);
    expect_error(DOC(LLAMA_MODEL(", \"tie_embeddings\": 1"), TRAIN, DATA, ""),
                 "model.tie_embeddings: expected true or false, got a number", NULL);
    expect_error(DOC("\"model\": {\"arch\": \"llama\", \"vocab_size\": 256, "
                     "\"context\": 64, \"layers\": 2, \"heads\": 4, \"kv_heads\": 3, "
                     "\"width\": 64}",
                     TRAIN, DATA, ""),
                 "model.kv_heads: 3 does not divide model.heads (4)", NULL);
    expect_error(DOC("\"model\": {\"arch\": \"llama\", \"vocab_size\": 256, "
                     "\"context\": 64, \"layers\": 2, \"heads\": 4, \"width\": 20}",
                     TRAIN, DATA, ""),
                 "model.heads: head size 5 (model.width / model.heads) must be even",
                 NULL);
    expect_error(DOC("\"model\": {\"arch\": \"mamba\", \"vocab_size\": 256, "
                     "\"context\": 64, \"layers\": 2, \"heads\": 4, \"width\": 64}",
                     TRAIN, DATA, ""),
                 "model.arch: 'mamba' is not one of gpt2,llama", NULL);
    /* gpt2 refuses the llama keys by name. */
    expect_error(DOC("\"model\": {\"vocab_size\": 256, \"context\": 64, \"layers\": 2, "
                     "\"heads\": 4, \"width\": 64, \"rope_theta\": 10000}",
                     TRAIN, DATA, ""),
                 "model.rope_theta: applies to model.arch llama only (gpt2 has learned "
                 "positions)",
                 NULL);
    expect_error(DOC("\"model\": {\"vocab_size\": 256, \"context\": 64, \"layers\": 2, "
                     "\"heads\": 4, \"width\": 64, \"tie_embeddings\": false}",
                     TRAIN, DATA, ""),
                 "model.tie_embeddings: false is not supported for model.arch gpt2",
                 NULL);
    expect_error(DOC("\"model\": {\"vocab_size\": 256, \"context\": 64, \"layers\": 2, "
                     "\"heads\": 4, \"width\": 64, \"rope_scaling\": {\"type\": "
                     "\"linear\", \"factor\": 2}}",
                     TRAIN, DATA, ""),
                 "model.rope_scaling: applies to model.arch llama only", NULL);
    expect_error(
        DOC("\"model\": {\"vocab_size\": 256, \"context\": 64, \"layers\": 2, "
            "\"heads\": 4, \"kv_heads\": 2, \"width\": 64}",
            TRAIN, DATA, ""),
        "model.kv_heads: 2 differs from model.heads (4); grouped-query attention "
        "needs model.arch llama",
        NULL);
    /* gpt2 accepts tie_embeddings true (what it does anyway). */
    orch_config *c = load_ok(DOC("\"model\": {\"vocab_size\": 256, \"context\": 64, "
                                 "\"layers\": 2, \"heads\": 4, \"width\": 64, "
                                 "\"tie_embeddings\": true}",
                                 TRAIN, DATA, ""));
    config_free(c);
    /* An override can switch the arch and set the nested object. */
    c = load_ok(DOC(MODEL, TRAIN, DATA, ""));
    const char *sets[] = { "model.arch=llama",
                           "model.rope_scaling={\"type\":\"linear\",\"factor\":4}" };
    ck_assert_msg(config_apply_overrides(c, sets, 2, err, sizeof err) == 0, "%s", err);
    orch_model_desc d;
    config_model_desc(c, &d);
    ck_assert_uint_eq(d.arch, ORCH_ARCH_LLAMA);
    ck_assert_uint_eq(d.rope_scaling, ORCH_ROPE_LINEAR);
    ck_assert(d.rope_factor == 4.0f);
    const char *bad[] = { "model.rope_scaling.type=ntk" };
    ck_assert_int_eq(config_apply_overrides(c, bad, 1, err, sizeof err), -1);
    ck_assert_msg(
        strstr(err, "model.rope_scaling.type: 'ntk' is not one of linear,llama3"), "%s",
        err);
    config_free(c);
}
END_TEST

START_TEST(test_edit_distance) {
    ck_assert_uint_eq(config_edit_distance("", ""), 0);
    ck_assert_uint_eq(config_edit_distance("lr", "lrr"), 1);
    ck_assert_uint_eq(config_edit_distance("kitten", "sitting"), 3);
    ck_assert_uint_eq(config_edit_distance("abc", ""), 3);
}
END_TEST

static Suite *config_suite(void) {
    Suite *s = suite_create("config");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_valid_and_defaults);
    tcase_add_test(tc, test_shipped_configs_valid);
    tcase_add_test(tc, test_unknown_key_nearest);
    tcase_add_test(tc, test_wrong_type);
    tcase_add_test(tc, test_heads_not_dividing_width);
    tcase_add_test(tc, test_seq_len_over_context);
    tcase_add_test(tc, test_lr_not_positive);
    tcase_add_test(tc, test_min_lr_over_lr);
    tcase_add_test(tc, test_other_ranges);
    tcase_add_test(tc, test_huge_and_fractional_numbers);
    tcase_add_test(tc, test_missing_required);
    tcase_add_test(tc, test_duplicate_key);
    tcase_add_test(tc, test_invalid_json_position);
    tcase_add_test(tc, test_file_errors);
    tcase_add_test(tc, test_absolute_data_paths);
    tcase_add_test(tc, test_overrides);
    tcase_add_test(tc, test_serialise_round_trip);
    tcase_add_test(tc, test_model_description);
    tcase_add_test(tc, test_llama_model);
    tcase_add_test(tc, test_llama_errors);
    tcase_add_test(tc, test_edit_distance);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return test_run_suite(config_suite()); }
