/*
 * cmd_tokenize.c - `orch tokenize --tokenizer gpt2|byte`: raw bytes on stdin
 * (every byte, newlines and NULs included) -> token ids on stdout, separated
 * by spaces, ending with one newline.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/cli/commands.h"
#include "orchestrator/data/tokenizer.h"
#include "orchestrator/core/util.h"

int cmd_tokenize(int argc, char **argv) {
    tokenizer *t;
    size_t len;
    char *text;
    int st;
    if (cmd_open_tokenizer_read_stdin(
            argc, argv,
            "usage: orch tokenize [--tokenizer gpt2|byte|hf:DIR] [--vocab-dir DIR]\n"
            "                     [--tokenizer-dir DIR] < text\n\n"
            "Reads raw bytes on stdin (all of them: newlines, CR, NUL, invalid UTF-8)\n"
            "and prints their token ids separated by spaces, then a newline.\n",
            "gpt2: \"<|endoftext|>\" in the input is ordinary text. hf: added and\n"
            "special tokens in the input (\"<|im_start|>\", \"</s>\") become their ids,\n"
            "as Hugging Face's encode does; no BOS is added. Inverse: orch detokenize.\n",
            &t, &text, &len, &st))
        return st;
    char err[1024];
    int32_t *ids;
    size_t n;
    int rc = tokenizer_encode(t, text, len, &ids, &n, err, sizeof err);
    free(text);
    tokenizer_free(t);
    if (rc != 0) {
        util_error("tokenize: %s", err);
        return ORCH_EXIT_FAILURE;
    }
    static char out[1 << 16];
    size_t o = 0;
    int bad = 0;
    for (size_t i = 0; i < n && !bad; i++) {
        if (o + 16 > sizeof out) {
            bad = fwrite(out, 1, o, stdout) != o;
            o = 0;
        }
        o += (size_t)snprintf(out + o, sizeof out - o, i ? " %d" : "%d", ids[i]);
    }
    free(ids);
    out[o++] = '\n';
    if (!bad) bad = fwrite(out, 1, o, stdout) != o;
    if (fflush(stdout) != 0 || bad) {
        util_error("tokenize: cannot write stdout: %s", strerror(errno));
        return ORCH_EXIT_FAILURE;
    }
    return ORCH_EXIT_OK;
}
