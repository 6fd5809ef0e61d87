/*
 * out_dir.h - an output directory (--out DIR) that a failing command takes
 * back: before the command may create DIR (and missing parents, mkdir -p),
 * out_dir_guard_begin notes which of them do not exist yet; after a failure
 * out_dir_guard_undo removes those again, deepest first, while they are
 * empty. So a command whose inputs turn out to be bad leaves no empty
 * directory behind, and nothing that existed before (or holds a file) is
 * ever removed.
 *
 * Memory: the guard is a plain struct (no allocation).
 * Threads: no shared state.
 * Errors: none reported: a directory that cannot be removed (not empty, not
 * ours any more) is left as it is.
 */
#ifndef ORCH_OUT_DIR_H
#define ORCH_OUT_DIR_H

#include <limits.h>
#include <stddef.h>

typedef struct out_dir_guard {
    char path[PATH_MAX];
    size_t cut[32]; /* lengths of path's prefixes that did not exist, deepest first */
    size_t n;
} out_dir_guard;

/* Note the missing directories of dir (dir itself and its parents). */
void out_dir_guard_begin(out_dir_guard *g, const char *dir);

/* rmdir what was missing at begin, deepest first, stopping at the first
 * directory that is not empty. */
void out_dir_guard_undo(out_dir_guard *g);

#endif
