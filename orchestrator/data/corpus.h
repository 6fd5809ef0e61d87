/*
 * corpus.h - the default training corpus: the King James Bible from Debian's
 * bible-kjv package (`bible -l1000 'gen1:1-rev22:21'`), and its token shards.
 *
 * Thread rules: functions may run concurrently on different paths.
 * Errors: 0 / -1 with a one-line message in err; never print or exit.
 */
#ifndef ORCH_CORPUS_H
#define ORCH_CORPUS_H

#include <stddef.h>

#include "orchestrator/data/shard.h"

/* Write the whole KJV text to out_path atomically (fsio_atomic_*: temp file,
   fsync, rename) by running `bible -l1000 'gen1:1-rev22:21'`, and check it looks
   right (about 4.3 MB, starts with Genesis 1:1, ends with Revelation 22:21).
   If `bible` is missing the error says to run tools/setup.sh. */
int corpus_fetch_kjv(const char *out_path, char *err, size_t err_cap);

/* Default data directory into buf: $ORCH_DATA_DIR if set, else
   <dir of orch binary>/../data if that exists, else ./data. Returns 0/-1. */
int corpus_default_data_dir(char *buf, size_t cap, char *err, size_t err_cap);

/* Make sure the KJV shards for tokenizer `kind` exist under data_dir and
   return their globs (for the config's data.train / data.val):
     data_dir/kjv.txt               (corpus_fetch_kjv, if missing)
     data_dir/kjv-<kind>/train_*.bin, val_*.bin (shard_prepare_corpus with
                                     val_fraction 0.01, if missing or invalid)
   data_dir NULL = corpus_default_data_dir. Shards are prepared in a
   temporary directory that is renamed into place, so an interrupted run
   never leaves a half-written set. When everything is already there and
   valid, this only opens the datasets to check them (fast).
   *prepared is set to 1 when shards were (re)built, else 0 (may be NULL).
   progress may be NULL. Returns 0 / -1. */
int corpus_prepare_kjv(const char *data_dir, const char *kind, shard_progress_fn progress,
                       void *progress_user, char *train_glob, size_t train_glob_cap,
                       char *val_glob, size_t val_glob_cap, int *prepared, char *err,
                       size_t err_cap);

#endif
