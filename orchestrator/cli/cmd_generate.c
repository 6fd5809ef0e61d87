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
#include "orchestrator/infer/generate.h"
#include "orchestrator/serve/sampler.h"
#include "orchestrator/core/util.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: orch generate --checkpoint DIR --prompt TEXT [options]\n"
            "\n"
            "Print the prompt followed by a generated continuation, token by token.\n"
            "DIR is a run directory (its newest complete checkpoint is used) or a\n"
            "checkpoint directory.\n"
            "\noptions:\n"
            "  --checkpoint DIR     run or checkpoint directory (required)\n"
            "  --prompt TEXT        prompt text (or --prompt-file FILE; '-' = stdin)\n"
            "  --max-tokens N       tokens to generate (default 200)\n"
            "  --temperature T      0 = greedy (default 1.0)\n"
            "  --top-k K            keep the K most likely tokens (0 = off, default)\n"
            "  --top-p P            nucleus sampling, 0 < P <= 1 (default 1 = off)\n"
            "  --seed S             sampling seed (default: random)\n"
            "  --no-echo            print only the generated text, not the prompt\n"
            "  --no-context-shift   stop when the model's context is full instead\n"
            "                       of keeping its last half and recomputing\n"
            "  --engine E           engine (default: the checkpoint config's)\n"
            "  --threads N          engine threads (default: the config's)\n"
            "\nGeneration stops after --max-tokens or at the end-of-text token\n"
            "(gpt2). When the context fills up, the last half of it is kept and\n"
            "recomputed (a context shift) and generation goes on, unless\n"
            "--no-context-shift is given.\n"
            "exit status: 0 ok, 1 runtime failure, 2 bad usage/checkpoint/engine\n");
}


/* Print the bytes of pending that form whole UTF-8 characters; keep the rest. */
static void emit(char *pending, size_t *plen, int final) {
    size_t ready = final ? *plen : generate_utf8_ready(pending, *plen);
    if (ready) {
        fwrite(pending, 1, ready, stdout);
        memmove(pending, pending + ready, *plen - ready);
        *plen -= ready;
    }
    fflush(stdout);
}

