/*
 * file_store.c - the uploaded files of `orch serve`, kept in the state
 * directory (see file_store.h for the layout and the rules).
 */
#include "orchestrator/serve/file_store.h"

#include <cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "orchestrator/core/fsio.h"
#include "orchestrator/core/json_writer.h"
#include "orchestrator/core/util.h"

struct file_store {
    pthread_mutex_t mu;
    char dir[4000]; /* STATE/files (short enough for every path below) */
    uint64_t max_bytes;
    file_info *files; /* the index, in no particular order */
    size_t n, cap;
};

struct file_upload {
    file_store *fs;
    fsio_atomic_file f; /* the data, to be renamed to ID.data */
    uint64_t bytes;
    int failed;
};

/* "file-" + 24 hex digits. */
static int valid_id(const char *id) {
    if (!id || strncmp(id, "file-", 5) != 0 || strlen(id) != 29) return 0;
    for (const char *p = id + 5; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'))) return 0;
    return 1;
}

static void path_of(const file_store *fs, const char *id, const char *ext, char *buf,
                    size_t cap) {
    int n = snprintf(buf, cap, "%s/%.29s.%.4s", fs->dir, id, ext);
    (void)n; /* fs->dir is at most 4095 - strlen("/files"): always fits cap */
}

/* Parse one metadata file; 0 on success. */
static int read_meta(const char *path, file_info *fi) {
    char *text = NULL;
    size_t len = 0;
    char err[256];
    if (fsio_read_file(path, 1 << 16, &text, &len, err, sizeof err) != 0) return -1;
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    if (!j) return -1;
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(j, "id");
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(j, "filename");
    const cJSON *pu = cJSON_GetObjectItemCaseSensitive(j, "purpose");
    const cJSON *by = cJSON_GetObjectItemCaseSensitive(j, "bytes");
    const cJSON *ca = cJSON_GetObjectItemCaseSensitive(j, "created_at");
    int ok = cJSON_IsString(id) && valid_id(id->valuestring) && cJSON_IsString(fn) &&
             strlen(fn->valuestring) < FILE_STORE_NAME_MAX && cJSON_IsString(pu) &&
             strlen(pu->valuestring) < FILE_STORE_PURPOSE_MAX && cJSON_IsNumber(by) &&
             by->valuedouble >= 0 && cJSON_IsNumber(ca);
    if (ok) {
        memset(fi, 0, sizeof *fi);
        snprintf(fi->id, sizeof fi->id, "%s", id->valuestring);
        snprintf(fi->filename, sizeof fi->filename, "%s", fn->valuestring);
        snprintf(fi->purpose, sizeof fi->purpose, "%s", pu->valuestring);
        fi->bytes = (uint64_t)by->valuedouble;
        fi->created_at = (int64_t)ca->valuedouble;
    }
    cJSON_Delete(j);
    return ok ? 0 : -1;
}

static int index_add(file_store *fs, const file_info *fi) {
    if (fs->n == fs->cap) {
        size_t cap = fs->cap ? fs->cap * 2 : 16;
        file_info *p = realloc(fs->files, cap * sizeof *p);
        if (!p) return -1;
        fs->files = p;
        fs->cap = cap;
    }
    fs->files[fs->n++] = *fi;
    return 0;
}

static ssize_t index_find(const file_store *fs, const char *id) {
    for (size_t i = 0; i < fs->n; i++)
        if (strcmp(fs->files[i].id, id) == 0) return (ssize_t)i;
    return -1;
}

/* Read every ID.json; remove temp files of dead writers and data files
 * without metadata (a crash between the two renames). */
static int load_index(file_store *fs, char *err, size_t err_cap) {
    DIR *d = fsio_opendir(fs->dir, err, err_cap);
    if (!d) return -1;
    struct dirent *e;
    char path[4352];
    while ((e = readdir(d)) != NULL) {
        const char *name = e->d_name;
        size_t nl = strlen(name);
        long pid;
        if (fsio_tmp_name_pid(name, &pid)) {
            snprintf(path, sizeof path, "%s/%s", fs->dir, name);
            if (pid == (long)getpid() || kill((pid_t)pid, 0) != 0) unlink(path);
            continue;
        }
        if (nl == 29 + 5 && strcmp(name + 29, ".json") == 0) {
            file_info fi;
            snprintf(path, sizeof path, "%s/%s", fs->dir, name);
            if (read_meta(path, &fi) == 0 && strncmp(fi.id, name, 29) == 0) {
                if (index_add(fs, &fi) != 0) {
                    closedir(d);
                    util_set_err(err, err_cap, "files: out of memory");
                    return -1;
                }
            }
        }
    }
    rewinddir(d);
    while ((e = readdir(d)) != NULL) {
        const char *name = e->d_name;
        if (strlen(name) == 29 + 5 && strcmp(name + 29, ".data") == 0) {
            char id[FILE_STORE_ID_MAX];
            snprintf(id, sizeof id, "%.29s", name);
            if (valid_id(id) && index_find(fs, id) < 0) {
                snprintf(path, sizeof path, "%s/%s", fs->dir, name);
                unlink(path);
            }
        }
    }
    closedir(d);
    return 0;
}

file_store *file_store_open(const char *state_dir, uint64_t max_bytes, char *err,
                            size_t err_cap) {
    if (!state_dir || !*state_dir) {
        util_set_err(err, err_cap, "files: no state directory");
        return NULL;
    }
    file_store *fs = util_calloc(1, sizeof *fs);
    if (!fs) {
        util_set_err(err, err_cap, "files: out of memory");
        return NULL;
    }
    if ((size_t)snprintf(fs->dir, sizeof fs->dir, "%s/files", state_dir) >=
        sizeof fs->dir) {
        util_set_err(err, err_cap, "files: state directory path too long");
        free(fs);
        return NULL;
    }
    fs->max_bytes = max_bytes ? max_bytes : FILE_STORE_DEFAULT_MAX;
    pthread_mutex_init(&fs->mu, NULL);
    if (fsio_mkdir_p(fs->dir, err, err_cap) != 0 || load_index(fs, err, err_cap) != 0) {
        file_store_close(fs);
        return NULL;
    }
    return fs;
}

void file_store_close(file_store *fs) {
    if (!fs) return;
    pthread_mutex_destroy(&fs->mu);
    free(fs->files);
    free(fs);
}

file_upload *file_store_upload_begin(file_store *fs, char *err, size_t err_cap) {
    file_upload *u = util_calloc(1, sizeof *u);
    if (!u) {
        util_set_err(err, err_cap, "files: out of memory");
        return NULL;
    }
    u->fs = fs;
    /* The target name is fixed at commit; the temp file lives beside a
     * placeholder target in the same directory (same file system). */
    char target[4200];
    snprintf(target, sizeof target, "%s/upload", fs->dir);
    if (fsio_atomic_open(&u->f, target, err, err_cap) != 0) {
        free(u);
        return NULL;
    }
    return u;
}

int file_upload_write(file_upload *u, const void *data, size_t n, char *err,
                      size_t err_cap) {
    if (u->failed) {
        util_set_err(err, err_cap, "files: the upload already failed");
        return -1;
    }
    if (u->bytes + n > u->fs->max_bytes) {
        u->failed = 1;
        util_set_err(err, err_cap, "file is over the limit of %" PRIu64 " bytes",
                     u->fs->max_bytes);
        return -1;
    }
    if (n && fsio_atomic_write(&u->f, data, n, err, err_cap) != 0) {
        u->failed = 1;
        return -2;
    }
    u->bytes += n;
    return 0;
}

uint64_t file_upload_bytes(const file_upload *u) { return u ? u->bytes : 0; }

void file_store_upload_abort(file_upload *u) {
    if (!u) return;
    fsio_atomic_abort(&u->f);
    free(u);
}

/* ---- fine-tuning JSONL ---- */

static int check_example(const cJSON *j, char *why, size_t cap) {
    if (!cJSON_IsObject(j)) {
        snprintf(why, cap, "not a JSON object");
        return -1;
    }
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(j, "prompt");
    const cJSON *completion = cJSON_GetObjectItemCaseSensitive(j, "completion");
    const cJSON *messages = cJSON_GetObjectItemCaseSensitive(j, "messages");
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(j, "text");
    int kinds = (prompt || completion) + (messages != NULL) + (text != NULL);
    if (kinds != 1) {
        snprintf(why, cap,
                 kinds ? "has more than one of \"prompt\"/\"completion\", \"messages\" "
                         "and \"text\""
                       : "needs \"prompt\" and \"completion\", \"messages\" or \"text\"");
        return -1;
    }
    if (prompt || completion) {
        if (!cJSON_IsString(prompt) || !cJSON_IsString(completion)) {
            snprintf(why, cap, "\"prompt\" and \"completion\" must both be strings");
            return -1;
        }
        if (!*completion->valuestring) {
            snprintf(why, cap, "\"completion\" is empty (nothing to learn)");
            return -1;
        }
        return 0;
    }
    if (text) {
        if (!cJSON_IsString(text) || !*text->valuestring) {
            snprintf(why, cap, "\"text\" must be a non-empty string");
            return -1;
        }
        return 0;
    }
    if (!cJSON_IsArray(messages) || cJSON_GetArraySize(messages) == 0) {
        snprintf(why, cap, "\"messages\" must be a non-empty array");
        return -1;
    }
    int k = 0, assistant = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, messages) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!cJSON_IsObject(m) || !cJSON_IsString(role)) {
            snprintf(why, cap, "messages[%d] needs a \"role\" string", k);
            return -1;
        }
        const char *r = role->valuestring;
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") &&
            strcmp(r, "tool")) {
            snprintf(why, cap,
                     "messages[%d].role '%.32s' is not system, user, assistant or tool",
                     k, r);
            return -1;
        }
        if (!cJSON_IsString(content)) {
            snprintf(why, cap, "messages[%d].content must be a string", k);
            return -1;
        }
        if (strcmp(r, "assistant") == 0) assistant = 1;
        k++;
    }
    if (!assistant) {
        snprintf(why, cap, "\"messages\" has no assistant turn (nothing to learn)");
        return -1;
    }
    return 0;
}

