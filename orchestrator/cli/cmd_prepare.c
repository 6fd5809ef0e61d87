/*
 * cmd_prepare.c - `orch prepare`: tokenize a text corpus into train and
 * validation token shards (shard_prepare_corpus), with a progress line on a
 * terminal and a one-line summary.
 */
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "orchestrator/cli/commands.h"
#include "orchestrator/cli/flags.h"
#include "orchestrator/cli/out_dir.h"
#include "orchestrator/core/fsio.h"
#include "orchestrator/data/corpus.h"
#include "orchestrator/data/shard.h"
#include "orchestrator/data/tokenizer.h"
#include "orchestrator/core/util.h"

typedef struct progress_state {
    double t0;
    double last;
    int shown;
} progress_state;

static void show_progress(void *user, uint64_t done, uint64_t total) {
    progress_state *p = user;
    double now = util_now();
    if (done < total && now - p->last < 0.1) return;
    p->last = now;
    double el = now - p->t0;
    double mbs = el > 0 ? (double)done / 1e6 / el : 0;
    fprintf(stderr, "\rprepare: %5.1f%%  %.1f / %.1f MB  %.1f MB/s ",
            total ? 100.0 * (double)done / (double)total : 100.0, (double)done / 1e6,
            (double)total / 1e6, mbs);
    fflush(stderr);
    p->shown = 1;
}

