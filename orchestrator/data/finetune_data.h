/*
 * finetune_data.h - the training files of `orch finetune`: JSONL, one
 * example per line, in one of three shapes (a file may mix them):
 *   {"prompt": "...", "completion": "..."}   loss on the completion only
 *   {"messages": [{"role": "...", "content": "..."[, "weight": 0|1]}, ...]}
 *                    rendered by the chat template the server uses for the
 *                    model (chat_template.h); loss on the assistant turns
 *                    only (each turn's content and the text that ends it,
 *                    e.g. "<|im_end|>\n"), except those with "weight": 0
 *                    (OpenAI's fine-tuning format)
 *   {"text": "..."}                          loss on every token
 * Blank lines are skipped. Any other key, an empty prompt-less completion
 * or text, a role the template does not take, tool calls, a messages list
 * without an assistant turn to learn from, or invalid JSON is an error
 * "FILE:LINE: what is wrong".
 *
 * Tokens: each example is the checkpoint tokenizer's ids of its pieces,
 * tokenized piece by piece (prompt, completion; for messages the text
 * between assistant turns and each turn), so a mask boundary is always a
 * token boundary; the tokenizer's BOS is put in front as generation does
 * (tokenizer_prepend_bos: not when the template already wrote it); prompt/
 * completion and text examples end with the end-of-text token (with loss)
 * when the tokenizer has one. Messages: the prefix up to assistant turn i is
 * the template's rendering of messages[0..i) with the generation prompt;
 * the turn ends where the rendering of messages[0..i] ends; both must be
 * prefixes of the whole conversation's rendering (else the template cannot
 * be split there: an error naming the message).
 *
 * Packing: an example of L tokens gives L-1 (input, target) positions; its
 * target at a position is the next token when that token carries loss, else
 * -1. Examples are packed whole, in file order, into rows of seq_len
 * positions (the next example starts a new row when it does not fit; the
 * rest of a row is padding: token 0, target -1). Packed examples share a
 * row: the later ones attend to the earlier ones and start at the position
 * where the earlier ones end (as llm.c and TRL's packing do). With
 * one_per_row every example gets a row of its own (positions from 0, no
 * attention across examples, as Hugging Face trains without packing), at
 * the cost of the padding. An example longer than
 * seq_len positions keeps its first seq_len (counted in n_truncated); an
 * example left with no target is dropped (n_dropped). A file that yields no
 * target at all is an error.
 *
 * Memory: an ft_dataset owns its arrays (ft_dataset_free); ft_encode_line's
 * arrays are malloc'd for the caller. Threads: reentrant.
 * Errors: 0 / -1 with one line in err; nothing is printed.
 */
#ifndef ORCH_FINETUNE_DATA_H
#define ORCH_FINETUNE_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "orchestrator/data/tokenizer.h"
#include "orchestrator/serve/chat_template.h"

typedef struct ft_data_opts {
    const tokenizer *tok;
    const chat_template *tmpl; /* for messages lines; NULL: they are refused
                                  with tmpl_error */
    const char *tmpl_error;    /* why there is no template (may be NULL) */
    uint32_t seq_len;          /* positions per row (>= 1) */
    uint32_t vocab_size;       /* the model's: every id must be below it */
    int one_per_row;           /* 1: no packing (one example per row) */
} ft_data_opts;

typedef struct ft_dataset {
    uint32_t seq_len;
    uint64_t n_rows;
    int32_t *tokens;  /* [n_rows * seq_len] */
    int32_t *targets; /* [n_rows * seq_len], -1 = no loss */
    uint64_t n_examples, n_truncated, n_dropped;
    uint64_t n_targets; /* positions with a target */
} ft_dataset;

/* One line (len bytes, not NUL-terminated) as token ids and a loss mask
 * (mask[i] = 1: ids[i] is learned); *ids and *mask malloc'd, *n tokens.
 * where is "FILE:LINE" for messages. Returns 0, 1 for a blank line (nothing
 * returned) or -1. */
int ft_encode_line(const char *line, size_t len, const char *where, const ft_data_opts *o,
                   int32_t **ids, uint8_t **mask, size_t *n, char *err, size_t err_cap);

/* Read and pack PATH. */
int ft_data_load(const char *path, const ft_data_opts *o, ft_dataset *out, char *err,
                 size_t err_cap);

/* The same over text already in memory (name stands for PATH in errors). */
int ft_data_parse(const char *text, size_t len, const char *name, const ft_data_opts *o,
                  ft_dataset *out, char *err, size_t err_cap);

void ft_dataset_free(ft_dataset *d); /* safe on a zeroed struct */

#endif