/* Validate lines read from fp. */
static int validate_stream(FILE *fp, char *err, size_t err_cap) {
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    uint64_t lineno = 0, examples = 0;
    int rc = 0;
    while ((n = getline(&line, &cap, fp)) >= 0) {
        lineno++;
        size_t len = (size_t)n;
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) len--;
        size_t s = 0;
        while (s < len && (line[s] == ' ' || line[s] == '\t')) s++;
        if (s == len) continue;
        if (memchr(line, '\0', len)) {
            util_set_err(err, err_cap, "line %" PRIu64 ": contains a NUL byte", lineno);
            rc = -1;
            break;
        }
        const char *end = NULL;
        cJSON *j = cJSON_ParseWithLengthOpts(line + s, len - s, &end, 0);
        if (!j) {
            util_set_err(err, err_cap, "line %" PRIu64 ": not valid JSON", lineno);
            rc = -1;
            break;
        }
        while (end && end < line + len && (*end == ' ' || *end == '\t')) end++;
        char why[256];
        int bad = 0;
        if (end && end < line + len) {
            snprintf(why, sizeof why, "text after the JSON object");
            bad = 1;
        } else {
            bad = check_example(j, why, sizeof why) != 0;
        }
        cJSON_Delete(j);
        if (bad) {
            util_set_err(err, err_cap, "line %" PRIu64 ": %s", lineno, why);
            rc = -1;
            break;
        }
        examples++;
    }
    free(line);
    if (rc == 0 && examples == 0) {
        util_set_err(err, err_cap, "the file has no examples (one JSON object per line)");
        rc = -1;
    }
    return rc;
}

