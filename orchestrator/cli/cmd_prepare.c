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
            total ? 100.0 * (double)done / (double)total : 100.0,
            (double)done / 1e6, (double)total / 1e6, mbs);
    fflush(stderr);
    p->shown = 1;
}

static void usage(void) {
    printf("usage: orch prepare --tokenizer byte|gpt2 (--input FILE | --kjv) "
           "--out DIR\n"
           "                    [--val-fraction F] [--shard-tokens N] "
           "[--vocab-dir DIR]\n\n"
           "Tokenizes a text corpus into versioned token shards for training:\n"
           "DIR/train_000.bin, train_001.bin, ... and DIR/val_000.bin, ...\n"
           "  --tokenizer T      byte (256 ids) or gpt2 (GPT-2 BPE, 50257 ids)\n"
           "  --input FILE       the corpus (any bytes)\n"
           "  --kjv              use the King James Bible instead (written to\n"
           "                     DIR/kjv.txt by `bible`, package bible-kjv)\n"
           "  --out DIR          output directory (created if missing; stale\n"
           "                     train_NNN.bin/val_NNN.bin are replaced)\n"
           "  --val-fraction F   last fraction of the corpus kept for "
           "validation,\n"
           "                     split at a line start (default 0.01; 0 = "
           "none)\n"
           "  --shard-tokens N   at most N tokens per shard (default "
           "50000000)\n"
           "  --vocab-dir DIR    GPT-2 encoder.json + vocab.bpe (default: "
           "search\n"
           "                     $ORCH_DATA_DIR/gpt2, <orch>/../data/gpt2, "
           "./data/gpt2)\n"
           "Use the shards in a config: \"data\": {\"tokenizer\": T, "
           "\"train\": \"DIR/train_*.bin\",\n"
           "\"val\": \"DIR/val_*.bin\"}.\n");
}

int cmd_prepare(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) {
        usage();
        return ORCH_EXIT_OK;
    }
    const char *kind = NULL, *input = NULL, *out = NULL, *vocab_dir = NULL;
    double val_fraction = 0.01;
    uint64_t shard_tokens = 0;
    int kjv = 0;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if ((v = util_flag_value("--tokenizer", argc, argv, &i))) {
            kind = v;
        } else if ((v = util_flag_value("--input", argc, argv, &i))) {
            input = v;
        } else if ((v = util_flag_value("--out", argc, argv, &i))) {
            out = v;
        } else if ((v = util_flag_value("--vocab-dir", argc, argv, &i))) {
            vocab_dir = v;
        } else if ((v = util_flag_value("--val-fraction", argc, argv, &i))) {
            if (util_parse_double(v, &val_fraction) != 0 ||
                !(val_fraction >= 0 && val_fraction <= 0.5)) {
                util_error("prepare: --val-fraction '%s' must be a number in "
                           "[0, 0.5]",
                           v);
                return ORCH_EXIT_USAGE;
            }
        } else if ((v = util_flag_value("--shard-tokens", argc, argv, &i))) {
            if (util_parse_u64(v, &shard_tokens) != 0 || shard_tokens == 0 ||
                shard_tokens > ((uint64_t)1 << 40)) {
                util_error("prepare: --shard-tokens '%s' must be a positive "
                           "integer",
                           v);
                return ORCH_EXIT_USAGE;
            }
        } else if (strcmp(argv[i], "--kjv") == 0) {
            kjv = 1;
        } else {
            util_error("prepare: unknown argument '%s' (see orch prepare --help)",
                       argv[i]);
            return ORCH_EXIT_USAGE;
        }
    }
    if (!kind || !tokenizer_kind_valid(kind)) {
        util_error("prepare: %s (expected --tokenizer byte or --tokenizer gpt2)",
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
    if (kjv) {
        if (snprintf(kjv_path, sizeof kjv_path, "%s/kjv.txt", out) >=
            (int)sizeof kjv_path) {
            util_error("prepare: --out path too long");
            return ORCH_EXIT_USAGE;
        }
        /* shard_prepare_corpus creates DIR; the text goes there first. */
        char cmd_dir[PATH_MAX];
        snprintf(cmd_dir, sizeof cmd_dir, "%s", out);
        for (char *s = cmd_dir + 1;; s++) { /* mkdir -p */
            if (*s != '/' && *s != '\0') continue;
            char c = *s;
            *s = '\0';
            (void)mkdir(cmd_dir, 0755);
            *s = c;
            if (!c) break;
        }
        if (corpus_fetch_kjv(kjv_path, err, sizeof err) != 0) {
            util_error("prepare: %s", err);
            return ORCH_EXIT_FAILURE;
        }
        input = kjv_path;
    }
    struct stat st;
    if (stat(input, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0) {
        util_error("prepare: --input %s is %s", input,
                   stat(input, &st) != 0 ? "missing or unreadable"
                   : !S_ISREG(st.st_mode) ? "not a regular file"
                                          : "empty");
        return ORCH_EXIT_USAGE;
    }
    tokenizer *tok;
    if (tokenizer_open(kind, vocab_dir, &tok, err, sizeof err) != 0) {
        util_error("prepare: %s", err);
        return ORCH_EXIT_USAGE;
    }
    progress_state ps = {util_now(), 0, 0};
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
    int rc = shard_prepare_corpus(&o, &r, err, sizeof err);
    tokenizer_free(tok);
    if (ps.shown) fprintf(stderr, "\n");
    if (rc != 0) {
        util_error("prepare: %s", err);
        return ORCH_EXIT_FAILURE;
    }
    printf("prepare: %s: %.2f MB -> train %llu tokens (%u shard%s), val %llu "
           "tokens (%u shard%s), tokenizer %s (vocab %u), %.2f s (%.1f MB/s) "
           "-> %s\n",
           input, (double)r.input_bytes / 1e6, (unsigned long long)r.train_tokens,
           r.train_shards, r.train_shards == 1 ? "" : "s",
           (unsigned long long)r.val_tokens, r.val_shards,
           r.val_shards == 1 ? "" : "s", kind, r.vocab_size, r.seconds,
           r.seconds > 0 ? (double)r.input_bytes / 1e6 / r.seconds : 0.0, out);
    return ORCH_EXIT_OK;
}
