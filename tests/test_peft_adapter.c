/*
 * test_peft_adapter.c - orchestrator/store/peft_adapter.c through the mock
 * engine: the PEFT names and adapter_config.json written, a save -> load
 * round trip (equal bits, also back through the engine), F16/BF16 reading,
 * the base fingerprint (refusal of an adapter made for another base), the
 * target-module mapping (c_proj shared on gpt2, partial llama groups),
 * rank 0 and rank above the width, every kind of bad adapter_config.json
 * and bad tensor file, and a failure at every file-system call of a save
 * (fsio fault hook): DIR keeps the previous adapter, loadable, or the new
 * one, never a broken one.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>

#include "engine_api/orch_engine.h"
#include "orchestrator/core/engine_loader.h"
#include "orchestrator/core/fsio.h"
#include "orchestrator/store/peft_adapter.h"
#include "orchestrator/store/safetensors.h"
#include "tests/test_util.h"

TEST_ENGINE_FIXTURE("mock")

static orch_model_desc gpt2(void) { return test_model_desc(64, 16, 2, 2, 8); }

static orch_engine_ctx *make_ctx(const orch_model_desc *m, uint64_t seed) {
    orch_engine_options o = { sizeof o, 1, seed, NULL };
    orch_engine_ctx *ctx = NULL;
    char err[512] = "";
    ck_assert_msg(A->context_create(m, &o, &ctx, err, sizeof err) == ORCH_OK, "%s", err);
    return ctx;
}

/* A trained-looking adapter: created, then every element set. */
static uint32_t adapter_in(orch_engine_ctx *ctx, uint32_t rank, uint32_t targets,
                           float base) {
    orch_lora_desc d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.rank = rank;
    d.alpha = 12.0f;
    d.targets = targets;
    d.seed = 5;
    uint32_t id = 0, n = 0;
    ck_assert_int_eq(A->adapter_create(ctx, &d, &id), ORCH_OK);
    A->adapter_tensor_count(ctx, id, ORCH_TENSOR_PARAM, &n);
    for (uint32_t i = 0; i < n; i++) {
        orch_tensor_info t;
        memset(&t, 0, sizeof t);
        t.struct_size = sizeof t;
        A->adapter_tensor_info(ctx, id, ORCH_TENSOR_PARAM, i, &t);
        float *v = malloc(t.numel * 4);
        for (uint64_t j = 0; j < t.numel; j++)
            v[j] = base + 0.001f * (float)(i * 131 + j);
        ck_assert_int_eq(
            A->adapter_tensor_write(ctx, id, ORCH_TENSOR_PARAM, i, v, t.numel * 4),
            ORCH_OK);
        free(v);
    }
    return id;
}

static void to_peft(orch_engine_ctx *ctx, uint32_t id, const orch_model_desc *m,
                    uint32_t rank, uint32_t targets, peft_adapter *a) {
    char fp[PEFT_FP_MAX], err[1024] = "";
    ck_assert_int_eq(peft_base_fingerprint(&H, ctx, fp, err, sizeof err), 0);
    orch_lora_desc d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.rank = rank;
    d.alpha = 12.0f;
    d.targets = targets;
    ck_assert_msg(peft_adapter_from_engine(&H, ctx, id, m, &d, "/base/x", fp, a, err,
                                           sizeof err) == 0,
                  "%s", err);
}

static void assert_equal(const peft_adapter *a, const peft_adapter *b) {
    ck_assert_uint_eq(a->n, b->n);
    ck_assert_uint_eq(a->rank, b->rank);
    ck_assert(a->alpha == b->alpha);
    ck_assert_uint_eq(a->targets, b->targets);
    ck_assert_str_eq(a->fingerprint, b->fingerprint);
    for (size_t i = 0; i < a->n; i++) {
        ck_assert_str_eq(a->t[i].name, b->t[i].name);
        ck_assert_uint_eq(a->t[i].numel, b->t[i].numel);
        ck_assert_int_eq(memcmp(a->t[i].data, b->t[i].data, a->t[i].numel * 4), 0);
    }
}

static void write_text(const char *dir, const char *file, const char *text) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

