/* abi11_mock.c - a VALID test engine of ABI 1.1: the mock engine's table cut
 * at the end of ABI 1.1 (abi_minor 1, struct_size ending before param_read),
 * as an engine built before ABI 1.2 presents itself. orch must load it, train
 * with it, and refuse train.zero = 1 with one line (tests/dist_zero.sh). It
 * loads libengine_mock.so from the build directory two levels above its own
 * file (build/tests/engines/ -> build/). */
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "engine_api/orch_engine.h"

static orch_engine_api table;

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
    const orch_engine_api *mock = get(abi_major);
    if (!mock) return NULL;
    size_t n = offsetof(orch_engine_api, param_read); /* ABI 1.1's size */
    memset(&table, 0, sizeof table);
    memcpy(&table, mock, n);
    table.abi_minor = 1;
    table.struct_size = (uint32_t)n;
    table.name = "mock-abi11";
    /* the capabilities of ABI 1.4 (adapters) and 1.5 (streams) need members it
     * does not have */
    table.capabilities &= ~(ORCH_CAP_LORA | ORCH_CAP_COSERVE | ORCH_CAP_FT_STREAM);
    return &table;
}