int file_store_validate_jsonl(const char *text, size_t len, char *err, size_t err_cap) {
    if (len == 0) {
        util_set_err(err, err_cap, "the file has no examples (one JSON object per line)");
        return -1;
    }
    FILE *fp = fmemopen((void *)text, len, "r");
    if (!fp) {
        util_set_err(err, err_cap, "files: out of memory");
        return -1;
    }
    int rc = validate_stream(fp, err, err_cap);
    fclose(fp);
    return rc;
}

/* ---- commit ---- */

static void meta_json(strbuf *b, const file_info *fi) {
    strbuf_puts(b, "{\"id\":");
    json_write_cstring(b, fi->id);
    strbuf_printf(b,
                  ",\"object\":\"file\",\"bytes\":%" PRIu64 ",\"created_at\":%" PRId64
                  ",\"filename\":",
                  fi->bytes, fi->created_at);
    json_write_cstring(b, fi->filename);
    strbuf_puts(b, ",\"purpose\":");
    json_write_cstring(b, fi->purpose);
    strbuf_puts(b, ",\"status\":\"processed\",\"status_details\":null}");
}

void file_store_info_json(strbuf *b, const file_info *fi) { meta_json(b, fi); }

int file_store_upload_commit(file_store *fs, file_upload *u, const char *filename,
                             const char *purpose, file_info *out, char *err,
                             size_t err_cap) {
    int rc = -1; /* -1 until validated, then -2 (a storage failure) */
    file_info fi;
    memset(&fi, 0, sizeof fi);
    if (!purpose || !*purpose) {
        util_set_err(err, err_cap, "missing 'purpose' (this server accepts fine-tune)");
        goto done;
    }
    if (strcmp(purpose, "fine-tune") != 0) {
        util_set_err(err, err_cap,
                     "purpose '%.32s' is not supported (this server accepts fine-tune)",
                     purpose);
        goto done;
    }
    if (!filename || !*filename) filename = "upload.jsonl";
    if (strlen(filename) >= FILE_STORE_NAME_MAX) {
        util_set_err(err, err_cap, "filename is longer than %d bytes",
                     FILE_STORE_NAME_MAX - 1);
        goto done;
    }
    for (const unsigned char *p = (const unsigned char *)filename; *p; p++)
        if (*p < 0x20 || *p == 0x7f) {
            util_set_err(err, err_cap, "filename contains a control character");
            goto done;
        }
    if (u->failed) {
        util_set_err(err, err_cap, "the upload failed");
        rc = -2;
        goto done;
    }
    /* Validate what was written: flush, then read the temp file back. */
    rc = -2;
    if (fflush(u->f.fp) != 0) {
        util_set_err(err, err_cap, "files: writing %s: %s", u->f.tmp_path,
                     strerror(errno));
        goto done;
    }
    FILE *rd = fopen(u->f.tmp_path, "r");
    if (!rd) {
        util_set_err(err, err_cap, "files: reading back %s: %s", u->f.tmp_path,
                     strerror(errno));
        goto done;
    }
    int vr = validate_stream(rd, err, err_cap);
    fclose(rd);
    if (vr != 0) {
        rc = -1;
        goto done;
    }

    if (util_random_id(fi.id, sizeof fi.id, "file-", 12) != 0) {
        util_set_err(err, err_cap, "files: no random source for an id");
        goto done;
    }
    snprintf(fi.filename, sizeof fi.filename, "%s", filename);
    snprintf(fi.purpose, sizeof fi.purpose, "%s", purpose);
    fi.bytes = u->bytes;
    fi.created_at = (int64_t)time(NULL);
    /* the data under its id, then the metadata (what makes it visible) */
    path_of(fs, fi.id, "data", u->f.path, sizeof u->f.path);
    if (fsio_atomic_commit(&u->f, err, err_cap) != 0) goto done;
    char meta_path[4200], data_path[4200];
    path_of(fs, fi.id, "json", meta_path, sizeof meta_path);
    path_of(fs, fi.id, "data", data_path, sizeof data_path);
    strbuf b = { 0 };
    meta_json(&b, &fi);
    if (b.oom) {
        strbuf_free(&b);
        unlink(data_path);
        util_set_err(err, err_cap, "files: out of memory");
        goto freed;
    }
    if (fsio_write_atomic(meta_path, b.p, b.len, err, err_cap) != 0) {
        strbuf_free(&b);
        unlink(data_path);
        goto freed;
    }
    strbuf_free(&b);
    pthread_mutex_lock(&fs->mu);
    int added = index_add(fs, &fi);
    pthread_mutex_unlock(&fs->mu);
    if (added != 0) {
        unlink(meta_path);
        unlink(data_path);
        util_set_err(err, err_cap, "files: out of memory");
        goto freed;
    }
    if (out) *out = fi;
    rc = 0;
freed:
    free(u);
    return rc;
done:
    file_store_upload_abort(u);
    return rc;
}

