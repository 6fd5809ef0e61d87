/*
 * inference_model.c - a checkpoint opened for inference; see inference_model.h.
 */
#include "orchestrator/infer/inference_model.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "orchestrator/core/util.h"
#include "orchestrator/store/checkpoint.h"

/* key=word appended last to options (NULL: "+key=word", after the
 * config's) in buf; NULL with "FLAG: engine options too long". options may
 * point into buf. */
static const char *append_option(const char *flag, const char *key, const char *word,
                                 const char *options, char *buf, size_t cap, char *err,
                                 size_t err_cap) {
    char tmp[4096];
    int n = options
                ? snprintf(tmp, sizeof tmp, "%s%s%s=%s", options,
                           options[0] && strcmp(options, "+") != 0 ? "," : "", key, word)
                : snprintf(tmp, sizeof tmp, "+%s=%s", key, word);
    if (n < 0 || (size_t)n >= cap || (size_t)n >= sizeof tmp) {
        util_set_err(err, err_cap, "%s: engine options too long", flag);
        return NULL;
    }
    memcpy(buf, tmp, (size_t)n + 1);
    return buf;
}

const char *inference_model_quantize_options(const char *word, const char *options,
                                             char *buf, size_t cap, char *err,
                                             size_t err_cap) {
    if (!word) return options;
    if (strcmp(word, "int8") != 0 && strcmp(word, "fp32") != 0) {
        util_set_err(err, err_cap, "--quantize: unknown format '%s' (choices: %s)", word,
                     INFERENCE_QUANTIZE_CHOICES);
        return NULL;
    }
    /* Appended last: it overrides a weights= the options already carry. */
    return append_option("--quantize", "weights", word, options, buf, cap, err, err_cap);
}

const char *inference_model_kv_options(const char *word, const char *options, char *buf,
                                       size_t cap, char *err, size_t err_cap) {
    if (!word || strcmp(word, "auto") == 0) return options;
    if (strcmp(word, "f32") != 0 && strcmp(word, "bf16") != 0 &&
        strcmp(word, "int8") != 0) {
        util_set_err(err, err_cap, "--kv-cache-dtype: unknown type '%s' (choices: %s)",
                     word, INFERENCE_KV_DTYPE_CHOICES);
        return NULL;
    }
    return append_option("--kv-cache-dtype", "kv", word, options, buf, cap, err, err_cap);
}

void inference_model_close(inference_model *m) {
    if (!m) return;
    tokenizer_free(m->tok);
    if (m->ctx && m->engine.api) m->engine.api->context_destroy(m->ctx);
    engine_unload(&m->engine);
    config_free(m->cfg);
    memset(m, 0, sizeof *m);
}

int inference_model_open(const inference_model_opts *o, inference_model *m, char *warn,
                         size_t warn_cap, char *err, size_t err_cap) {
    memset(m, 0, sizeof *m);
    if (ckpt_find_latest(o->checkpoint, m->ckpt_dir, sizeof m->ckpt_dir, warn, warn_cap,
                         err, err_cap) != 0)
        return -1;
    if (ckpt_read_step(m->ckpt_dir, &m->step, err, err_cap) != 0) {
        /* A damaged meta.json is an error; none at all means step 0. */
        char meta[sizeof m->ckpt_dir + 16];
        snprintf(meta, sizeof meta, "%s/meta.json", m->ckpt_dir);
        if (access(meta, F_OK) == 0) goto fail;
        m->step = 0;
        if (err_cap) err[0] = '\0';
    }
    char tok[64];
    if (ckpt_read_config(m->ckpt_dir, &m->cfg, tok, sizeof tok, err, err_cap) != 0)
        goto fail;
    config_model_desc(m->cfg, &m->desc);
    const char *eng = o->engine ? o->engine : m->cfg->engine.name;
    if (!o->engine) {
        char origin[sizeof m->ckpt_dir + 16];
        snprintf(origin, sizeof origin, "%s/state.json", m->ckpt_dir);
        int trusted = (o->flags & INFERENCE_MODEL_TRUST_CONFIG_ENGINE) != 0;
        if (engine_check_config_name(eng, origin, trusted, err, err_cap) != 0) goto fail;
    }
    if (engine_load(eng, &m->engine, err, err_cap) != 0) goto fail;
    uint32_t threads = o->threads >= 0 ? (uint32_t)o->threads : m->cfg->engine.threads;
    const char *base = (o->engine && strcmp(o->engine, m->cfg->engine.name) != 0)
                           ? "" /* options belong to the config's engine */
                           : m->cfg->engine.options;
    const char *opts = o->options && o->options[0] != '+' ? o->options : base;
    char joined[4096];
    if (o->options && o->options[0] == '+') {
        if ((size_t)snprintf(joined, sizeof joined, "%s%s%s", base, base[0] ? "," : "",
                             o->options + 1) >= sizeof joined) {
            util_set_err(err, err_cap, "engine options too long");
            goto fail;
        }
        opts = joined;
    }
    if (engine_create_context(&m->engine, &m->desc, threads, m->cfg->train.seed,
                              opts[0] ? opts : NULL, &m->ctx, err, err_cap) != 0)
        goto fail;
    if (ckpt_load_weights(m->ckpt_dir, &m->engine, m->ctx, 0, err, err_cap) != 0)
        goto fail;
    if (o->flags & INFERENCE_MODEL_TOKENIZER) {
        /* An "hf" checkpoint carries its tokenizer.json (+ tokenizer_config.json,
           generation_config.json) in the checkpoint directory itself. */
        const char *vocab_dir = strcmp(tok, "hf") == 0 ? m->ckpt_dir : NULL;
        if (tokenizer_open(tok, vocab_dir, &m->tok, err, err_cap) != 0) goto fail;
        if (tokenizer_vocab_size(m->tok) > m->desc.vocab_size) {
            util_set_err(err, err_cap,
                         "tokenizer %s has %u tokens but the model's vocabulary "
                         "is %u",
                         tok, tokenizer_vocab_size(m->tok), m->desc.vocab_size);
            goto fail;
        }
    }
    return 0;
fail:
    inference_model_close(m);
    return -1;
}
