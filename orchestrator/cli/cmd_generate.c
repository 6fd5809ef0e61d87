/*
 * cmd_generate.c - `orch generate`: load a checkpoint and print a continuation
 * of a prompt as it is produced (flushed per token, never splitting a UTF-8
 * character), sampling with the sampler (temperature, top-k, top-p, seed).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "orchestrator/cli/commands.h"
#include "orchestrator/cli/flags.h"
#include "orchestrator/infer/generate.h"
#include "orchestrator/store/peft_adapter.h"
#include "orchestrator/infer/inference_model.h"
#include "orchestrator/serve/sampler.h"
#include "orchestrator/core/util.h"
#include "orchestrator/core/utf8.h"

static const char usage_text[] =
    "usage: orch generate --checkpoint DIR --prompt TEXT [options]\n"
    "\n"
    "Print the prompt followed by a generated continuation, token by token.\n"
    "DIR is a run directory (its newest complete checkpoint is used) or a\n"
    "checkpoint directory.\n"
    "\noptions:\n";

static const char footer_text[] =
    "\nGeneration stops after --max-tokens or at the end-of-text token\n"
    "(gpt2). When the context fills up, the last half of it is kept and\n"
    "recomputed (a context shift) and generation goes on, unless\n"
    "--no-context-shift is given.\n"
    "exit status: 0 ok, 1 runtime failure, 2 bad usage/checkpoint/engine\n";

typedef struct gen_args {
    const char *ckpt, *prompt, *prompt_file, *engine, *quantize, *lora, *kv_dtype;
    const char *options; /* engine options for --quantize (NULL: the config's) */
    char options_buf[96];
    uint64_t max_tokens, seed;
    int have_seed, echo, threads, context_shift, trust_engine;
    sampler_params sp;
} gen_args;

/* The PEFT adapter in dir into m's engine (checked against the base's
 * fingerprint); *id receives the engine's adapter id. */
static int load_lora(inference_model *m, const char *dir, uint32_t *id, char *err,
                     size_t err_cap) {
    if (!(m->engine.api->capabilities & ORCH_CAP_LORA)) {
        util_set_err(err, err_cap, "engine '%s' (ABI %u.%u) has no LoRA adapters",
                     m->engine.api->name, m->engine.api->abi_major,
                     m->engine.api->abi_minor);
        return -1;
    }
    char fp[PEFT_FP_MAX];
    peft_adapter a;
    memset(&a, 0, sizeof a);
    int rc = -1;
    if (peft_adapter_load(dir, &m->desc, &a, err, err_cap) == 0 &&
        peft_base_fingerprint(&m->engine, m->ctx, fp, err, err_cap) == 0 &&
        peft_adapter_check_base(&a, dir, fp, err, err_cap) == 0 &&
        peft_adapter_to_engine(&a, &m->engine, m->ctx, id, err, err_cap) == 0)
        rc = 0;
    peft_adapter_free(&a);
    return rc;
}

