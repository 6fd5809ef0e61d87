/*
 * adapter_moments.c - a LoRA adapter's AdamW moments in safetensors (see
 * adapter_moments.h).
 */
#include "orchestrator/store/adapter_moments.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/core/util.h"
#include "orchestrator/store/safetensors.h"

static void engine_err(const engine_handle *h, orch_engine_ctx *ctx, int32_t st,
                       const char *what, char *err, size_t err_cap) {
    char m[1024];
    engine_format_error(h, ctx, st, m, sizeof m);
    util_set_err(err, err_cap, "%s: %s", what, m);
}

int adapter_moments_save(const char *path, const engine_handle *h, orch_engine_ctx *ctx,
                         uint32_t id, const peft_adapter *a, uint8_t sha256_out[32],
                         char *err, size_t err_cap) {
    safetensors_writer *w = NULL;
    if (safetensors_writer_create(path, &w, err, err_cap) != 0) return -1;
    char name[ORCH_TENSOR_NAME_MAX + 8];
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < a->n; i++) {
            snprintf(name, sizeof name, "%c.%s", k ? 'v' : 'm', a->t[i].name);
            if (safetensors_writer_declare(w, name, SAFETENSORS_F32, 2, a->t[i].shape,
                                           err, err_cap) != 0)
                goto fail;
        }
    if (safetensors_writer_add_metadata(w, "format", "orch-finetune-optimizer", err,
                                        err_cap) != 0 ||
        safetensors_writer_begin_data(w, err, err_cap) != 0)
        goto fail;
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < a->n; i++) {
            size_t bytes = (size_t)a->t[i].numel * sizeof(float);
            float *buf = malloc(bytes ? bytes : 1);
            if (!buf) {
                util_set_err(err, err_cap, "%s: out of memory", path);
                goto fail;
            }
            int32_t st = h->api->adapter_tensor_read(
                ctx, id, k ? ORCH_TENSOR_ADAM_V : ORCH_TENSOR_ADAM_M, (uint32_t)i, buf,
                bytes);
            int rc = st == ORCH_OK ? safetensors_writer_write(w, buf, bytes, err, err_cap)
                                   : -1;
            if (st != ORCH_OK)
                engine_err(h, ctx, st, "adapter_tensor_read", err, err_cap);
            free(buf);
            if (rc != 0) goto fail;
        }
    return safetensors_writer_finish(w, sha256_out, err, err_cap);
fail:
    safetensors_writer_abort(w);
    return -1;
}

int adapter_moments_load(const char *path, const engine_handle *h, orch_engine_ctx *ctx,
                         uint32_t id, const peft_adapter *a, char *err, size_t err_cap) {
    safetensors_file *f = NULL;
    if (safetensors_open(path, &f, err, err_cap) != 0) return -1;
    int rc = 0;
    for (int k = 0; k < 2 && rc == 0; k++)
        for (size_t i = 0; i < a->n && rc == 0; i++) {
            char name[ORCH_TENSOR_NAME_MAX + 8];
            snprintf(name, sizeof name, "%c.%s", k ? 'v' : 'm', a->t[i].name);
            const safetensors_tensor *t = safetensors_find(f, name);
            if (!t || t->dtype != SAFETENSORS_F32 || t->numel != a->t[i].numel) {
                util_set_err(err, err_cap, "%s: missing or mis-shaped tensor %s", path,
                             name);
                rc = -1;
                break;
            }
            int32_t st = h->api->adapter_tensor_write(
                ctx, id, k ? ORCH_TENSOR_ADAM_V : ORCH_TENSOR_ADAM_M, (uint32_t)i,
                t->data, t->nbytes);
            if (st != ORCH_OK) {
                engine_err(h, ctx, st, "adapter_tensor_write", err, err_cap);
                rc = -1;
            }
        }
    safetensors_close(f);
    return rc;
}
