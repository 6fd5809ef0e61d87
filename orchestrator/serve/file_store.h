/*
 * file_store.h - the uploaded files of `orch serve` (OpenAI's /v1/files),
 * kept in the server's state directory so they survive a restart:
 *   STATE/files/ID.data   the bytes as uploaded
 *   STATE/files/ID.json   {"id","object":"file","bytes","created_at",
 *                          "filename","purpose","status":"processed"}
 * An upload streams into a temp file beside its target (fsio_atomic_*), is
 * validated (for purpose "fine-tune": file_store_validate_jsonl), and only
 * then becomes visible, data first and metadata last, so a crash or a full
 * disk mid-upload leaves no half file behind; leftovers of a crashed process
 * (temp files, data without metadata) are removed at open.
 * Ids are "file-" and 24 hex digits from the kernel's random source.
 * Threads: every function taking a file_store is thread-safe; an upload
 * belongs to the one thread that writes it. Memory: the store owns its
 * index; functions that return JSON append to the caller's strbuf.
 * Errors: -1 (or -2, see below) with a one-line message (err) and nothing
 * changed.
 */
#ifndef ORCH_FILE_STORE_H
#define ORCH_FILE_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "orchestrator/core/strbuf.h"

#define FILE_STORE_ID_MAX      32
#define FILE_STORE_NAME_MAX    256
#define FILE_STORE_DEFAULT_MAX (512ull << 20) /* bytes per file (OpenAI's limit) */
#define FILE_STORE_PURPOSE_MAX 32

typedef struct file_store file_store;
typedef struct file_upload file_upload;

/* One stored file's metadata. */
typedef struct file_info {
    char id[FILE_STORE_ID_MAX];
    char filename[FILE_STORE_NAME_MAX];
    char purpose[FILE_STORE_PURPOSE_MAX];
    uint64_t bytes;
    int64_t created_at; /* Unix seconds */
} file_info;

/* Open (creating STATE/files when missing) the store under state_dir and
 * read the metadata of every file there. max_bytes bounds one file (0 =
 * FILE_STORE_DEFAULT_MAX). The caller owns the store (file_store_close). */
file_store *file_store_open(const char *state_dir, uint64_t max_bytes, char *err,
                            size_t err_cap);
void file_store_close(file_store *fs);

/* Start an upload (a temp file in STATE/files). */
file_upload *file_store_upload_begin(file_store *fs, char *err, size_t err_cap);
/* Append bytes; past max_bytes it fails (and keeps failing) with a message
 * naming the limit and returns -1; a storage failure returns -2. */
int file_upload_write(file_upload *u, const void *data, size_t n, char *err,
                      size_t err_cap);
/* Bytes written so far. */
uint64_t file_upload_bytes(const file_upload *u);
/* Validate (for "fine-tune": the JSONL rules of file_store_validate_jsonl),
 * then make the file visible with a new id; *out receives its metadata.
 * The upload is consumed whatever the outcome. purpose must be "fine-tune"
 * (the only purpose this server uses); filename is kept as given (at most
 * FILE_STORE_NAME_MAX-1 bytes, control characters refused). Returns 0,
 * -1 when the file or its purpose is refused (the client's error), or -2
 * when the store failed (disk full, I/O: the server's). */
int file_store_upload_commit(file_store *fs, file_upload *u, const char *filename,
                             const char *purpose, file_info *out, char *err,
                             size_t err_cap);
/* Drop an upload that will not be committed (NULL is a no-op). */
void file_store_upload_abort(file_upload *u);

/* Metadata of file `id`; -1 when there is none. */
int file_store_get(file_store *fs, const char *id, file_info *out);
/* Path of the data of file `id` into buf (for reading it); -1 when none. */
int file_store_data_path(file_store *fs, const char *id, char *buf, size_t cap);
/* Remove file `id` (metadata first, then data). */
int file_store_delete(file_store *fs, const char *id, char *err, size_t err_cap);

/* The file object JSON of OpenAI's API. */
void file_store_info_json(strbuf *b, const file_info *fi);
/* {"object":"list","data":[...newest first],"has_more":false}, only files
 * of `purpose` when it is not NULL. */
void file_store_list_json(file_store *fs, strbuf *b, const char *purpose);

/* Check a fine-tuning JSONL text: every non-blank line is one JSON object
 * with "prompt" and "completion" strings, or a non-empty "messages" array of
 * {"role": system|user|assistant|tool, "content": string} with at least one
 * assistant turn, or a "text" string. At least one example. On failure err
 * says "line N: what is wrong". */
int file_store_validate_jsonl(const char *text, size_t len, char *err, size_t err_cap);

#endif