/* Flags into a; 0, or 1 with the exit status in *st. */
static int parse_args(int argc, char **argv, gen_args *a, int *st) {
    memset(a, 0, sizeof *a);
    a->max_tokens = 200;
    a->echo = 1;
    a->threads = -1;
    a->context_shift = 1;
    a->sp = sampler_params_default();
    const flag_spec flags[] = {
        { "--checkpoint", FLAG_STRING, &a->ckpt, "DIR",
          .help = "run or checkpoint directory (required)" },
        { "--prompt", FLAG_STRING, &a->prompt, "TEXT",
          .help = "prompt text (or --prompt-file FILE; '-' = stdin)" },
        { "--prompt-file", FLAG_STRING, &a->prompt_file, "FILE", .help = NULL },
        { "--max-tokens", FLAG_U64, &a->max_tokens, "N",
          .help = "tokens to generate (default 200)" },
        { "--temperature", FLAG_FLOAT, &a->sp.temperature, "T",
          .help = "0 = greedy (default 1.0)" },
        { "--top-k", FLAG_U32, &a->sp.top_k, "K",
          .help = "keep the K most likely tokens (0 = off, default)" },
        { "--top-p", FLAG_FLOAT, &a->sp.top_p, "P",
          .help = "nucleus sampling, 0 < P <= 1 (default 1 = off)" },
        { "--seed", FLAG_U64, &a->seed, "S", .help = "sampling seed (default: random)",
          .seen = &a->have_seed },
        { "--no-echo", FLAG_FALSE, &a->echo, NULL,
          .help = "print only the generated text, not the prompt" },
        { "--no-context-shift", FLAG_FALSE, &a->context_shift, NULL,
          .help = "stop when the model's context is full instead\n"
                  "of keeping its last half and recomputing" },
        { "--engine", FLAG_STRING, &a->engine, "E",
          .help = "engine (default: the checkpoint config's)" },
        { "--trust-config-engine", FLAG_TRUE, &a->trust_engine, NULL,
          .help = "load the checkpoint config's engine even when it\n"
                  "is a library file or path (default: only mock,\n"
                  "cpu and cuda)" },
        { "--threads", FLAG_INT, &a->threads, "N",
          .help = "engine threads (default: the config's)", .min = 0, .max = 4096 },
        { "--lora", FLAG_STRING, &a->lora, "DIR",
          .help = "generate through the LoRA adapter in DIR (a PEFT\n"
                  "directory made for this checkpoint)" },
        { "--quantize", FLAG_STRING, &a->quantize, "FMT",
          .help = "weights as FMT for inference: int8 (engine option\n"
                  "weights=int8: int8 blocks of 32, fp32 scales) or\n"
                  "fp32 (default)" },
        { "--kv-cache-dtype", FLAG_STRING, &a->kv_dtype, "T",
          .help = "KV cache storage: auto (default: the engine's;\n"
                  "cpu: bf16 with --quantize int8, else f32), f32,\n"
                  "bf16 or int8 (int8 values, one fp32 scale per\n"
                  "head vector; engine option kv=T)" },
        { NULL },
    };
    const flags_cmd cmd = {
        .name = "generate", .usage = usage_text, .flags = flags, .footer = footer_text
    };
    if (flags_parse(&cmd, argc, argv, st)) return 1;
    *st = ORCH_EXIT_USAGE;
    char perr[256];
    if (sampler_params_check(&a->sp, perr, sizeof perr) != 0) {
        util_error("generate: %s", perr);
        return 1;
    }
    if (!a->ckpt) {
        util_error("generate: --checkpoint DIR is required (see orch generate "
                   "--help)");
        return 1;
    }
    a->options = inference_model_quantize_options(
        a->quantize, NULL, a->options_buf, sizeof a->options_buf, perr, sizeof perr);
    if (a->quantize && !a->options) {
        util_error("generate: %s", perr);
        return 1;
    }
    perr[0] = '\0';
    const char *kv = inference_model_kv_options(a->kv_dtype, a->options, a->options_buf,
                                                sizeof a->options_buf, perr, sizeof perr);
    if (!kv && perr[0]) {
        util_error("generate: %s", perr);
        return 1;
    }
    a->options = kv;
    if (a->prompt && a->prompt_file) {
        util_error("generate: give --prompt or --prompt-file, not both");
        return 1;
    }
    return 0;
}

/* Print the bytes of pending that form whole UTF-8 characters; keep the rest. */
static void emit(char *pending, size_t *plen, int final) {
    size_t ready = final ? *plen : utf8_complete_prefix_len(pending, *plen);
    if (ready) {
        fwrite(pending, 1, ready, stdout);
        memmove(pending, pending + ready, *plen - ready);
        *plen -= ready;
    }
    fflush(stdout);
}

/* What has been printed: bytes held back until they form whole UTF-8
 * characters, and whether the output ends a line. */
typedef struct out_state {
    char pending[64];
    size_t plen;
    int last_newline; /* nothing printed yet, or the last byte was '\n' */
    int printed;      /* something was printed (a final '\n' is owed) */
} out_state;