int file_store_get(file_store *fs, const char *id, file_info *out) {
    if (!valid_id(id)) return -1;
    pthread_mutex_lock(&fs->mu);
    ssize_t i = index_find(fs, id);
    if (i >= 0 && out) *out = fs->files[i];
    pthread_mutex_unlock(&fs->mu);
    return i >= 0 ? 0 : -1;
}

int file_store_data_path(file_store *fs, const char *id, char *buf, size_t cap) {
    if (file_store_get(fs, id, NULL) != 0) return -1;
    path_of(fs, id, "data", buf, cap);
    return 0;
}

int file_store_delete(file_store *fs, const char *id, char *err, size_t err_cap) {
    if (!valid_id(id)) {
        util_set_err(err, err_cap, "no such file: '%.64s'", id ? id : "");
        return -1;
    }
    pthread_mutex_lock(&fs->mu);
    ssize_t i = index_find(fs, id);
    int rc = -1;
    if (i < 0) {
        util_set_err(err, err_cap, "no such file: '%s'", id);
    } else {
        char meta_path[4200], data_path[4200];
        path_of(fs, id, "json", meta_path, sizeof meta_path);
        path_of(fs, id, "data", data_path, sizeof data_path);
        if (fsio_unlink(meta_path, err, err_cap) == 0) {
            unlink(data_path); /* without metadata it is gone either way */
            fs->files[i] = fs->files[fs->n - 1];
            fs->n--;
            rc = 0;
        }
    }
    pthread_mutex_unlock(&fs->mu);
    return rc;
}