START_TEST(test_round_trip) {
    orch_model_desc m = gpt2();
    orch_engine_ctx *ctx = make_ctx(&m, 1);
    uint32_t id = adapter_in(ctx, 4, ORCH_LORA_TARGET_ALL, 0.1f);
    peft_adapter a, b;
    to_peft(ctx, id, &m, 4, ORCH_LORA_TARGET_ALL, &a);
    char dir[64], err[1024] = "";
    test_tmpdir(dir, sizeof dir, "peft");
    ck_assert_msg(peft_adapter_save(dir, &a, err, sizeof err) == 0, "%s", err);
    /* The names PEFT looks for, and the metadata. */
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, PEFT_WEIGHTS_FILE);
    safetensors_file *f = NULL;
    ck_assert_int_eq(safetensors_open(path, &f, err, sizeof err), 0);
    ck_assert_uint_eq(safetensors_count(f), 16);
    const safetensors_tensor *t =
        safetensors_find(f, "base_model.model.transformer.h.0.attn.c_attn.lora_A.weight");
    ck_assert_ptr_nonnull(t);
    ck_assert_uint_eq(t->shape[0], 4);
    ck_assert_uint_eq(t->shape[1], 8);
    t = safetensors_find(f, "base_model.model.transformer.h.1.mlp.c_proj.lora_B.weight");
    ck_assert_ptr_nonnull(t);
    ck_assert_uint_eq(t->shape[0], 8);
    ck_assert_uint_eq(t->shape[1], 4);
    ck_assert_str_eq(safetensors_metadata(f, "format"), "pt");
    ck_assert_str_eq(safetensors_metadata(f, "orch_base_fingerprint"), a.fingerprint);
    safetensors_close(f);
    char *cfg = NULL;
    snprintf(path, sizeof path, "%s/%s", dir, PEFT_CONFIG_FILE);
    ck_assert_int_eq(fsio_read_file(path, 1 << 20, &cfg, NULL, err, sizeof err), 0);
    ck_assert_ptr_nonnull(strstr(cfg, "\"peft_type\":\t\"LORA\""));
    ck_assert_ptr_nonnull(strstr(cfg, "\"task_type\":\t\"CAUSAL_LM\""));
    ck_assert_ptr_nonnull(
        strstr(cfg, "\"target_modules\":\t[\"c_attn\", \"c_fc\", \"c_proj\"]"));
    ck_assert_ptr_nonnull(strstr(cfg, "\"fan_in_fan_out\":\ttrue"));
    ck_assert_ptr_nonnull(strstr(cfg, "\"lora_alpha\":\t12"));
    ck_assert_ptr_nonnull(strstr(cfg, "\"r\":\t4"));
    ck_assert_ptr_nonnull(strstr(cfg, "\"base_model_name_or_path\":\t\"/base/x\""));
    free(cfg);
    /* Load: equal bits; through a second context: the same tensors. */
    ck_assert_msg(peft_adapter_load(dir, &m, &b, err, sizeof err) == 0, "%s", err);
    assert_equal(&a, &b);
    ck_assert_int_eq(peft_adapter_check_base(&b, dir, a.fingerprint, err, sizeof err), 0);
    orch_engine_ctx *ctx2 = make_ctx(&m, 1);
    uint32_t id2 = 0;
    ck_assert_msg(peft_adapter_to_engine(&b, &H, ctx2, &id2, err, sizeof err) == 0, "%s",
                  err);
    peft_adapter c;
    to_peft(ctx2, id2, &m, 4, ORCH_LORA_TARGET_ALL, &c);
    assert_equal(&a, &c);
    peft_adapter_free(&c);
    peft_adapter_free(&b);
    A->context_destroy(ctx2);
    peft_adapter_free(&a);
    A->context_destroy(ctx);
    test_rmdir(dir);
}
END_TEST