static void out_token(out_state *o, const char *bytes, size_t n) {
    for (size_t b = 0; b < n; b++) {
        if (o->plen == sizeof o->pending) emit(o->pending, &o->plen, 1);
        o->pending[o->plen++] = bytes[b];
    }
    if (n) {
        o->last_newline = bytes[n - 1] == '\n';
        o->printed = 1;
    }
    emit(o->pending, &o->plen, 0);
}

/* Flush what is held back and end the line if something is on it. */
static void out_finish(out_state *o) {
    emit(o->pending, &o->plen, 1);
    if (o->printed && !o->last_newline) fputc('\n', stdout);
    fflush(stdout);
    o->printed = 0;
}

/* The prompt as token ids (*ids: free), never empty: an empty prompt starts
 * from the end-of-text token. Returns 0, or the exit status after an error. */
static int prompt_ids(const inference_model *m, const char *prompt, size_t len,
                      int32_t **ids, size_t *n) {
    char err[2048];
    if (tokenizer_encode(m->tok, prompt, len, ids, n, err, sizeof err) != 0) {
        util_error("generate: prompt: %s", err);
        return ORCH_EXIT_USAGE;
    }
    if (tokenizer_prepend_bos(m->tok, ids, n) < 0) { /* tokenizer_config's BOS */
        util_error("generate: out of memory");
        return ORCH_EXIT_FAILURE;
    }
    if (*n == 0) {
        int32_t eot = tokenizer_eot(m->tok);
        if (eot < 0) {
            util_error("generate: empty prompt (the %s tokenizer has no "
                       "end-of-text token to start from)",
                       tokenizer_name(m->tok));
            return ORCH_EXIT_USAGE;
        }
        int32_t *one = malloc(sizeof *one);
        if (!one) {
            util_error("generate: out of memory");
            return ORCH_EXIT_FAILURE;
        }
        one[0] = eot;
        free(*ids);
        *ids = one;
        *n = 1;
    }
    if (*n >= m->desc.context) {
        util_error("generate: the prompt is %zu tokens but the model's context "
                   "is %u (at most %u prompt tokens)",
                   *n, m->desc.context, m->desc.context - 1);
        return ORCH_EXIT_USAGE;
    }
    return 0;
}

/* The decode loop: sample, print, feed, up to a->max_tokens tokens or the
 * end-of-text token. history holds the n_hist tokens in the context (room
 * for the whole context), for a context shift. Returns the exit status. */
static int decode(const gen_args *a, const inference_model *m, generate_session *s,
                  int32_t *history, size_t n_hist, out_state *o) {
    char err[2048];
    sampler_ws *ws = sampler_ws_create(m->desc.vocab_size);
    if (!ws) {
        util_error("generate: out of memory");
        return ORCH_EXIT_FAILURE;
    }
    uint64_t seed =
        a->have_seed ? a->seed : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    sampler_rng rng;
    sampler_rng_seed(&rng, seed);
    int rc = ORCH_EXIT_OK;
    for (uint64_t k = 0; k < a->max_tokens; k++) {
        int32_t tok = sampler_sample(&a->sp, generate_logits(s), m->desc.vocab_size, NULL,
                                     &rng, ws);
        if (tok < 0) {
            util_error("generate: the sampler found no token to draw (non-finite "
                       "logits?)");
            rc = ORCH_EXIT_FAILURE;
            break;
        }
        if (tokenizer_is_eos(m->tok, tok)) break; /* any of the model's EOS ids */
        const char *bytes = "";
        size_t blen = 0;
        if (tokenizer_token_bytes(m->tok, tok, &bytes, &blen) != 0)
            blen = 0; /* an id the model knows but the tokenizer does not */
        out_token(o, bytes, blen);
        if (k + 1 == a->max_tokens) break;
        int rc_feed;
        if (generate_position(s) >= generate_context(s)) {
            /* The next token does not fit in the context. */
            if (!a->context_shift) {
                out_finish(o);
                util_warn("generate: stopped at the model's context of %u tokens",
                          generate_context(s));
                break;
            }
            /* Context shift: keep the newest half (ending with tok) and
             * recompute its KV from position 0. */
            size_t keep = m->desc.context / 2;
            if (keep < 1) keep = 1;
            memmove(history, history + n_hist - (keep - 1), sizeof *history * (keep - 1));
            history[keep - 1] = tok;
            n_hist = keep;
            generate_reset(s);
            rc_feed = generate_feed(s, history, n_hist, err, sizeof err);
        } else {
            history[n_hist++] = tok;
            rc_feed = generate_feed(s, &tok, 1, err, sizeof err);
        }
        if (rc_feed != 0) {
            emit(o->pending, &o->plen, 1);
            if (!o->last_newline) fputc('\n', stdout);
            o->printed = 0;
            util_error("generate: %s", err);
            rc = ORCH_EXIT_FAILURE;
            break;
        }
    }
    sampler_ws_free(ws);
    return rc;
}

