/*
 * cmd_finetune.c - `orch finetune`: the command line around finetune_run
 * (train/finetune.h): flags into the run's settings, --resume, signals and
 * the final summary.
 */
#include <math.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "orchestrator/cli/commands.h"
#include "orchestrator/cli/flags.h"
#include "orchestrator/core/util.h"
#include "orchestrator/train/finetune.h"

static const char usage_text[] =
    "usage: orch finetune --checkpoint BASE --data TRAIN.jsonl [--validation V.jsonl]\n"
    "                     --out DIR [options]\n"
    "       orch finetune --resume --out DIR [--stop-after N]\n"
    "\n"
    "Trains a LoRA adapter on the frozen weights of checkpoint BASE (a run or\n"
    "checkpoint directory) and writes it to DIR in Hugging Face PEFT's layout\n"
    "(adapter_model.safetensors, adapter_config.json). Each JSONL line is one\n"
    "example: {\"prompt\",\"completion\"} (loss on the completion),\n"
    "{\"messages\":[{\"role\",\"content\"},...]} (rendered with the model's chat\n"
    "template as orch serve renders it; loss on the assistant turns) or\n"
    "{\"text\"} (loss on every token).\n"
    "\n"
    "options:\n";

static const char footer_text[] =
    "\n"
    "targets: qkv, attn_out, mlp_up, mlp_down, all, or the model's module names\n"
    "(gpt2: c_attn, c_proj, c_fc; llama: q_proj,k_proj,v_proj, o_proj,\n"
    "gate_proj,up_proj, down_proj). On gpt2 attn_out and mlp_down go together\n"
    "(PEFT's module name c_proj covers both).\n"
    "\n"
    "--config keys: checkpoint, data, validation, engine, chat_template,\n"
    "epochs, max_steps, lr, min_lr, warmup_steps, schedule, rank, alpha,\n"
    "targets, batch, seq_len, grad_accum, seed, weight_decay, grad_clip,\n"
    "beta1, beta2, eps, eval_every, patience, checkpoint_every, keep.\n"
    "\n"
    "DIR also gets ckpt-NNNNNNNN/ checkpoints (adapter, AdamW moments, state),\n"
    "latest and metrics.jsonl; --resume continues bit for bit.\n"
    "The engine must have LoRA adapters (ABI 1.4, ORCH_CAP_LORA).\n"
    "\n"
    "signals: SIGINT, SIGTERM or SIGUSR1 finish the step, write a checkpoint\n"
    "and exit with status 3; a second SIGINT exits at once (130).\n"
    "exit status: 0 done (early-stopped, or --stop-after reached), 1 runtime\n"
    "failure, 2 bad usage, data, checkpoint or engine, 3 stopped by a signal.\n";

static volatile sig_atomic_t g_stop, g_sigints;

static void on_signal(int sig) {
    if (sig == SIGINT && ++g_sigints >= 2) {
        static const char m[] = "\norch: second SIGINT: exiting now\n";
        ssize_t w = write(STDERR_FILENO, m, sizeof m - 1);
        (void)w;
        _exit(130);
    }
    if (!g_stop) {
        static const char m[] = "\norch: signal received: finishing this step, then "
                                "writing a checkpoint\n";
        ssize_t w = write(STDERR_FILENO, m, sizeof m - 1);
        (void)w;
    }
    g_stop = 1;
}

static void set_signals(void (*h)(int)) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = h;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
}

#define N_SETTING_FLAGS 28

