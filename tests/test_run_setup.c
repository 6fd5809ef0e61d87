/*
 * test_run_setup.c - Check suite for orchestrator/train/run_setup.{c,h}
 * called directly: the run directory, fresh run vs --resume vs --init, the
 * config each takes (with --set, --steps and --engine on top), the built-in
 * default (its data paths under its root, continuing runs/default), every
 * refusal with its exact message, that nothing is created, and the
 * default-corpus decision. Each test runs in its own temporary directory
 * (Check forks per test, so chdir is private to it).
 */
#include <check.h>
#include <cjson/cJSON.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "orchestrator/core/config.h"
#include "orchestrator/core/fsio.h"
#include "orchestrator/store/checkpoint.h"
#include "orchestrator/train/run_setup.h"
#include "tests/test_util.h"

static char dir[128];

static void setup(void) {
    test_tmpdir(dir, sizeof dir, "runsetup");
    ck_assert_int_eq(chdir(dir), 0);
}

static void teardown(void) {
    ck_assert_int_eq(chdir("/"), 0);
    test_rmdir(dir);
}

static void write_text(const char *path, const char *text) {
    char err[512];
    ck_assert_msg(fsio_write_file(path, text, strlen(text), err, sizeof err) == 0, "%s",
                  err);
}

/* A small valid config of the given width. */
static void write_config(const char *path, unsigned width, const char *train,
                         const char *val) {
    char text[1024];
    snprintf(text, sizeof text,
             "{\"model\": {\"vocab_size\": 256, \"context\": 32, \"layers\": 1,"
             " \"heads\": 2, \"width\": %u},"
             " \"train\": {\"micro_batch\": 2, \"seq_len\": 16, \"max_steps\": 20,"
             " \"lr\": 0.001},"
             " \"data\": {\"tokenizer\": \"byte\", \"train\": \"%s\", \"val\": \"%s\"},"
             " \"engine\": {\"name\": \"mock\"}}",
             width, train, val);
    write_text(path, text);
}

/* RUN/ckpt-<step> holding the config of cfg_path (and RUN/latest). */
static void make_run(const char *run, uint64_t step, const char *cfg_path, int latest) {
    char err[1024], ck[PATH_MAX];
    ck_assert_msg(fsio_mkdir_p(run, err, sizeof err) == 0, "%s", err);
    orch_config *cfg = NULL;
    ck_assert_msg(config_load_file(cfg_path, &cfg, err, sizeof err) == 0, "%s", err);
    cJSON *state = cJSON_CreateObject();
    cJSON_AddNumberToObject(state, "format", 1);
    cJSON_AddNumberToObject(state, "step", (double)step);
    cJSON_AddStringToObject(state, "tokenizer", "byte");
    cJSON_AddItemToObject(state, "config", config_to_cjson(cfg));
    char *text = cJSON_Print(state);
    cJSON_Delete(state);
    config_free(cfg);
    float w[4] = { 1, 2, 3, 4 };
    ckpt_tensor t = { "wte.weight", 0, 1, { 4 }, w };
    snprintf(ck, sizeof ck, "%s/ckpt-%08llu", run, (unsigned long long)step);
    ck_assert_msg(ckpt_write_dir(ck, &t, 1, text, step, err, sizeof err) == 0, "%s", err);
    free(text);
    if (latest) {
        char p[PATH_MAX + 16], l[64];
        snprintf(p, sizeof p, "%s/latest", run);
        snprintf(l, sizeof l, "ckpt-%08llu\n", (unsigned long long)step);
        write_text(p, l);
    }
}

static run_setup_opts opts(void) {
    run_setup_opts o;
    memset(&o, 0, sizeof o);
    return o;
}

static void expect_err(const run_setup_opts *o, const char *want) {
    run_setup rs;
    char err[2048];
    ck_assert_int_eq(run_setup_prepare(o, &rs, err, sizeof err), -1);
    ck_assert_str_eq(err, want);
    ck_assert_ptr_null(rs.cfg);
}

