/*
 * http_files.c - OpenAI's files API on `orch serve` (file_store.h keeps the
 * files in the state directory):
 *   POST   /v1/files              multipart/form-data: "file" (the bytes,
 *                                 with its filename) and "purpose"
 *                                 ("fine-tune"); the JSONL is validated
 *                                 (line numbers in the 400) before the file
 *                                 exists; answers the file object
 *   GET    /v1/files              {"object":"list","data":[...]}; ?purpose=
 *   GET    /v1/files/ID           the file object
 *   DELETE /v1/files/ID           {"id","object":"file","deleted":true}
 *   GET    /v1/files/ID/content   the bytes
 * The multipart body is parsed by libmicrohttpd's post processor and
 * streamed to disk as it arrives (not held in memory; not counted against
 * --max-body, bounded by --max-upload-mib). Without --state-dir these
 * routes answer 404 saying how to enable them.
 * Threads: everything here runs on the request's MHD thread.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "orchestrator/core/util.h"
#include "orchestrator/serve/http_internal.h"

struct http_upload {
    struct MHD_PostProcessor *pp;
    file_upload *up;
    char purpose[FILE_STORE_PURPOSE_MAX];
    size_t purpose_len;
    char filename[FILE_STORE_NAME_MAX];
    int files;   /* "file" parts seen */
    int unknown; /* a field other than file/purpose */
    int failed;  /* err says why */
    int status;  /* of the failure: 400, 413 (size limit), 500 (storage) */
    char err[512];
};

static enum MHD_Result disabled(http_req *hr) {
    return http_queue_err(hr, 404, NULL, "not_found",
                          "the files and fine-tuning API is off: start orch serve with "
                          "--state-dir DIR to enable it");
}

static enum MHD_Result on_field(void *cls, enum MHD_ValueKind kind, const char *key,
                                const char *filename, const char *content_type,
                                const char *transfer_encoding, const char *data,
                                uint64_t off, size_t size) {
    (void)kind, (void)content_type, (void)transfer_encoding;
    http_req *hr = cls;
    struct http_upload *u = hr->upload;
    if (u->failed) return MHD_YES; /* keep reading; answered at the end */
    if (strcmp(key, "file") == 0) {
        if (off == 0) {
            if (++u->files > 1) {
                u->failed = 1;
                u->status = 400;
                snprintf(u->err, sizeof u->err, "more than one 'file' part");
                return MHD_YES;
            }
            snprintf(u->filename, sizeof u->filename, "%s", filename ? filename : "");
        }
        int wr = size ? file_upload_write(u->up, data, size, u->err, sizeof u->err) : 0;
        if (wr != 0) {
            u->failed = 1;
            u->status = wr == -1 ? 413 : 500;
        }
        return MHD_YES;
    }
    if (strcmp(key, "purpose") == 0) {
        if (off + size >= sizeof u->purpose) {
            u->failed = 1;
            u->status = 400;
            snprintf(u->err, sizeof u->err, "'purpose' is too long");
            return MHD_YES;
        }
        memcpy(u->purpose + off, data, size);
        u->purpose_len = (size_t)off + size;
        u->purpose[u->purpose_len] = '\0';
        return MHD_YES;
    }
    if (!u->unknown) {
        u->unknown = 1;
        u->failed = 1;
        u->status = 400;
        snprintf(u->err, sizeof u->err,
                 "unknown field '%.64s' (this endpoint takes 'file' and 'purpose')", key);
    }
    return MHD_YES;
}

enum MHD_Result http_files_begin(http_req *hr) {
    http_server *s = hr->srv;
    if (!s->cfg.files) return disabled(hr);
    if (hr->method != HTTP_M_POST) return MHD_YES; /* answered when complete */
    const char *ct =
        MHD_lookup_connection_value(hr->conn, MHD_HEADER_KIND, "Content-Type");
    if (!ct || strncasecmp(ct, "multipart/form-data", 19) != 0) {
        char msg[192];
        snprintf(msg, sizeof msg, "Content-Type must be multipart/form-data, got '%.64s'",
                 ct ? ct : "(none)");
        return http_queue_err(hr, 415, NULL, "unsupported_media_type", msg);
    }
    struct http_upload *u = util_calloc(1, sizeof *u);
    if (!u) return MHD_NO;
    hr->upload = u;
    u->pp = MHD_create_post_processor(hr->conn, 64 * 1024, on_field, hr);
    if (!u->pp)
        return http_queue_err(hr, 400, NULL, "invalid_request",
                              "malformed multipart/form-data (no boundary)");
    char err[512];
    u->up = file_store_upload_begin(s->cfg.files, err, sizeof err);
    if (!u->up) return http_queue_err(hr, 500, NULL, "server_error", err);
    return MHD_YES;
}

enum MHD_Result http_files_take(http_req *hr, const char *data, size_t n) {
    struct http_upload *u = hr->upload;
    if (!u || !u->pp) return MHD_YES;
    if (MHD_post_process(u->pp, data, n) != MHD_YES && !u->failed) {
        u->failed = 1;
        u->status = 400;
        snprintf(u->err, sizeof u->err, "malformed multipart/form-data body");
    }
    return MHD_YES;
}