/* The corpus must be a non-empty regular file; 0, or -1 after printing. */
static int check_input(const char *input) {
    struct stat st;
    if (stat(input, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) return 0;
    util_error("prepare: --input %s is %s", input,
               stat(input, &st) != 0  ? "missing or unreadable"
               : !S_ISREG(st.st_mode) ? "not a regular file"
                                      : "empty");
    return -1;
}

int cmd_prepare(int argc, char **argv) {
    const char *kind = NULL, *input = NULL, *out = NULL, *vocab_dir = NULL;
    double val_fraction = 0.01;
    uint64_t shard_tokens = 0;
    int kjv = 0;
    const flag_spec flags[] = {
        { "--tokenizer", FLAG_STRING, &kind, "T",
          .help = "byte (256 ids), gpt2 (GPT-2 BPE, 50257 ids) or hf:DIR\n"
                  "(a Hugging Face tokenizer.json in DIR)" },
        { "--input", FLAG_STRING, &input, "FILE", .help = "the corpus (any bytes)" },
        { "--kjv", FLAG_TRUE, &kjv, NULL,
          .help = "use the King James Bible instead (written to\n"
                  "DIR/kjv.txt by `bible`, package bible-kjv)" },
        { "--out", FLAG_STRING, &out, "DIR",
          .help = "output directory (created if missing; stale\n"
                  "train_NNN.bin/val_NNN.bin are replaced)" },
        { "--val-fraction", FLAG_DOUBLE, &val_fraction, "F",
          .help = "last fraction of the corpus kept for validation,\n"
                  "split at a line start (default 0.01; 0 = none)",
          .dmin = 0, .dmax = 0.5 },
        { "--shard-tokens", FLAG_U64, &shard_tokens, "N",
          .help = "at most N tokens per shard (default 50000000)", .min = 1,
          .max = (int64_t)1 << 40 },
        { "--vocab-dir", FLAG_STRING, &vocab_dir, "DIR",
          .help = "GPT-2 encoder.json + vocab.bpe (default: search\n"
                  "$ORCH_DATA_DIR/gpt2, <orch>/../data/gpt2, ./data/gpt2);\n"
                  "for --tokenizer hf the directory with tokenizer.json" },
        { NULL },
    };
    const flags_cmd cmd = {
        .name = "prepare",
        .usage = "usage: orch prepare --tokenizer byte|gpt2 (--input FILE | --kjv) "
                 "--out DIR\n"
                 "                    [--val-fraction F] [--shard-tokens N] "
                 "[--vocab-dir DIR]\n\n"
                 "Tokenizes a text corpus into versioned token shards for training:\n"
                 "DIR/train_000.bin, train_001.bin, ... and DIR/val_000.bin, ...\n",
        .flags = flags,
        .footer = "Use the shards in a config: \"data\": {\"tokenizer\": T, "
                  "\"train\": \"DIR/train_*.bin\",\n"
                  "\"val\": \"DIR/val_*.bin\"}.\n",
    };
    int rc;
    if (flags_parse(&cmd, argc, argv, &rc)) return rc;
    if (kind && strncmp(kind, "hf:", 3) == 0) {
        vocab_dir = kind + 3;
        kind = "hf";
    }
    if (!kind || !tokenizer_kind_valid(kind)) {
        util_error("prepare: %s (expected --tokenizer byte, gpt2 or hf:DIR)",
                   kind ? "unknown tokenizer" : "missing --tokenizer");
        return ORCH_EXIT_USAGE;
    }
    if (!out) {
        util_error("prepare: missing --out DIR");
        return ORCH_EXIT_USAGE;
    }
    if (!!input == kjv) {
        util_error("prepare: give exactly one of --input FILE and --kjv");
        return ORCH_EXIT_USAGE;
    }
    char err[2048];
    char kjv_path[PATH_MAX];
    if (kjv &&
        snprintf(kjv_path, sizeof kjv_path, "%s/kjv.txt", out) >= (int)sizeof kjv_path) {
        util_error("prepare: --out path too long");
        return ORCH_EXIT_USAGE;
    }
    if (!kjv && check_input(input) != 0) return ORCH_EXIT_USAGE;
    /* Everything that can be checked is checked before DIR is created. */
    tokenizer *tok;
    if (tokenizer_open(kind, vocab_dir, &tok, err, sizeof err) != 0) {
        util_error("prepare: %s", err);
        return ORCH_EXIT_USAGE;
    }
    out_dir_guard od; /* a failure below takes a new DIR back */
    out_dir_guard_begin(&od, out);
    if (kjv) {
        /* shard_prepare_corpus creates DIR; the text goes there first. */
        rc = ORCH_EXIT_FAILURE;
        if (fsio_mkdir_p(out, err, sizeof err) != 0 ||
            corpus_fetch_kjv(kjv_path, err, sizeof err) != 0) {
            util_error("prepare: %s", err);
            goto fail;
        }
        input = kjv_path;
        rc = ORCH_EXIT_USAGE;
        if (check_input(input) != 0) goto fail;
    }
    progress_state ps = { util_now(), 0, 0 };
    int tty = isatty(STDERR_FILENO);
    shard_prepare_opts o = {
        .tokenizer = kind,
        .tok = tok,
        .input = input,
        .out_dir = out,
        .val_fraction = val_fraction,
        .shard_tokens = shard_tokens,
        .progress = tty ? show_progress : NULL,
        .progress_user = &ps,
    };
    shard_prepare_result r;
    rc = shard_prepare_corpus(&o, &r, err, sizeof err);
    if (ps.shown) fprintf(stderr, "\n");
    if (rc != 0) {
        util_error("prepare: %s", err);
        rc = ORCH_EXIT_FAILURE;
        goto fail;
    }
    tokenizer_free(tok);
    printf("prepare: %s: %.2f MB -> train %llu tokens (%u shard%s), val %llu "
           "tokens (%u shard%s), tokenizer %s (vocab %u), %.2f s (%.1f MB/s) "
           "-> %s\n",
           input, (double)r.input_bytes / 1e6, (unsigned long long)r.train_tokens,
           r.train_shards, r.train_shards == 1 ? "" : "s",
           (unsigned long long)r.val_tokens, r.val_shards, r.val_shards == 1 ? "" : "s",
           kind, r.vocab_size, r.seconds,
           r.seconds > 0 ? (double)r.input_bytes / 1e6 / r.seconds : 0.0, out);
    return ORCH_EXIT_OK;
fail:
    tokenizer_free(tok);
    out_dir_guard_undo(&od);
    return rc;
}
