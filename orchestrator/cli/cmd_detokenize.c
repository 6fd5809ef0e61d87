/*
 * cmd_detokenize.c - `orch detokenize --tokenizer gpt2|byte`: token ids on
 * stdin (decimal, separated by any whitespace) -> the exact bytes on stdout.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/cli/commands.h"
#include "orchestrator/data/tokenizer.h"
#include "orchestrator/core/util.h"

static int is_space(char c) {
    return c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

int cmd_detokenize(int argc, char **argv) {
    tokenizer *t;
    size_t len;
    char *in;
    int st;
    if (cmd_open_tokenizer_read_stdin(
            argc, argv,
            "usage: orch detokenize [--tokenizer gpt2|byte|hf:DIR] [--vocab-dir DIR]\n"
            "                       [--tokenizer-dir DIR] < ids\n\n"
            "Reads token ids (decimal, separated by spaces or newlines) on stdin and\n"
            "writes the exact bytes they stand for (no newline added). An id that is\n"
            "not a number or not in the vocabulary is an error (exit 2).\n",
            NULL, &t, &in, &len, &st))
        return st;
    char err[1024];
    /* Every id takes at least 2 bytes of input with its separator. */
    int32_t *ids = malloc((len / 2 + 1) * sizeof *ids);
    size_t n = 0;
    int rc = ORCH_EXIT_OK;
    if (!ids) {
        util_error("detokenize: out of memory");
        rc = ORCH_EXIT_FAILURE;
    }
    uint32_t vocab = tokenizer_vocab_size(t);
    for (size_t i = 0; i < len && rc == ORCH_EXIT_OK;) {
        if (is_space(in[i])) {
            i++;
            continue;
        }
        size_t s = i;
        while (i < len && !is_space(in[i])) i++;
        size_t l = i - s;
        int digits = l > 0 && strspn(in + s, "0123456789") >= l;
        uint64_t v = 0;
        for (size_t k = 0; digits && k < l && v < vocab; k++)
            v = v * 10 + (uint64_t)(in[s + k] - '0');
        if (!digits || v >= vocab) {
            util_error("detokenize: token %zu ('%.*s') is not a %s id (expected "
                       "a number in 0..%u)",
                       n + 1, (int)(l > 40 ? 40 : l), in + s, tokenizer_name(t),
                       vocab - 1);
            rc = ORCH_EXIT_USAGE;
            break;
        }
        ids[n++] = (int32_t)v;
    }
    free(in);
    char *text = NULL;
    size_t tl = 0;
    if (rc == ORCH_EXIT_OK &&
        tokenizer_decode(t, ids, n, &text, &tl, err, sizeof err) != 0) {
        util_error("detokenize: %s", err);
        rc = ORCH_EXIT_USAGE;
    }
    free(ids);
    tokenizer_free(t);
    if (rc == ORCH_EXIT_OK &&
        (fwrite(text, 1, tl, stdout) != tl || fflush(stdout) != 0)) {
        util_error("detokenize: cannot write stdout: %s", strerror(errno));
        rc = ORCH_EXIT_FAILURE;
    }
    free(text);
    return rc;
}