START_TEST(test_foreign_base_refused) {
    orch_model_desc m = gpt2();
    orch_engine_ctx *ctx = make_ctx(&m, 1), *other = make_ctx(&m, 2);
    uint32_t id = adapter_in(ctx, 2, ORCH_LORA_TARGET_ATTN_QKV, 0.0f);
    peft_adapter a, b;
    to_peft(ctx, id, &m, 2, ORCH_LORA_TARGET_ATTN_QKV, &a);
    char dir[64], err[1024] = "", fp2[PEFT_FP_MAX], fp1[PEFT_FP_MAX];
    test_tmpdir(dir, sizeof dir, "peft");
    ck_assert_int_eq(peft_adapter_save(dir, &a, err, sizeof err), 0);
    ck_assert_int_eq(peft_adapter_load(dir, &m, &b, err, sizeof err), 0);
    ck_assert_int_eq(peft_base_fingerprint(&H, other, fp2, err, sizeof err), 0);
    ck_assert_int_eq(peft_base_fingerprint(&H, ctx, fp1, err, sizeof err), 0);
    ck_assert_str_ne(fp1, fp2);
    ck_assert_str_eq(fp1, a.fingerprint);
    ck_assert_int_eq(peft_adapter_check_base(&b, dir, fp2, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "trained on another base model"), "%s", err);
    ck_assert_ptr_null(strchr(err, '\n'));
    peft_adapter_free(&b);
    /* A one-element change of the base changes the fingerprint. */
    orch_tensor_info ti;
    memset(&ti, 0, sizeof ti);
    ti.struct_size = sizeof ti;
    A->tensor_info(ctx, ORCH_TENSOR_PARAM, 2, &ti); /* h.0.ln_1.weight [8] */
    float *v = malloc(ti.numel * 4);
    A->tensor_read(ctx, ORCH_TENSOR_PARAM, 2, v, ti.numel * 4);
    v[3] = nextafterf(v[3], 2.0f);
    A->tensor_write(ctx, ORCH_TENSOR_PARAM, 2, v, ti.numel * 4);
    ck_assert_int_eq(peft_base_fingerprint(&H, ctx, fp2, err, sizeof err), 0);
    ck_assert_str_ne(fp1, fp2);
    free(v);
    /* Another architecture (llama): refused by orch_arch. */
    orch_model_desc l = test_model_desc(64, 16, 2, 2, 8);
    l.arch = ORCH_ARCH_LLAMA;
    l.mlp_width = 16;
    ck_assert_int_eq(peft_adapter_load(dir, &l, &b, err, sizeof err), -1);
    peft_adapter_free(&a);
    A->context_destroy(ctx);
    A->context_destroy(other);
    test_rmdir(dir);
}
END_TEST

START_TEST(test_targets_and_ranks) {
    char err[512], buf[128];
    uint32_t t = 0;
    ck_assert_int_eq(peft_targets_parse(ORCH_ARCH_GPT2, "qkv", &t, err, sizeof err), 0);
    ck_assert_uint_eq(t, ORCH_LORA_TARGET_ATTN_QKV);
    ck_assert_int_eq(
        peft_targets_parse(ORCH_ARCH_GPT2, "c_attn,c_proj", &t, err, sizeof err), 0);
    ck_assert_uint_eq(t, 0xb);
    ck_assert_int_eq(peft_targets_parse(ORCH_ARCH_GPT2, "attn_out", &t, err, sizeof err),
                     -1);
    ck_assert_msg(strstr(err, "c_proj"), "%s", err);
    ck_assert_int_eq(peft_targets_parse(ORCH_ARCH_GPT2, "q_proj", &t, err, sizeof err),
                     -1);
    ck_assert_msg(strstr(err, "unknown gpt2 module 'q_proj'"), "%s", err);
    ck_assert_int_eq(
        peft_targets_parse(ORCH_ARCH_LLAMA, "q_proj,v_proj", &t, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "without 'k_proj'"), "%s", err);
    ck_assert_int_eq(
        peft_targets_parse(ORCH_ARCH_LLAMA, "attn_out,mlp_down", &t, err, sizeof err), 0);
    ck_assert_uint_eq(t, 0xa);
    ck_assert_int_eq(peft_targets_parse(ORCH_ARCH_LLAMA, "all", &t, err, sizeof err), 0);
    peft_targets_modules(ORCH_ARCH_LLAMA, t, buf, sizeof buf);
    ck_assert_str_eq(buf, "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj");
    orch_model_desc m = gpt2();
    peft_adapter_tensor *tab = NULL;
    size_t n = 0;
    ck_assert_int_eq(peft_expected_table(&m, 0, 1, &tab, &n, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "rank 0: must be 1..8"), "%s", err);
    ck_assert_int_eq(peft_expected_table(&m, 9, 1, &tab, &n, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "rank 9: must be 1..8 (min(in, out) of h.0.attn.c_attn"),
                  "%s", err);
    ck_assert_int_eq(peft_expected_table(&m, 8, 0xf, &tab, &n, err, sizeof err), 0);
    ck_assert_uint_eq(n, 16);
    free(tab);
    /* The engine's table is the one expected (llama with GQA). */
    orch_model_desc l = test_model_desc(40, 16, 2, 4, 16);
    l.arch = ORCH_ARCH_LLAMA;
    l.kv_heads = 2;
    l.mlp_width = 24;
    orch_engine_ctx *ctx = make_ctx(&l, 3);
    uint32_t id = adapter_in(ctx, 3, ORCH_LORA_TARGET_ALL, 0.0f);
    peft_adapter a, b;
    to_peft(ctx, id, &l, 3, ORCH_LORA_TARGET_ALL, &a);
    ck_assert_uint_eq(a.n, 2 * 2 * 7);
    char dir[64];
    test_tmpdir(dir, sizeof dir, "peft");
    ck_assert_int_eq(peft_adapter_save(dir, &a, err, sizeof err), 0);
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, PEFT_WEIGHTS_FILE);
    safetensors_file *f = NULL;
    ck_assert_int_eq(safetensors_open(path, &f, err, sizeof err), 0);
    ck_assert_ptr_nonnull(safetensors_find(
        f, "base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight"));
    ck_assert_uint_eq(
        safetensors_find(f,
                         "base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight")
            ->shape[0],
        8);
    safetensors_close(f);
    ck_assert_int_eq(peft_adapter_load(dir, &l, &b, err, sizeof err), 0);
    assert_equal(&a, &b);
    peft_adapter_free(&a);
    peft_adapter_free(&b);
    A->context_destroy(ctx);
    test_rmdir(dir);
}
END_TEST