int cmd_finetune(int argc, char **argv) {
    finetune_opts o;
    memset(&o, 0, sizeof o);
    finetune_settings *s = &o.set;
    finetune_settings_default(s);
    const char *ckpt = NULL, *data = NULL, *val = NULL, *engine = NULL, *tmpl = NULL;
    const char *targets = NULL, *schedule = NULL, *config = NULL;
    uint64_t batch_tokens = 0;
    o.threads = -1;
    int seen[N_SETTING_FLAGS];
    memset(seen, 0, sizeof seen);
    const flag_spec flags[] = {
        { "--checkpoint", FLAG_STRING, &ckpt, "BASE",
          .help = "base model: run or checkpoint directory", .seen = &seen[0] },
        { "--data", FLAG_STRING, &data, "FILE", .help = "training examples (JSONL)",
          .seen = &seen[1] },
        { "--validation", FLAG_STRING, &val, "FILE",
          .help = "validation examples (JSONL): evaluation, early stop",
          .seen = &seen[2] },
        { "--engine", FLAG_STRING, &engine, "E",
          .help = "engine (default: the base config's)", .seen = &seen[3] },
        { "--chat-template", FLAG_STRING, &tmpl, "NAME|FILE",
          .help = "template of messages examples (default: the\nmodel's, as orch serve "
                  "picks it)",
          .seen = &seen[4] },
        { "--epochs", FLAG_DOUBLE, &s->epochs, "X",
          .help = "passes over the data (default 1)", .dmin = 0, .dmax = 1e6,
          .dmin_open = 1, .seen = &seen[5] },
        { "--max-steps", FLAG_U64, &s->max_steps, "N",
          .help = "optimizer steps (overrides --epochs)", .min = 1,
          .max = (int64_t)1 << 53, .seen = &seen[6] },
        { "--lr", FLAG_DOUBLE, &s->lr, "X", .help = "peak learning rate (default 2e-4)",
          .dmin = 0, .dmax = 10, .dmin_open = 1, .seen = &seen[7] },
        { "--min-lr", FLAG_DOUBLE, &s->min_lr, "X",
          .help = "floor of the decay (default 0)", .dmin = 0, .dmax = 10,
          .seen = &seen[8] },
        { "--warmup", FLAG_U64, &s->warmup_steps, "N", .help = "warmup steps (default 0)",
          .seen = &seen[9] },
        { "--schedule", FLAG_STRING, &schedule, "S",
          .help = "linear (default), cosine or constant", .seen = &seen[10] },
        { "--rank", FLAG_U32, &s->rank, "R", .help = "LoRA rank r (default 8)", .min = 1,
          .seen = &seen[11] },
        { "--alpha", FLAG_DOUBLE, &s->alpha, "A",
          .help = "LoRA alpha: the update is scaled by alpha/r\n(default 16)", .dmin = 0,
          .dmax = 1e9, .dmin_open = 1, .seen = &seen[12] },
        { "--targets", FLAG_STRING, &targets, "LIST",
          .help = "adapted matrices (default qkv; see below)", .seen = &seen[13] },
        { "--batch", FLAG_U32, &s->batch, "N", .help = "rows per micro-batch (default 8)",
          .min = 1, .max = 1 << 20, .seen = &seen[14] },
        { "--seq-len", FLAG_U32, &s->seq_len, "T",
          .help = "positions per row (default: the model's context)", .min = 1,
          .seen = &seen[15] },
        { "--batch-tokens", FLAG_U64, &batch_tokens, "N",
          .help = "micro-batch size in tokens: --batch N/seq-len", .min = 1,
          .seen = &seen[16] },
        { "--grad-accum", FLAG_U32, &s->grad_accum, "N",
          .help = "micro-batches per step (default 1)", .min = 1, .max = 1 << 20,
          .seen = &seen[17] },
        { "--seed", FLAG_U64, &s->seed, "S",
          .help = "adapter init and data order (default 0)", .seen = &seen[18] },
        { "--weight-decay", FLAG_DOUBLE, &s->weight_decay, "X",
          .help = "AdamW weight decay (default 0)", .dmin = 0, .dmax = 10,
          .seen = &seen[19] },
        { "--grad-clip", FLAG_DOUBLE, &s->grad_clip, "X",
          .help = "clip the adapter's gradient norm (default 1; 0 off)", .dmin = 0,
          .dmax = 1e30, .seen = &seen[20] },
        { "--eval-every", FLAG_U64, &s->eval_every, "N",
          .help = "evaluate every N steps (default once an epoch)", .min = 1,
          .seen = &seen[21] },
        { "--patience", FLAG_U32, &s->patience, "N",
          .help = "stop after N evaluations without a new best\n(default 0 = off)",
          .seen = &seen[22] },
        { "--checkpoint-every", FLAG_U64, &s->checkpoint_every, "N",
          .help = "checkpoint every N steps (default: at the end)", .min = 1,
          .seen = &seen[23] },
        { "--keep", FLAG_U32, &s->keep, "N", .help = "checkpoints kept (default 2)",
          .min = 1, .seen = &seen[24] },
        { "--threads", FLAG_INT, &o.threads, "N",
          .help = "engine threads (default: the base config's)", .min = 0, .max = 4096,
          .seen = &seen[25] },
        { "--config", FLAG_STRING, &config, "FILE",
          .help = "settings as a JSON object, e.g. {\"lr\": 1e-4,\n\"rank\": 16} "
                  "(keys below); flags given win",
          .seen = &seen[26] },
        { "--no-packing", FLAG_FALSE, &s->packing, NULL,
          .help = "one example per row (positions from 0, no\nattention across examples) "
                  "instead of packing\nexamples into rows",
          .seen = &seen[27] },
        { "--out", FLAG_STRING, &o.out_dir, "DIR",
          .help = "output directory (required)" },
        { "--resume", FLAG_TRUE, &o.resume, NULL,
          .help = "continue the run in --out DIR from its latest\ncheckpoint, with its "
                  "settings" },
        { "--stop-after", FLAG_U64, &o.stop_after, "N",
          .help = "stop after N steps of this invocation with a\ncheckpoint (exit 0)",
          .min = 1 },
        { "--trust-config-engine", FLAG_TRUE, &o.trust_config_engine, NULL,
          .help = "load the base config's engine even when it is a\nlibrary path" },
        { NULL },
    };
    const flags_cmd cmd = {
        .name = "finetune", .usage = usage_text, .flags = flags, .footer = footer_text
    };
    int rc;
    if (flags_parse(&cmd, argc, argv, &rc)) return rc;
    if (!o.out_dir) {
        util_error("finetune: --out DIR is required (see orch finetune --help)");
        return ORCH_EXIT_USAGE;
    }
    if (o.resume) {
        for (size_t i = 0; i < N_SETTING_FLAGS; i++)
            if (seen[i]) {
                util_error("finetune: --resume continues with the settings saved in %s; "
                           "%s cannot be given with it",
                           o.out_dir, flags[i].name);
                return ORCH_EXIT_USAGE;
            }
    } else {
        if (config) { /* the file's settings, then the flags given */
            finetune_settings f;
            finetune_settings_default(&f);
            char cerr[4200];
            if (finetune_settings_from_file(config, &f, cerr, sizeof cerr) != 0) {
                util_error("finetune: --config %s", cerr);
                return ORCH_EXIT_USAGE;
            }
            static const struct {
                int flag;
                size_t off, size;
            } num[] = {
#define F(i, f) { i, offsetof(finetune_settings, f), sizeof(((finetune_settings *)0)->f) }
                F(5, epochs),       F(6, max_steps),
                F(7, lr),           F(8, min_lr),
                F(9, warmup_steps), F(11, rank),
                F(12, alpha),       F(14, batch),
                F(15, seq_len),     F(17, grad_accum),
                F(18, seed),        F(19, weight_decay),
                F(20, grad_clip),   F(21, eval_every),
                F(22, patience),    F(23, checkpoint_every),
                F(24, keep),        F(27, packing),
#undef F
            };
            for (size_t i = 0; i < sizeof num / sizeof num[0]; i++)
                if (seen[num[i].flag])
                    memcpy((char *)&f + num[i].off, (const char *)s + num[i].off,
                           num[i].size);
            *s = f;
        }
        struct {
            const char *v;
            char *dst;
            size_t cap;
            const char *name;
        } strs[] = {
            { ckpt, s->checkpoint, sizeof s->checkpoint, "--checkpoint" },
            { data, s->data, sizeof s->data, "--data" },
            { val, s->validation, sizeof s->validation, "--validation" },
            { engine, s->engine, sizeof s->engine, "--engine" },
            { tmpl, s->chat_template, sizeof s->chat_template, "--chat-template" },
            { targets, s->targets, sizeof s->targets, "--targets" },
            { schedule, s->schedule, sizeof s->schedule, "--schedule" },
        };
        for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++) {
            if (!strs[i].v) continue;
            if (strlen(strs[i].v) >= strs[i].cap) {
                util_error("finetune: %s: value too long", strs[i].name);
                return ORCH_EXIT_USAGE;
            }
            snprintf(strs[i].dst, strs[i].cap, "%s", strs[i].v);
        }
        if (!s->checkpoint[0] || !s->data[0]) {
            util_error(
                "finetune: --checkpoint BASE and --data FILE are required (see orch "
                "finetune --help)");
            return ORCH_EXIT_USAGE;
        }
        if (batch_tokens) {
            if (seen[14]) {
                util_error("finetune: give --batch or --batch-tokens, not both");
                return ORCH_EXIT_USAGE;
            }
            if (!s->seq_len) {
                util_error("finetune: --batch-tokens needs --seq-len");
                return ORCH_EXIT_USAGE;
            }
            uint64_t b = batch_tokens / s->seq_len;
            s->batch = b ? (uint32_t)(b < (1u << 20) ? b : (1u << 20)) : 1;
        }
    }
    o.out = stdout;
    o.live =
        isatty(STDOUT_FILENO) && !(getenv("TERM") && strcmp(getenv("TERM"), "dumb") == 0);
    o.stop_flag = &g_stop;
    g_stop = g_sigints = 0;
    set_signals(on_signal);
    train_result res;
    int kind = TRAIN_ERR_RUNTIME;
    char err[8192];
    int frc = finetune_run(&o, &res, &kind, err, sizeof err);
    set_signals(SIG_DFL);
    if (frc != 0) {
        util_error("finetune: %s", err);
        return kind == TRAIN_ERR_INPUT ? ORCH_EXIT_USAGE : ORCH_EXIT_FAILURE;
    }
    if (res.outcome == TRAIN_ALREADY_DONE) {
        printf("finetune: %s is already at step %llu of %llu: nothing to do\n", o.out_dir,
               (unsigned long long)res.step, (unsigned long long)res.total_steps);
        return ORCH_EXIT_OK;
    }
    printf("%s at step %llu/%llu (this run %.1fs, %.0f tok/s)\n",
           res.outcome == TRAIN_COMPLETED       ? "done"
           : res.outcome == TRAIN_EARLY_STOPPED ? "stopped early"
           : res.outcome == TRAIN_PAUSED        ? "paused"
                                                : "interrupted",
           (unsigned long long)res.step, (unsigned long long)res.total_steps, res.run_s,
           res.tokens_per_s);
    printf("  train loss %.4f", res.last_loss);
    if (isfinite(res.last_val_loss)) printf(" | val loss %.4f", res.last_val_loss);
    if (isfinite(res.best_val_loss))
        printf(" | best val %.4f at step %llu", res.best_val_loss,
               (unsigned long long)res.best_val_step);
    printf("\n  adapter %s (PEFT), checkpoint %s\n", o.out_dir, res.checkpoint);
    if (res.outcome == TRAIN_PAUSED || res.outcome == TRAIN_INTERRUPTED)
        printf("  continue with: orch finetune --resume --out %s\n", o.out_dir);
    fflush(stdout);
    return res.outcome == TRAIN_INTERRUPTED ? TRAIN_EXIT_INTERRUPTED : ORCH_EXIT_OK;
}