static enum MHD_Result finish_upload(http_req *hr) {
    http_server *s = hr->srv;
    struct http_upload *u = hr->upload;
    if (u->pp) {
        MHD_destroy_post_processor(u->pp);
        u->pp = NULL;
    }
    if (u->failed) {
        file_store_upload_abort(u->up);
        u->up = NULL;
        if (u->status == 413)
            return http_queue_err(hr, 413, NULL, "request_too_large", u->err);
        if (u->status == 500)
            return http_queue_err(hr, 500, NULL, "server_error", u->err);
        return http_queue_err(hr, 400, "file", "invalid_file", u->err);
    }
    if (!u->files) {
        file_store_upload_abort(u->up);
        u->up = NULL;
        return http_queue_err(hr, 400, "file", "missing_required_parameter",
                              "missing the 'file' part");
    }
    file_info fi;
    char err[512];
    file_upload *up = u->up;
    u->up = NULL;
    int rc = file_store_upload_commit(s->cfg.files, up, u->filename, u->purpose, &fi, err,
                                      sizeof err);
    if (rc == -2) return http_queue_err(hr, 500, NULL, "server_error", err);
    if (rc != 0) {
        int no_purpose = strstr(err, "purpose") != NULL;
        return http_queue_err(hr, 400, no_purpose ? "purpose" : "file",
                              no_purpose ? "invalid_value" : "invalid_file", err);
    }
    strbuf b = { 0 };
    file_store_info_json(&b, &fi);
    return http_queue_json(hr, 200, &b);
}

/* The id in /v1/files/ID[/content] (into id), and whether /content follows. */
static int split_url(const char *url, char *id, size_t cap, int *content) {
    const char *p = url + strlen("/v1/files/");
    const char *slash = strchr(p, '/');
    size_t n = slash ? (size_t)(slash - p) : strlen(p);
    *content = slash && strcmp(slash, "/content") == 0;
    if (slash && !*content) return -1;
    if (n == 0 || n >= cap) return -1;
    memcpy(id, p, n);
    id[n] = '\0';
    return 0;
}

static enum MHD_Result no_such_file(http_req *hr, const char *id) {
    char msg[160];
    snprintf(msg, sizeof msg, "no such file: '%.64s'", id);
    return http_queue_err(hr, 404, "file_id", "not_found", msg);
}

static enum MHD_Result send_content(http_req *hr, const char *id) {
    http_server *s = hr->srv;
    char path[4200];
    if (file_store_data_path(s->cfg.files, id, path, sizeof path) != 0)
        return no_such_file(hr, id);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        if (fd >= 0) close(fd);
        return no_such_file(hr, id); /* deleted meanwhile */
    }
    struct MHD_Response *r = MHD_create_response_from_fd((uint64_t)st.st_size, fd);
    if (!r) {
        close(fd);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "application/octet-stream");
    http_add_cors(hr, r);
    enum MHD_Result ret = MHD_queue_response(hr->conn, 200, r);
    MHD_destroy_response(r);
    hr->responded = 1;
    http_count_request(s, hr->route, 200);
    return ret;
}

enum MHD_Result http_files_answer(http_req *hr, const char *url) {
    http_server *s = hr->srv;
    if (!s->cfg.files) return disabled(hr);
    if (hr->route == R_FILES) {
        if (hr->method == HTTP_M_POST) return finish_upload(hr);
        const char *purpose =
            MHD_lookup_connection_value(hr->conn, MHD_GET_ARGUMENT_KIND, "purpose");
        strbuf b = { 0 };
        file_store_list_json(s->cfg.files, &b, purpose && *purpose ? purpose : NULL);
        return http_queue_json(hr, 200, &b);
    }
    char id[64];
    int content = 0;
    if (split_url(url, id, sizeof id, &content) != 0)
        return http_queue_err(hr, 404, NULL, "not_found", "no such route");
    if (content) return send_content(hr, id);
    if (hr->method == HTTP_M_DELETE) {
        char err[512];
        if (file_store_get(s->cfg.files, id, NULL) != 0) return no_such_file(hr, id);
        if (file_store_delete(s->cfg.files, id, err, sizeof err) != 0)
            return http_queue_err(hr, 500, NULL, "server_error", err);
        strbuf b = { 0 };
        strbuf_printf(&b, "{\"id\":\"%s\",\"object\":\"file\",\"deleted\":true}", id);
        return http_queue_json(hr, 200, &b);
    }
    file_info fi;
    if (file_store_get(s->cfg.files, id, &fi) != 0) return no_such_file(hr, id);
    strbuf b = { 0 };
    file_store_info_json(&b, &fi);
    return http_queue_json(hr, 200, &b);
}

void http_files_done(http_req *hr) {
    struct http_upload *u = hr->upload;
    if (!u) return;
    if (u->pp) MHD_destroy_post_processor(u->pp);
    file_store_upload_abort(u->up);
    free(u);
    hr->upload = NULL;
}