int cmd_generate(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) {
        usage(stdout);
        return ORCH_EXIT_OK;
    }
    const char *ckpt = NULL, *prompt = NULL, *prompt_file = NULL,
               *engine = NULL;
    uint64_t max_tokens = 200, seed = 0;
    int have_seed = 0, echo = 1, threads = -1, context_shift = 1;
    sampler_params sp = sampler_params_default();
    for (int i = 1; i < argc; i++) {
        const char *v;
        double d;
        uint64_t u;
        if ((v = util_flag_value("--checkpoint", argc, argv, &i))) {
            ckpt = v;
        } else if ((v = util_flag_value("--prompt-file", argc, argv, &i))) {
            prompt_file = v;
        } else if ((v = util_flag_value("--prompt", argc, argv, &i))) {
            prompt = v;
        } else if ((v = util_flag_value("--max-tokens", argc, argv, &i))) {
            if (util_parse_u64(v, &max_tokens) != 0) {
                util_error("generate: --max-tokens: '%s' is not a non-negative "
                           "integer",
                           v);
                return ORCH_EXIT_USAGE;
            }
        } else if ((v = util_flag_value("--temperature", argc, argv, &i))) {
            if (util_parse_double(v, &d) != 0) {
                util_error("generate: --temperature: '%s' is not a number", v);
                return ORCH_EXIT_USAGE;
            }
            sp.temperature = (float)d;
        } else if ((v = util_flag_value("--top-k", argc, argv, &i))) {
            if (util_parse_u64(v, &u) != 0 || u > UINT32_MAX) {
                util_error("generate: --top-k: '%s' is not a non-negative "
                           "integer",
                           v);
                return ORCH_EXIT_USAGE;
            }
            sp.top_k = (uint32_t)u;
        } else if ((v = util_flag_value("--top-p", argc, argv, &i))) {
            if (util_parse_double(v, &d) != 0) {
                util_error("generate: --top-p: '%s' is not a number", v);
                return ORCH_EXIT_USAGE;
            }
            sp.top_p = (float)d;
        } else if ((v = util_flag_value("--seed", argc, argv, &i))) {
            if (util_parse_u64(v, &seed) != 0) {
                util_error("generate: --seed: '%s' is not a non-negative "
                           "integer",
                           v);
                return ORCH_EXIT_USAGE;
            }
            have_seed = 1;
        } else if ((v = util_flag_value("--engine", argc, argv, &i))) {
            engine = v;
        } else if ((v = util_flag_value("--threads", argc, argv, &i))) {
            if (util_parse_u64(v, &u) != 0 || u > 4096) {
                util_error("generate: --threads: '%s' is not a thread count", v);
                return ORCH_EXIT_USAGE;
            }
            threads = (int)u;
        } else if (strcmp(argv[i], "--no-echo") == 0) {
            echo = 0;
        } else if (strcmp(argv[i], "--no-context-shift") == 0) {
            context_shift = 0;
        } else {
            util_error("generate: unknown or incomplete option '%s' (see orch "
                       "generate --help)",
                       argv[i]);
            return ORCH_EXIT_USAGE;
        }
    }
    char perr[256];
    if (sampler_params_check(&sp, perr, sizeof perr) != 0) {
        util_error("generate: %s", perr);
        return ORCH_EXIT_USAGE;
    }
    if (!ckpt) {
        util_error("generate: --checkpoint DIR is required (see orch generate "
                   "--help)");
        return ORCH_EXIT_USAGE;
    }
    if (prompt && prompt_file) {
        util_error("generate: give --prompt or --prompt-file, not both");
        return ORCH_EXIT_USAGE;
    }
    char *prompt_buf = NULL;
    size_t prompt_len = prompt ? strlen(prompt) : 0;
    if (prompt_file) {
        prompt_buf = util_read_file(prompt_file, &prompt_len);
        if (!prompt_buf) {
            util_error("generate: cannot read prompt file '%s': %s", prompt_file,
                       strerror(errno));
            return ORCH_EXIT_USAGE;
        }
        prompt = prompt_buf;
    }
    if (!prompt) prompt = "";

    int rc = ORCH_EXIT_USAGE;
    char err[2048], warn[2048];
    inference_model m;
    generate_session *s = NULL;
    sampler_ws *ws = NULL;
    int32_t *ids = NULL, *history = NULL;
    size_t n_ids = 0;
    inference_model_opts mo = {ckpt, engine, threads, NULL, 1};
    if (inference_model_open(&mo, &m, warn, sizeof warn, err, sizeof err) != 0) {
        util_error("generate: %s", err);
        free(prompt_buf);
        return ORCH_EXIT_USAGE;
    }
    if (warn[0]) util_warn("%s", warn);
    if (tokenizer_encode(m.tok, prompt, prompt_len, &ids, &n_ids, err,
                         sizeof err) != 0) {
        util_error("generate: prompt: %s", err);
        goto out;
    }
    int32_t eot = tokenizer_eot(m.tok);
    if (n_ids == 0) {
        if (eot < 0) {
            util_error("generate: empty prompt (the %s tokenizer has no "
                       "end-of-text token to start from)",
                       tokenizer_name(m.tok));
            goto out;
        }
        int32_t *one = malloc(sizeof *one);
        if (!one) goto oom;
        one[0] = eot;
        free(ids);
        ids = one;
        n_ids = 1;
    }
    if (n_ids >= m.desc.context) {
        util_error("generate: the prompt is %zu tokens but the model's context "
                   "is %u (at most %u prompt tokens)",
                   n_ids, m.desc.context, m.desc.context - 1);
        goto out;
    }
    ws = sampler_ws_create(m.desc.vocab_size);
    if (!ws) goto oom;
    if (generate_session_create(&m.engine, m.ctx, m.desc.vocab_size,
                                m.desc.context, 0, &s, err, sizeof err) != 0) {
        util_error("generate: %s", err);
        goto out;
    }
    if (!have_seed) seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    sampler_rng rng;
    sampler_rng_seed(&rng, seed);

    if (echo) {
        fwrite(prompt, 1, prompt_len, stdout);
        fflush(stdout);
    }
    rc = ORCH_EXIT_FAILURE;
    if (generate_feed(s, ids, n_ids, err, sizeof err) != 0) {
        util_error("generate: %s", err);
        goto out;
    }
    char pending[64];
    size_t plen = 0;
    int last_newline = prompt_len == 0 || prompt[prompt_len - 1] == '\n' || !echo;
    int printed = echo && prompt_len > 0;
    /* The tokens in the context window, for a context shift. */
    history = malloc(sizeof *history * m.desc.context);
    if (!history) goto oom;
    memcpy(history, ids, sizeof *ids * n_ids);
    size_t n_hist = n_ids;
    for (uint64_t k = 0; k < max_tokens; k++) {
        int32_t tok = sampler_sample(&sp, generate_logits(s), m.desc.vocab_size,
                                     NULL, &rng, ws);
        if (tok < 0) {
            util_error("generate: the sampler found no token to draw (non-finite "
                       "logits?)");
            goto out;
        }
        if (tok == eot) break;
        const char *bytes;
        size_t blen = 0;
        if (tokenizer_token_bytes(m.tok, tok, &bytes, &blen) != 0) {
            /* An id the model knows but the tokenizer does not (padding). */
            bytes = "";
            blen = 0;
        }
        for (size_t b = 0; b < blen; b++) {
            if (plen == sizeof pending) emit(pending, &plen, 1);
            pending[plen++] = bytes[b];
        }
        if (blen) {
            last_newline = bytes[blen - 1] == '\n';
            printed = 1;
        }
        emit(pending, &plen, 0);
        if (k + 1 == max_tokens) break;
        int rc_feed;
        if (generate_position(s) >= generate_context(s)) {
            /* The next token does not fit in the context. */
            if (!context_shift) {
                emit(pending, &plen, 1);
                if (printed && !last_newline) fputc('\n', stdout);
                fflush(stdout);
                printed = 0;
                util_warn("generate: stopped at the model's context of %u "
                          "tokens",
                          generate_context(s));
                break;
            }
            /* Context shift: keep the newest half (ending with tok) and
             * recompute its KV from position 0. */
            size_t keep = m.desc.context / 2;
            if (keep < 1) keep = 1;
            memmove(history, history + n_hist - (keep - 1),
                    sizeof *history * (keep - 1));
            history[keep - 1] = tok;
            n_hist = keep;
            generate_reset(s);
            rc_feed = generate_feed(s, history, n_hist, err, sizeof err);
        } else {
            history[n_hist++] = tok;
            rc_feed = generate_feed(s, &tok, 1, err, sizeof err);
        }
        if (rc_feed != 0) {
            emit(pending, &plen, 1);
            if (!last_newline) fputc('\n', stdout);
            util_error("generate: %s", err);
            goto out;
        }
    }
    emit(pending, &plen, 1);
    if (printed && !last_newline) fputc('\n', stdout);
    fflush(stdout);
    rc = ORCH_EXIT_OK;
    goto out;
oom:
    util_error("generate: out of memory");
    rc = ORCH_EXIT_FAILURE;
out:
    free(history);
    sampler_ws_free(ws);
    generate_session_free(s);
    inference_model_close(&m);
    free(ids);
    free(prompt_buf);
    return rc;
}