static int newest_first(const void *a, const void *b) {
    const file_info *x = a, *y = b;
    if (x->created_at != y->created_at) return x->created_at < y->created_at ? 1 : -1;
    return strcmp(x->id, y->id);
}

void file_store_list_json(file_store *fs, strbuf *b, const char *purpose) {
    pthread_mutex_lock(&fs->mu);
    file_info *copy = fs->n ? malloc(fs->n * sizeof *copy) : NULL;
    size_t n = 0;
    if (copy) {
        for (size_t i = 0; i < fs->n; i++)
            if (!purpose || strcmp(fs->files[i].purpose, purpose) == 0)
                copy[n++] = fs->files[i];
    } else if (fs->n) {
        b->oom = 1;
    }
    pthread_mutex_unlock(&fs->mu);
    if (n > 1) qsort(copy, n, sizeof *copy, newest_first);
    strbuf_puts(b, "{\"object\":\"list\",\"data\":[");
    for (size_t i = 0; i < n; i++) {
        if (i) strbuf_puts(b, ",");
        meta_json(b, &copy[i]);
    }
    strbuf_puts(b, "],\"has_more\":false");
    if (n) {
        strbuf_puts(b, ",\"first_id\":");
        json_write_cstring(b, copy[0].id);
        strbuf_puts(b, ",\"last_id\":");
        json_write_cstring(b, copy[n - 1].id);
    }
    strbuf_puts(b, "}");
    free(copy);
}
