/*
 * test_fixture.h - reading the PyTorch golden fixtures of tools/torch_reference.py
 * (the .safetensors files of tests/fixtures/) in the engine suites: tensors by name and
 * dtype, metadata values, the LLaMA model description a fixture states, and
 * loading its param.<name> tensors into an engine context through the table.
 *
 * Header-only (static inline), for Check suites that include tests/test_util.h
 * and link orchestrator/store/safetensors. Every failure is a Check assertion
 * naming the fixture, the tensor or the key. Pointers returned point into the
 * open file (valid until safetensors_close); nothing here allocates.
 */
#ifndef ORCH_TEST_FIXTURE_H
#define ORCH_TEST_FIXTURE_H

#include "orchestrator/store/safetensors.h"
#include "tests/test_util.h"

/* Open the fixture at path (relative to the repository root, where
 * run_tests.sh runs the suites). */
static inline safetensors_file *test_fixture_open(const char *path) {
    safetensors_file *f = NULL;
    char err[1024];
    ck_assert_msg(safetensors_open(path, &f, err, sizeof err) == 0,
                  "%s (run from the repository root)", err);
    return f;
}

/* Data of tensor `name` of the given dtype; *numel receives its size. */
static inline const void *test_fixture_get(const safetensors_file *f, const char *name,
                                           int dtype, size_t *numel) {
    const safetensors_tensor *t = safetensors_find(f, name);
    ck_assert_msg(t != NULL, "fixture lacks tensor %s", name);
    ck_assert_msg(t->dtype == dtype, "tensor %s is not %s", name,
                  safetensors_dtype_name(dtype));
    *numel = (size_t)t->numel;
    return t->data;
}

static inline const float *test_fixture_f32(const safetensors_file *f, const char *name,
                                            size_t *numel) {
    return (const float *)test_fixture_get(f, name, SAFETENSORS_F32, numel);
}

/* A metadata value (must be present), as text and as a number. */
static inline const char *test_fixture_meta_str(const safetensors_file *f,
                                                const char *key) {
    const char *v = safetensors_metadata(f, key);
    ck_assert_msg(v != NULL, "fixture metadata lacks %s", key);
    return v;
}

static inline double test_fixture_meta(const safetensors_file *f, const char *key) {
    return atof(test_fixture_meta_str(f, key));
}

/* The LLaMA model of a fixture's metadata (arch, sizes, kv_heads, eps,
 * rope_theta, untied_head, rope_scaling none|linear|llama3 and its factors). */
static inline orch_model_desc test_fixture_llama_model(const safetensors_file *f) {
#define FX_META(k) test_fixture_meta(f, k)
    orch_model_desc m =
        test_model_desc((uint32_t)FX_META("vocab_size"), (uint32_t)FX_META("context"),
                        (uint32_t)FX_META("layers"), (uint32_t)FX_META("heads"),
                        (uint32_t)FX_META("width"));
    ck_assert_str_eq(test_fixture_meta_str(f, "arch"), "llama");
    m.arch = ORCH_ARCH_LLAMA;
    m.kv_heads = (uint32_t)FX_META("kv_heads");
    m.mlp_width = (uint32_t)FX_META("mlp_width");
    m.layernorm_eps = (float)FX_META("layernorm_eps");
    m.rope_theta = (float)FX_META("rope_theta");
    if (FX_META("untied_head") != 0.0) m.flags |= ORCH_MODEL_FLAG_UNTIED_HEAD;
    const char *sc = test_fixture_meta_str(f, "rope_scaling");
    if (strcmp(sc, "linear") == 0) {
        m.rope_scaling = ORCH_ROPE_LINEAR;
        m.rope_factor = (float)FX_META("rope_factor");
    } else if (strcmp(sc, "llama3") == 0) {
        m.rope_scaling = ORCH_ROPE_LLAMA3;
        m.rope_factor = (float)FX_META("rope_factor");
        m.rope_low_freq_factor = (float)FX_META("rope_low_freq_factor");
        m.rope_high_freq_factor = (float)FX_META("rope_high_freq_factor");
        m.rope_original_context = (uint32_t)FX_META("rope_original_context");
    } else {
        ck_assert_str_eq(sc, "none");
    }
#undef FX_META
    return m;
}

/* The model of a torch_reference.py fixture: gpt2 from its metadata, or
 * test_fixture_llama_model for arch "llama". */
static inline orch_model_desc test_fixture_model(const safetensors_file *f) {
    if (strcmp(test_fixture_meta_str(f, "arch"), "llama") == 0)
        return test_fixture_llama_model(f);
    orch_model_desc m = test_model_desc((uint32_t)test_fixture_meta(f, "vocab_size"),
                                        (uint32_t)test_fixture_meta(f, "context"),
                                        (uint32_t)test_fixture_meta(f, "layers"),
                                        (uint32_t)test_fixture_meta(f, "heads"),
                                        (uint32_t)test_fixture_meta(f, "width"));
    m.mlp_width = (uint32_t)test_fixture_meta(f, "mlp_width");
    m.layernorm_eps = (float)test_fixture_meta(f, "layernorm_eps");
    return m;
}

/* Write param.<name> of the fixture into every tensor of ctx's parameter
 * table (sizes must match). */
static inline void test_load_fixture_params(const orch_engine_api *api,
                                            orch_engine_ctx *ctx,
                                            const safetensors_file *f) {
    test_table t;
    test_read_table(api, ctx, ORCH_TENSOR_PARAM, &t);
    for (uint32_t i = 0; i < t.n; i++) {
        const orch_tensor_info *ti = &t.info[i];
        char key[128];
        snprintf(key, sizeof key, "param.%s", ti->name);
        size_t numel;
        const float *src = test_fixture_f32(f, key, &numel);
        ck_assert_msg(numel == ti->numel, "%s: fixture %zu vs engine %llu", ti->name,
                      numel, (unsigned long long)ti->numel);
        ck_assert_int_eq(
            api->tensor_write(ctx, ORCH_TENSOR_PARAM, i, src, numel * sizeof(float)),
            ORCH_OK);
    }
}

#endif