int cmd_generate(int argc, char **argv) {
    gen_args a;
    int rc;
    if (parse_args(argc, argv, &a, &rc)) return rc;
    char *prompt_buf = NULL;
    const char *prompt = a.prompt;
    size_t prompt_len = prompt ? strlen(prompt) : 0;
    if (a.prompt_file) {
        prompt_buf = util_read_file(a.prompt_file, &prompt_len);
        if (!prompt_buf) {
            util_error("generate: cannot read prompt file '%s': %s", a.prompt_file,
                       strerror(errno));
            return ORCH_EXIT_USAGE;
        }
        prompt = prompt_buf;
    }
    if (!prompt) prompt = "";

    char err[2048], warn[2048];
    inference_model m;
    inference_model_opts mo = { a.ckpt, a.engine, a.threads, a.options,
                                INFERENCE_MODEL_TOKENIZER |
                                    (a.trust_engine ? INFERENCE_MODEL_TRUST_CONFIG_ENGINE
                                                    : 0) };
    if (inference_model_open(&mo, &m, warn, sizeof warn, err, sizeof err) != 0) {
        util_error("generate: %s", err);
        free(prompt_buf);
        return ORCH_EXIT_USAGE;
    }
    if (warn[0]) util_warn("%s", warn);
    generate_session *s = NULL;
    int32_t *ids = NULL, *history = NULL;
    size_t n_ids = 0;
    rc = prompt_ids(&m, prompt, prompt_len, &ids, &n_ids);
    if (rc != 0) goto out;
    rc = ORCH_EXIT_USAGE;
    if (generate_session_create(&m.engine, m.ctx, m.desc.vocab_size, m.desc.context, 0,
                                &s, err, sizeof err) != 0) {
        util_error("generate: %s", err);
        goto out;
    }
    if (a.lora) {
        uint32_t adapter = 0;
        if (load_lora(&m, a.lora, &adapter, err, sizeof err) != 0) {
            util_error("generate: --lora %s: %s", a.lora, err);
            goto out;
        }
        generate_set_adapter(s, adapter);
    }
    if (a.echo) {
        fwrite(prompt, 1, prompt_len, stdout);
        fflush(stdout);
    }
    rc = ORCH_EXIT_FAILURE;
    if (generate_feed(s, ids, n_ids, err, sizeof err) != 0) {
        util_error("generate: %s", err);
        goto out;
    }
    out_state o;
    memset(&o, 0, sizeof o);
    o.last_newline = prompt_len == 0 || prompt[prompt_len - 1] == '\n' || !a.echo;
    o.printed = a.echo && prompt_len > 0;
    /* The tokens in the context window, for a context shift. */
    history = malloc(sizeof *history * m.desc.context);
    if (!history) {
        util_error("generate: out of memory");
        goto out;
    }
    memcpy(history, ids, sizeof *ids * n_ids);
    rc = decode(&a, &m, s, history, n_ids, &o);
    if (rc == ORCH_EXIT_OK) out_finish(&o);
out:
    free(history);
    generate_session_free(s);
    inference_model_close(&m);
    free(ids);
    free(prompt_buf);
    return rc;
}