START_TEST(fresh_run_from_config) {
    write_config("tiny.json", 8, "d/train_*.bin", "d/val_*.bin");
    run_setup_opts o = opts();
    o.config_path = "tiny.json";
    o.steps = 7;
    o.engine = "cpu";
    const char *sets[] = { "train.lr=0.5", "train.epochs=null" };
    o.sets = sets;
    o.n_sets = 2;
    run_setup rs;
    char err[2048];
    ck_assert_msg(run_setup_prepare(&o, &rs, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(rs.run_dir, "runs/tiny");
    ck_assert_str_eq(rs.resume_ckpt, "");
    ck_assert_str_eq(rs.init_ckpt, "");
    ck_assert_str_eq(rs.warn, "");
    ck_assert_int_eq(rs.default_continued, 0);
    ck_assert_uint_eq(rs.cfg->model.width, 8);
    ck_assert_uint_eq(rs.cfg->train.max_steps, 7);
    ck_assert(rs.cfg->train.lr == 0.5);
    ck_assert_str_eq(rs.cfg->engine.name, "cpu");
    run_setup_free(&rs);
    ck_assert_ptr_null(rs.cfg);
    ck_assert_int_ne(access("runs", F_OK), 0); /* nothing created */
    /* A bad override is the config's own message. */
    const char *bad[] = { "train.lrr=1" };
    o.sets = bad;
    o.n_sets = 1;
    expect_err(&o, "--set train.lrr=1: train.lrr: unknown key (did you mean train.lr?)");
}
END_TEST

START_TEST(fresh_run_refuses_a_used_directory) {
    write_config("tiny.json", 8, "d/t_*.bin", "d/v_*.bin");
    make_run("old", 5, "tiny.json", 1);
    run_setup_opts o = opts();
    o.config_path = "tiny.json";
    o.out_dir = "old";
    expect_err(&o, "old already holds checkpoints (newest old/ckpt-00000005): use "
                   "--resume to continue it or --out for a new run");
    /* An empty directory is fine. */
    ck_assert_int_eq(mkdir("empty", 0755), 0);
    o.out_dir = "empty";
    run_setup rs;
    char err[2048];
    ck_assert_msg(run_setup_prepare(&o, &rs, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(rs.run_dir, "empty");
    run_setup_free(&rs);
}
END_TEST

START_TEST(resume_takes_the_checkpoint_config) {
    write_config("w16.json", 16, "d/t_*.bin", "d/v_*.bin");
    make_run("run", 3, "w16.json", 0);
    make_run("run", 5, "w16.json", 1);
    run_setup_opts o = opts();
    o.resume = 1;
    o.out_dir = "run";
    o.steps = 9;
    run_setup rs;
    char err[2048];
    ck_assert_msg(run_setup_prepare(&o, &rs, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(rs.run_dir, "run");
    ck_assert_str_eq(rs.resume_ckpt, "run/ckpt-00000005");
    ck_assert_str_eq(rs.init_ckpt, "");
    ck_assert_str_eq(rs.warn, "");
    ck_assert_uint_eq(rs.cfg->model.width, 16);
    ck_assert_uint_eq(rs.cfg->train.max_steps, 9);
    run_setup_free(&rs);
    /* --resume=CKPT (trailing slash too): the run is its parent. */
    o = opts();
    o.resume = 1;
    o.resume_from = "run/ckpt-00000003/";
    ck_assert_msg(run_setup_prepare(&o, &rs, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(rs.run_dir, "run");
    ck_assert_ptr_nonnull(strstr(rs.resume_ckpt, "run/ckpt-00000003"));
    run_setup_free(&rs);
    /* --resume=RUN */
    o.resume_from = "run";
    ck_assert_msg(run_setup_prepare(&o, &rs, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(rs.run_dir, "run");
    ck_assert_str_eq(rs.resume_ckpt, "run/ckpt-00000005");
    run_setup_free(&rs);
}
END_TEST

START_TEST(resume_refusals) {
    write_config("w16.json", 16, "d/t_*.bin", "d/v_*.bin");
    write_config("w8.json", 8, "d/t_*.bin", "d/v_*.bin");
    make_run("run", 5, "w16.json", 1);
    run_setup_opts o = opts();
    o.resume = 1;
    o.resume_from = "run";
    o.config_path = "w8.json";
    expect_err(&o, "--resume: the model section of w8.json differs from the one in "
                   "run/ckpt-00000005/state.json");
    o.config_path = NULL;
    const char *sets[] = { "model.width=32" };
    o.sets = sets;
    o.n_sets = 1;
    expect_err(&o, "--resume: the model section cannot change (it differs from "
                   "run/ckpt-00000005/state.json)");
    o = opts();
    o.resume = 1;
    o.resume_from = "nowhere";
    expect_err(&o, "--resume: nowhere: no such checkpoint or run directory");
    /* Without --out the default run directory has nothing to resume. */
    o.resume_from = NULL;
    run_setup rs;
    char err[2048];
    ck_assert_int_eq(run_setup_prepare(&o, &rs, err, sizeof err), -1);
    ck_assert_msg(strncmp(err, "--resume: runs/default", 22) == 0, "%s", err);
    /* --init and --resume exclude each other. */
    o.init_from = "run";
    expect_err(&o, "--init starts a new run; it cannot be combined with --resume");
}
END_TEST

START_TEST(resume_warns_about_a_missing_latest) {
    write_config("w16.json", 16, "d/t_*.bin", "d/v_*.bin");
    make_run("run", 5, "w16.json", 0);
    run_setup_opts o = opts();
    o.resume = 1;
    o.out_dir = "run";
    run_setup rs;
    char err[2048];
    ck_assert_msg(run_setup_prepare(&o, &rs, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(rs.resume_ckpt, "run/ckpt-00000005");
    ck_assert_msg(rs.warn[0] != '\0', "no warning without a latest file");
    run_setup_free(&rs);
}
END_TEST

START_TEST(init_starts_a_new_run) {
    write_config("w16.json", 16, "d/t_*.bin", "d/v_*.bin");
    write_config("w8.json", 8, "d/t_*.bin", "d/v_*.bin");
    make_run("base", 40, "w16.json", 1);
    run_setup_opts o = opts();
    o.init_from = "base";
    run_setup rs;
    char err[2048];
    ck_assert_msg(run_setup_prepare(&o, &rs, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(rs.run_dir, "runs/finetune");
    ck_assert_str_eq(rs.init_ckpt, "base/ckpt-00000040");
    ck_assert_str_eq(rs.resume_ckpt, "");
    ck_assert_uint_eq(rs.cfg->model.width, 16);
    run_setup_free(&rs);
    /* With a config of the same model, the run is named after it. */
    write_config("ft.json", 16, "d/t_*.bin", "d/v_*.bin");
    o.config_path = "ft.json";
    ck_assert_msg(run_setup_prepare(&o, &rs, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(rs.run_dir, "runs/ft");
    run_setup_free(&rs);
    o.config_path = "w8.json";
    expect_err(&o, "--init: the model section of w8.json differs from the one in "
                   "base/ckpt-00000040/state.json");
    o.config_path = NULL;
    const char *sets[] = { "model.layers=2" };
    o.sets = sets;
    o.n_sets = 1;
    expect_err(&o, "--init: the model section cannot change (it differs from "
                   "base/ckpt-00000040/state.json)");
    o = opts();
    o.init_from = "nothing";
    expect_err(&o, "--init: nothing: no such checkpoint or run directory");
    /* --init into a directory that holds a run is refused like a fresh run. */
    o.init_from = "base";
    o.out_dir = "base";
    expect_err(&o, "base already holds checkpoints (newest base/ckpt-00000040): use "
                   "--resume to continue it or --out for a new run");
}
END_TEST

START_TEST(builtin_default) {
    char root[PATH_MAX], want[PATH_MAX + 64];
    snprintf(root, sizeof root, "%s/inst", dir);
    char err[1024];
    ck_assert_int_eq(fsio_mkdir_p("inst/configs", err, sizeof err), 0);
    write_config("inst/configs/default.json", 8, "data/kjv-byte/train_*.bin",
                 "/abs/val_*.bin");
    run_setup_opts o = opts();
    o.default_root = root;
    run_setup rs;
    char e2[2048];
    ck_assert_msg(run_setup_prepare(&o, &rs, e2, sizeof e2) == 0, "%s", e2);
    ck_assert_str_eq(rs.run_dir, "runs/default");
    ck_assert_int_eq(rs.default_continued, 0);
    ck_assert_str_eq(rs.resume_ckpt, "");
    snprintf(want, sizeof want, "%s/data/kjv-byte/train_*.bin", root);
    ck_assert_str_eq(rs.cfg->data.train, want);           /* under the root */
    ck_assert_str_eq(rs.cfg->data.val, "/abs/val_*.bin"); /* absolute: kept */
    run_setup_free(&rs);
    /* Once runs/default holds a checkpoint, the default continues it with
     * the checkpoint's config. */
    write_config("w16.json", 16, "d/t_*.bin", "d/v_*.bin");
    make_run("runs/default", 3, "w16.json", 1);
    ck_assert_msg(run_setup_prepare(&o, &rs, e2, sizeof e2) == 0, "%s", e2);
    ck_assert_int_eq(rs.default_continued, 1);
    ck_assert_str_eq(rs.resume_ckpt, "runs/default/ckpt-00000003");
    ck_assert_uint_eq(rs.cfg->model.width, 16);
    run_setup_free(&rs);
    /* ...but not when --out names it: that is a fresh run. */
    o.out_dir = "runs/default";
    expect_err(&o, "runs/default already holds checkpoints (newest "
                   "runs/default/ckpt-00000003): use --resume to continue it or --out "
                   "for a new run");
    /* No default config anywhere. */
    o = opts();
    o.default_root = dir; /* has no configs/ */
    o.out_dir = "fresh";
    expect_err(&o, "no --config given and the built-in default (configs/default.json "
                   "next to orch or in the current directory) is missing");
}
END_TEST

/* An engine.name from a file must be built in unless trusted (issue 12,
 * defect 1): refused before anything is loaded, whatever the file. */
START_TEST(engine_name_from_files_needs_trust) {
    char err[2048];
    write_config("tiny.json", 8, "d/t_*.bin", "d/v_*.bin");
    orch_config *cfg = NULL;
    ck_assert_int_eq(config_load_file("tiny.json", &cfg, err, sizeof err), 0);
    const char *lib[] = { "engine.name=/opt/evil/libengine_x.so" };
    ck_assert_int_eq(config_apply_overrides(cfg, lib, 1, err, sizeof err), 0);
    char *text = config_to_json(cfg);
    config_free(cfg);
    write_text("evil.json", text);
    free(text);
    /* --config FILE */
    run_setup_opts o = opts();
    o.config_path = "evil.json";
    expect_err(&o,
               "evil.json: config engine.name '/opt/evil/libengine_x.so' is a library "
               "path; paths are only accepted from the command line: pass "
               "--engine=/opt/evil/libengine_x.so, or --trust-config-engine");
    /* ...accepted with --trust-config-engine, --engine or --set engine.name. */
    run_setup rs;
    o.trust_config_engine = 1;
    ck_assert_msg(run_setup_prepare(&o, &rs, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(rs.cfg->engine.name, "/opt/evil/libengine_x.so");
    run_setup_free(&rs);
    o.trust_config_engine = 0;
    o.engine = "./mine.so";
    ck_assert_msg(run_setup_prepare(&o, &rs, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(rs.cfg->engine.name, "./mine.so");
    run_setup_free(&rs);
    o.engine = NULL;
    const char *set[] = { "engine.name=cuda" };
    o.sets = set;
    o.n_sets = 1;
    ck_assert_msg(run_setup_prepare(&o, &rs, err, sizeof err) == 0, "%s", err);
    run_setup_free(&rs);
    /* A checkpoint that names it: --resume and --init. */
    make_run("run", 4, "evil.json", 1);
    o = opts();
    o.resume = 1;
    o.out_dir = "run";
    expect_err(&o, "run/ckpt-00000004/state.json: config engine.name "
                   "'/opt/evil/libengine_x.so' is a library path; paths are only "
                   "accepted from the command line: pass "
                   "--engine=/opt/evil/libengine_x.so, or --trust-config-engine");
    o = opts();
    o.init_from = "run";
    o.out_dir = "ft";
    expect_err(&o, "run/ckpt-00000004/state.json: config engine.name "
                   "'/opt/evil/libengine_x.so' is a library path; paths are only "
                   "accepted from the command line: pass "
                   "--engine=/opt/evil/libengine_x.so, or --trust-config-engine");
    o.trust_config_engine = 1;
    ck_assert_msg(run_setup_prepare(&o, &rs, err, sizeof err) == 0, "%s", err);
    run_setup_free(&rs);
    /* --resume with --config: the --config file is where the name came from. */
    o = opts();
    o.resume = 1;
    o.out_dir = "run";
    o.config_path = "evil.json";
    o.steps = 30;
    expect_err(&o,
               "evil.json: config engine.name '/opt/evil/libengine_x.so' is a library "
               "path; paths are only accepted from the command line: pass "
               "--engine=/opt/evil/libengine_x.so, or --trust-config-engine");
    ck_assert_int_ne(access("ft", F_OK), 0); /* nothing created */
}
END_TEST

START_TEST(default_corpus_decision) {
    write_config("c.json", 8, "data/kjv-byte/train_*.bin", "data/kjv-byte/val_*.bin");
    orch_config *cfg = NULL;
    char err[1024], d[PATH_MAX];
    ck_assert_int_eq(config_load_file("c.json", &cfg, err, sizeof err), 0);
    strcpy(d, "unset");
    ck_assert_int_eq(run_setup_default_corpus(cfg, d, sizeof d), 1);
    ck_assert_str_eq(d, "data");
    const char *cases[][3] = {
        /* data.train, data.val, data_dir or "" for 0 */
        { "kjv-byte/train_*.bin", "kjv-byte/val_*.bin", "." },
        { "/kjv-byte/train_*.bin", "/kjv-byte/val_*.bin", "/" },
        { "/a/b/kjv-byte/train_*.bin", "x", "/a/b" },
        { "data/kjv-gpt2/train_*.bin", "x", "" }, /* another tokenizer's */
        { "data/mine/train_*.bin", "x", "" },
        { "train_*.bin", "x", "" },
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char t[256], v[256];
        snprintf(t, sizeof t, "data.train=%s", cases[k][0]);
        snprintf(v, sizeof v, "data.val=%s", cases[k][1]);
        const char *sets[] = { t, v };
        ck_assert_int_eq(config_apply_overrides(cfg, sets, 2, err, sizeof err), 0);
        strcpy(d, "unset");
        int want = cases[k][2][0] != '\0';
        ck_assert_msg(run_setup_default_corpus(cfg, d, sizeof d) == want, "case %zu", k);
        if (want)
            ck_assert_str_eq(d, cases[k][2]);
        else
            ck_assert_str_eq(d, "unset");
    }
    /* Shards that exist are used as they are. */
    ck_assert_int_eq(fsio_mkdir_p("data/kjv-byte", err, sizeof err), 0);
    write_text("data/kjv-byte/train_000.bin", "x");
    write_text("data/kjv-byte/val_000.bin", "x");
    const char *back[] = { "data.train=data/kjv-byte/train_*.bin",
                           "data.val=data/kjv-byte/val_*.bin" };
    ck_assert_int_eq(config_apply_overrides(cfg, back, 2, err, sizeof err), 0);
    ck_assert_int_eq(run_setup_default_corpus(cfg, d, sizeof d), 0);
    config_free(cfg);
}
END_TEST

static Suite *run_setup_suite(void) {
    Suite *s = suite_create("run_setup");
    TCase *tc = tcase_create("prepare");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, fresh_run_from_config);
    tcase_add_test(tc, fresh_run_refuses_a_used_directory);
    tcase_add_test(tc, resume_takes_the_checkpoint_config);
    tcase_add_test(tc, resume_refusals);
    tcase_add_test(tc, resume_warns_about_a_missing_latest);
    tcase_add_test(tc, init_starts_a_new_run);
    tcase_add_test(tc, builtin_default);
    tcase_add_test(tc, default_corpus_decision);
    tcase_add_test(tc, engine_name_from_files_needs_trust);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return test_run_suite(run_setup_suite()); }