/* Replace `from` by `to` in DIR/adapter_config.json and expect the load to
 * fail with `want` in the message. */
static void bad_config(const char *dir, const char *good, const char *from,
                       const char *to, const char *want) {
    const char *p = strstr(good, from);
    ck_assert_msg(p != NULL, "'%s' not in the config", from);
    char text[8192];
    snprintf(text, sizeof text, "%.*s%s%s", (int)(p - good), good, to, p + strlen(from));
    write_text(dir, PEFT_CONFIG_FILE, text);
    orch_model_desc m = gpt2();
    peft_adapter b;
    char err[2048] = "";
    ck_assert_msg(peft_adapter_load(dir, &m, &b, err, sizeof err) == -1,
                  "accepted %s -> %s", from, to);
    ck_assert_msg(strstr(err, want), "%s -> %s: '%s' lacks '%s'", from, to, err, want);
    ck_assert_ptr_null(strchr(err, '\n'));
}

START_TEST(test_bad_configs) {
    orch_model_desc m = gpt2();
    orch_engine_ctx *ctx = make_ctx(&m, 1);
    uint32_t id = adapter_in(ctx, 4, ORCH_LORA_TARGET_ALL, 0.1f);
    peft_adapter a;
    to_peft(ctx, id, &m, 4, ORCH_LORA_TARGET_ALL, &a);
    char dir[64], err[1024] = "", path[256];
    test_tmpdir(dir, sizeof dir, "peft");
    ck_assert_int_eq(peft_adapter_save(dir, &a, err, sizeof err), 0);
    char *good = NULL;
    snprintf(path, sizeof path, "%s/%s", dir, PEFT_CONFIG_FILE);
    ck_assert_int_eq(fsio_read_file(path, 1 << 20, &good, NULL, err, sizeof err), 0);
    bad_config(dir, good, "\"LORA\"", "\"IA3\"", "peft_type IA3: only \"LORA\"");
    bad_config(dir, good, "\"CAUSAL_LM\"", "\"SEQ_CLS\"", "task_type SEQ_CLS");
    bad_config(dir, good, "\"r\":\t4", "\"r\":\t0", "r 0: expected an integer >= 1");
    bad_config(dir, good, "\"r\":\t4", "\"r\":\t2.5", "r 2.5");
    bad_config(dir, good, "\"r\":\t4", "\"r\":\t9", "rank 9: must be 1..8");
    bad_config(dir, good, "\"r\":\t4", "\"r\":\t2", "the ranks disagree");
    bad_config(dir, good, "\"lora_alpha\":\t12", "\"lora_alpha\":\t-1", "lora_alpha");
    bad_config(dir, good, "\"use_rslora\":\tfalse", "\"use_rslora\":\ttrue",
               "use_rslora is true: orch does not support this PEFT option");
    bad_config(dir, good, "\"use_dora\":\tfalse", "\"use_dora\":\ttrue",
               "use_dora is true");
    bad_config(dir, good, "\"bias\":\t\"none\"", "\"bias\":\t\"all\"", "bias all");
    bad_config(dir, good, "\"rank_pattern\":\t{\n\t}", "\"rank_pattern\":\t{\"c_fc\": 2}",
               "rank_pattern is {\"c_fc\":2}");
    bad_config(dir, good, "\"modules_to_save\":\tnull", "\"modules_to_save\":\t[\"wte\"]",
               "modules_to_save");
    bad_config(dir, good, "\"layers_to_transform\":\tnull",
               "\"layers_to_transform\":\t[0]", "layers_to_transform");
    bad_config(dir, good, "\"peft_type\"", "\"new_option\": 3, \"peft_type\"",
               "new_option is 3");
    bad_config(dir, good, "[\"c_attn\", \"c_fc\", \"c_proj\"]", "\".*c_attn\"",
               "is a regular expression");
    bad_config(dir, good, "[\"c_attn\", \"c_fc\", \"c_proj\"]", "[\"c_attn\", \"wte\"]",
               "unknown gpt2 module 'wte'");
    bad_config(dir, good, "[\"c_attn\", \"c_fc\", \"c_proj\"]", "[\"c_attn\", \"c_fc\"]",
               "unexpected tensor base_model.model.transformer.h.0.attn.c_proj");
    bad_config(dir, good, "[\"c_attn\", \"c_fc\", \"c_proj\"]", "[]", "target_modules");
    bad_config(dir, good, "{", "[", "not a JSON object");
    /* A good config with a missing tensor file / a tensor too few. */
    write_text(dir, PEFT_CONFIG_FILE, good);
    peft_adapter b;
    ck_assert_int_eq(peft_adapter_load(dir, &m, &b, err, sizeof err), 0);
    peft_adapter_free(&b);
    peft_adapter cut = a;
    cut.n = a.n - 1; /* drops h.1.mlp.c_proj.lora_B */
    ck_assert_int_eq(peft_adapter_save(dir, &cut, err, sizeof err), 0);
    ck_assert_int_eq(peft_adapter_load(dir, &m, &b, err, sizeof err), -1);
    ck_assert_msg(strstr(err,
                         "missing tensor base_model.model.transformer.h.1.mlp.c_proj."
                         "lora_B.weight"),
                  "%s", err);
    free(good);
    peft_adapter_free(&a);
    A->context_destroy(ctx);
    test_rmdir(dir);
}
END_TEST

