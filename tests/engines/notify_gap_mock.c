/* notify_gap_mock.c - a test engine that LOADS but breaks the ABI 1.3
 * contract: the mock engine's table with forward_backward_notify wrapped so
 * that the first reported gradient range is dropped (the ranges no longer
 * cover the buffer). The overlapped all-reduce must notice and stop the run
 * with one line instead of averaging a buffer it never read
 * (tests/dist_overlap.sh). Loads libengine_mock.so from the build directory
 * two levels above its own file (build/tests/engines/ -> build/). A context is
 * used by one thread at a time, so the forwarding state is a static. */
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "engine_api/orch_engine.h"

static orch_engine_api table;
static const orch_engine_api *mock;

static struct {
    orch_grad_ready_fn ready;
    void *user;
    int seen;
} fwd;

static void drop_first(void *user, uint64_t offset, uint64_t count) {
    (void)user;
    if (fwd.seen++ == 0) return;
    fwd.ready(fwd.user, offset, count);
}

static int32_t gap_notify(orch_engine_ctx *ctx, const int32_t *tokens,
                          const int32_t *targets, uint32_t batch, uint32_t seq_len,
                          float grad_scale, float *out_loss, orch_grad_ready_fn ready,
                          void *user) {
    fwd.ready = ready;
    fwd.user = user;
    fwd.seen = 0;
    return mock->forward_backward_notify(ctx, tokens, targets, batch, seq_len, grad_scale,
                                         out_loss, ready ? drop_first : NULL, NULL);
}

ORCH_ENGINE_EXPORT const orch_engine_api *orch_engine_get_api(uint32_t abi_major);

const orch_engine_api *orch_engine_get_api(uint32_t abi_major) {
    Dl_info info;
    char path[4096];
    if (!dladdr(&table, &info) || !info.dli_fname) return NULL;
    snprintf(path, sizeof path, "%s", info.dli_fname);
    for (int up = 0; up < 3; up++) { /* the file, engines/, tests/ */
        char *slash = strrchr(path, '/');
        if (!slash) return NULL;
        *slash = '\0';
    }
    size_t len = strlen(path);
    snprintf(path + len, sizeof path - len, "/libengine_mock.so");
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL); /* kept for the process */
    if (!dl) return NULL;
    orch_engine_get_api_fn get;
    void *sym = dlsym(dl, ORCH_ENGINE_ENTRY_SYMBOL);
    if (!sym) return NULL;
    memcpy(&get, &sym, sizeof get);
    mock = get(abi_major);
    if (!mock || !ORCH_API_HAS(mock, forward_backward_notify)) return NULL;
    table = *mock;
    table.name = "mock-notify-gap";
    table.forward_backward_notify = gap_notify;
    return &table;
}
