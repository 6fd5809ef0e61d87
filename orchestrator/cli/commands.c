/*
 * commands.c - helpers shared by the cmd_*.c subcommand implementations.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "orchestrator/cli/commands.h"
#include "orchestrator/data/tokenizer.h"
#include "orchestrator/core/util.h"

int cmd_wants_help(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) break;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return 1;
    }
    return 0;
}

int cmd_open_tokenizer_read_stdin(int argc, char **argv, tokenizer **t,
                                  char **in, size_t *len) {
    const char *cmd = argv[0];
    const char *kind = "gpt2", *vocab_dir = NULL;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if ((v = util_flag_value("--tokenizer", argc, argv, &i))) {
            kind = v;
        } else if ((v = util_flag_value("--vocab-dir", argc, argv, &i))) {
            vocab_dir = v;
        } else {
            util_error("%s: unknown argument '%s' (see orch %s --help)", cmd,
                       argv[i], cmd);
            return ORCH_EXIT_USAGE;
        }
    }
    char err[1024];
    if (tokenizer_open(kind, vocab_dir, t, err, sizeof err) != 0) {
        util_error("%s: %s", cmd, err);
        return ORCH_EXIT_USAGE;
    }
    *in = util_read_stream(stdin, len);
    if (!*in) {
        util_error("%s: cannot read stdin: %s", cmd, strerror(errno));
        tokenizer_free(*t);
        *t = NULL;
        return ORCH_EXIT_FAILURE;
    }
    return ORCH_EXIT_OK;
}