/* F16 tensors (as PEFT saves a half-precision adapter) load as f32. */
START_TEST(test_f16_file) {
    orch_model_desc m = test_model_desc(64, 16, 1, 2, 8);
    peft_adapter_tensor *tab = NULL;
    size_t n = 0;
    char err[1024], dir[64], path[256];
    ck_assert_int_eq(
        peft_expected_table(&m, 2, ORCH_LORA_TARGET_MLP_UP, &tab, &n, err, sizeof err),
        0);
    test_tmpdir(dir, sizeof dir, "peft");
    write_text(
        dir, PEFT_CONFIG_FILE,
        "{\"peft_type\": \"LORA\", \"r\": 2, \"lora_alpha\": 4, \"target_modules\": "
        "[\"c_fc\"], \"lora_dropout\": 0.05, \"revision\": null, \"use_rslora\": "
        "false, \"init_lora_weights\": true}");
    snprintf(path, sizeof path, "%s/%s", dir, PEFT_WEIGHTS_FILE);
    safetensors_writer *w = NULL;
    ck_assert_int_eq(safetensors_writer_create(path, &w, err, sizeof err), 0);
    for (size_t i = 0; i < n; i++) {
        char name[160];
        snprintf(name, sizeof name, "base_model.model.transformer.%s", tab[i].name);
        ck_assert_int_eq(safetensors_writer_declare(w, name, SAFETENSORS_F16, 2,
                                                    tab[i].shape, err, sizeof err),
                         0);
    }
    ck_assert_int_eq(safetensors_writer_begin_data(w, err, sizeof err), 0);
    for (size_t i = 0; i < n; i++)
        for (uint64_t j = 0; j < tab[i].numel; j++) {
            uint16_t h = 0x3c00;    /* 1.0 */
            if (j == 1) h = 0xb800; /* -0.5 */
            ck_assert_int_eq(safetensors_writer_write(w, &h, 2, err, sizeof err), 0);
        }
    ck_assert_int_eq(safetensors_writer_finish(w, NULL, err, sizeof err), 0);
    peft_adapter b;
    ck_assert_msg(peft_adapter_load(dir, &m, &b, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(b.fingerprint, ""); /* made outside orch */
    ck_assert_int_eq(peft_adapter_check_base(&b, dir, "sha256:00", err, sizeof err), 0);
    ck_assert(b.t[0].data[0] == 1.0f && b.t[0].data[1] == -0.5f);
    ck_assert(b.alpha == 4.0f);
    peft_adapter_free(&b);
    free(tab);
    test_rmdir(dir);
}
END_TEST

/* Fail every write-side file-system call of a save in turn (ENOSPC, and a
 * short write): the directory then holds the old adapter or the new one,
 * each loading with its own bits. */
START_TEST(test_disk_full_keeps_previous) {
    orch_model_desc m = gpt2();
    orch_engine_ctx *ctx = make_ctx(&m, 1);
    uint32_t id1 = adapter_in(ctx, 4, 0xf, 0.1f), id2 = adapter_in(ctx, 4, 0xf, -0.3f);
    peft_adapter a1, a2, got;
    to_peft(ctx, id1, &m, 4, 0xf, &a1);
    to_peft(ctx, id2, &m, 4, 0xf, &a2);
    char dir[64], err[1024] = "";
    test_tmpdir(dir, sizeof dir, "peft");
    ck_assert_int_eq(peft_adapter_save(dir, &a1, err, sizeof err), 0);
    fsio_fault_arm(0, 0, FSIO_FAULT_FAIL);
    ck_assert_int_eq(peft_adapter_save(dir, &a1, err, sizeof err), 0);
    uint64_t sites = fsio_fault_sites();
    fsio_fault_disarm();
    ck_assert_uint_ge(sites, 8);
    for (int mode = 0; mode < 2; mode++)
        for (uint64_t k = 1; k <= sites; k++) {
            ck_assert_int_eq(peft_adapter_save(dir, &a1, err, sizeof err), 0);
            fsio_fault_arm(k, ENOSPC, mode ? FSIO_FAULT_SHORT : FSIO_FAULT_FAIL);
            int rc = peft_adapter_save(dir, &a2, err, sizeof err);
            int fired = fsio_fault_fired(NULL, NULL, 0);
            fsio_fault_disarm();
            ck_assert_msg(rc == (fired ? -1 : 0), "site %llu mode %d: rc %d fired %d",
                          (unsigned long long)k, mode, rc, fired);
            ck_assert_msg(peft_adapter_load(dir, &m, &got, err, sizeof err) == 0,
                          "site %llu mode %d: %s", (unsigned long long)k, mode, err);
            int is2 = memcmp(got.t[0].data, a2.t[0].data, 4 * a2.t[0].numel) == 0;
            assert_equal(is2 ? &a2 : &a1, &got);
            if (rc == 0) ck_assert(is2);
            peft_adapter_free(&got);
        }
    peft_adapter_free(&a1);
    peft_adapter_free(&a2);
    A->context_destroy(ctx);
    test_rmdir(dir);
}
END_TEST

/* The CPU engine (when built, with adapters): the same table, the same A
 * for the same seed, the same base fingerprint for the same weights, and an
 * adapter saved from the mock loads into it with equal bits. */
START_TEST(test_cpu_engine_agrees) {
    engine_handle cpu;
    char err[1024] = "";
    if (engine_load("cpu", &cpu, err, sizeof err) != 0 ||
        !(cpu.api->capabilities & ORCH_CAP_LORA)) {
        fprintf(stderr,
                "test_peft_adapter: no cpu engine with LoRA (%s): cross-engine "
                "checks skipped\n",
                err[0] ? err : "no ORCH_CAP_LORA");
        if (!err[0]) engine_unload(&cpu);
        return;
    }
    for (int arch = 0; arch < 2; arch++) {
        orch_model_desc m = test_model_desc(64, 16, 2, 2, 16);
        if (arch) {
            m.arch = ORCH_ARCH_LLAMA;
            m.heads = 4;
            m.kv_heads = 2;
            m.mlp_width = 24;
        }
        orch_engine_options o = { sizeof o, 1, 1, NULL };
        orch_engine_ctx *mc = make_ctx(&m, 1), *cc = NULL;
        ck_assert_msg(cpu.api->context_create(&m, &o, &cc, err, sizeof err) == ORCH_OK,
                      "%s", err);
        /* the same base weights (the mock's) and fingerprint */
        uint32_t nt = 0;
        A->tensor_count(mc, ORCH_TENSOR_PARAM, &nt);
        for (uint32_t i = 0; i < nt; i++) {
            orch_tensor_info ti;
            memset(&ti, 0, sizeof ti);
            ti.struct_size = sizeof ti;
            A->tensor_info(mc, ORCH_TENSOR_PARAM, i, &ti);
            float *v = malloc(ti.numel * 4);
            A->tensor_read(mc, ORCH_TENSOR_PARAM, i, v, ti.numel * 4);
            ck_assert_int_eq(
                cpu.api->tensor_write(cc, ORCH_TENSOR_PARAM, i, v, ti.numel * 4),
                ORCH_OK);
            free(v);
        }
        char fm[PEFT_FP_MAX], fc[PEFT_FP_MAX];
        ck_assert_int_eq(peft_base_fingerprint(&H, mc, fm, err, sizeof err), 0);
        ck_assert_int_eq(peft_base_fingerprint(&cpu, cc, fc, err, sizeof err), 0);
        ck_assert_str_eq(fm, fc);
        /* the same seed: the same table and the same A */
        orch_lora_desc d;
        memset(&d, 0, sizeof d);
        d.struct_size = sizeof d;
        d.rank = 3;
        d.alpha = 6.0f;
        d.targets = ORCH_LORA_TARGET_ALL;
        d.seed = 42;
        uint32_t im = 0, ic = 0;
        ck_assert_int_eq(A->adapter_create(mc, &d, &im), ORCH_OK);
        ck_assert_msg(cpu.api->adapter_create(cc, &d, &ic) == ORCH_OK, "%s",
                      cpu.api->last_error(cc));
        peft_adapter pm, pc;
        ck_assert_msg(peft_adapter_from_engine(&H, mc, im, &m, &d, "b", fm, &pm, err,
                                               sizeof err) == 0,
                      "%s", err);
        ck_assert_msg(peft_adapter_from_engine(&cpu, cc, ic, &m, &d, "b", fc, &pc, err,
                                               sizeof err) == 0,
                      "cpu: %s", err);
        assert_equal(&pm, &pc);
        /* a trained-looking mock adapter, saved, loaded into the cpu engine */
        uint32_t id = adapter_in(mc, 3, ORCH_LORA_TARGET_ALL, 0.2f), back = 0;
        peft_adapter a, b, c;
        to_peft(mc, id, &m, 3, ORCH_LORA_TARGET_ALL, &a);
        char dir[64];
        test_tmpdir(dir, sizeof dir, "peft");
        ck_assert_int_eq(peft_adapter_save(dir, &a, err, sizeof err), 0);
        ck_assert_int_eq(peft_adapter_load(dir, &m, &b, err, sizeof err), 0);
        ck_assert_int_eq(peft_adapter_check_base(&b, dir, fc, err, sizeof err), 0);
        ck_assert_msg(peft_adapter_to_engine(&b, &cpu, cc, &back, err, sizeof err) == 0,
                      "%s", err);
        orch_lora_desc d2 = d;
        d2.alpha = 12.0f;
        ck_assert_int_eq(peft_adapter_from_engine(&cpu, cc, back, &m, &d2, "/base/x", fc,
                                                  &c, err, sizeof err),
                         0);
        assert_equal(&a, &c);
        test_rmdir(dir);
        peft_adapter_free(&pm);
        peft_adapter_free(&pc);
        peft_adapter_free(&a);
        peft_adapter_free(&b);
        peft_adapter_free(&c);
        A->context_destroy(mc);
        cpu.api->context_destroy(cc);
    }
    engine_unload(&cpu);
}
END_TEST

int main(void) {
    test_default_engine_path();
    unsetenv("ORCH_MOCK_FAULT");
    Suite *s = suite_create("peft_adapter");
    TCase *tc = tcase_create("peft");
    tcase_set_timeout(tc, 60);
    tcase_add_unchecked_fixture(tc, load_engine, unload_engine);
    tcase_add_test(tc, test_round_trip);
    tcase_add_test(tc, test_foreign_base_refused);
    tcase_add_test(tc, test_targets_and_ranks);
    tcase_add_test(tc, test_bad_configs);
    tcase_add_test(tc, test_f16_file);
    tcase_add_test(tc, test_disk_full_keeps_previous);
    tcase_add_test(tc, test_cpu_engine_agrees);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
