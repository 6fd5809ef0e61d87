/*
 * commands.c - helpers shared by the cmd_*.c subcommand implementations.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "orchestrator/cli/commands.h"
#include "orchestrator/cli/flags.h"
#include "orchestrator/data/tokenizer.h"
#include "orchestrator/core/util.h"

int cmd_open_tokenizer_read_stdin(int argc, char **argv, const char *usage,
                                  const char *footer, tokenizer **t, char **in,
                                  size_t *len, int *exit_status) {
    const char *cmd = argv[0];
    const char *kind = "gpt2", *vocab_dir = NULL, *tok_dir = NULL;
    const flag_spec flags[] = {
        { "--tokenizer", FLAG_STRING, &kind, "T",
          .help = "gpt2 (default; GPT-2 byte-level BPE), byte (id = byte), or\n"
                  "hf:DIR (a Hugging Face tokenizer.json in DIR)" },
        { "--vocab-dir", FLAG_STRING, &vocab_dir, "D",
          .help = "directory with encoder.json and vocab.bpe (gpt2), or with\n"
                  "tokenizer.json (hf)\n"
                  "(default: $ORCH_DATA_DIR/gpt2, <orch>/../data/gpt2, ./data/gpt2)" },
        { "--tokenizer-dir", FLAG_STRING, &tok_dir, "DIR",
          .help = "a Hugging Face tokenizer: DIR/tokenizer.json (with\n"
                  "tokenizer_config.json, generation_config.json when present),\n"
                  "e.g. an HF model or an orch checkpoint directory; the same as\n"
                  "--tokenizer hf:DIR" },
        { NULL },
    };
    const flags_cmd fc = {
        .name = cmd, .usage = usage, .flags = flags, .footer = footer
    };
    *t = NULL;
    *in = NULL;
    if (flags_parse(&fc, argc, argv, exit_status)) return 1;
    char err[1024];
    if (strncmp(kind, "hf:", 3) == 0) {
        vocab_dir = kind + 3;
        kind = "hf";
    }
    if (tok_dir) {
        kind = "hf";
        vocab_dir = tok_dir;
    }
    if (tokenizer_open(kind, vocab_dir, t, err, sizeof err) != 0) {
        util_error("%s: %s", cmd, err);
        *exit_status = ORCH_EXIT_USAGE;
        return 1;
    }
    *in = util_read_stream(stdin, len);
    if (!*in) {
        util_error("%s: cannot read stdin: %s", cmd, strerror(errno));
        tokenizer_free(*t);
        *t = NULL;
        *exit_status = ORCH_EXIT_FAILURE;
        return 1;
    }
    return 0;
}
