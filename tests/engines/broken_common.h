/*
 * broken_common.h - shared pieces of the deliberately broken test engines in
 * tests/engines/NAME.c (each compiled to build/tests/engines/NAME.so). Every
 * function here is a harmless stub: these engines exist only so the loader
 * tests can check that each defect is rejected with the right message.
 */
#ifndef ORCH_TEST_BROKEN_COMMON_H
#define ORCH_TEST_BROKEN_COMMON_H

#include <stdio.h>

#include "engine_api/orch_engine.h"

#define STUB __attribute__((unused))

static STUB int32_t stub_probe(char *msg, uint32_t cap) {
    if (msg && cap) snprintf(msg, cap, "test engine");
    return ORCH_OK;
}
static STUB const char *stub_status_string(int32_t s) {
    return s == ORCH_OK ? "ok" : "unknown status";
}
static STUB int32_t stub_create(const orch_model_desc *m, const orch_engine_options *o,
                                orch_engine_ctx **out, char *err, uint32_t cap) {
    (void)m, (void)o, (void)out;
    if (err && cap) snprintf(err, cap, "test engine has no contexts");
    return ORCH_ERR_UNSUPPORTED;
}
static STUB void stub_destroy(orch_engine_ctx *c) { (void)c; }
static STUB const char *stub_last_error(const orch_engine_ctx *c) {
    (void)c;
    return "";
}
static STUB int32_t stub_count(orch_engine_ctx *c, uint32_t k, uint32_t *n) {
    (void)c, (void)k, (void)n;
    return ORCH_ERR_UNSUPPORTED;
}
static STUB int32_t stub_info(orch_engine_ctx *c, uint32_t k, uint32_t i,
                              orch_tensor_info *o) {
    (void)c, (void)k, (void)i, (void)o;
    return ORCH_ERR_UNSUPPORTED;
}
static STUB int32_t stub_read(orch_engine_ctx *c, uint32_t k, uint32_t i, void *d,
                              uint64_t n) {
    (void)c, (void)k, (void)i, (void)d, (void)n;
    return ORCH_ERR_UNSUPPORTED;
}
static STUB int32_t stub_write(orch_engine_ctx *c, uint32_t k, uint32_t i, const void *s,
                               uint64_t n) {
    (void)c, (void)k, (void)i, (void)s, (void)n;
    return ORCH_ERR_UNSUPPORTED;
}

/* A complete table without capabilities: only the always-required members. */
#define BROKEN_BASE_TABLE(NAME)                                                          \
    .abi_major = ORCH_ENGINE_ABI_MAJOR, .abi_minor = ORCH_ENGINE_ABI_MINOR,              \
    .struct_size = sizeof(orch_engine_api), .name = NAME, .version = "test",             \
    .capabilities = 0, .probe = stub_probe, .status_string = stub_status_string,         \
    .context_create = stub_create, .context_destroy = stub_destroy,                      \
    .last_error = stub_last_error, .tensor_count = stub_count, .tensor_info = stub_info, \
    .tensor_read = stub_read, .tensor_write = stub_write

ORCH_ENGINE_EXPORT const orch_engine_api *orch_engine_get_api(uint32_t abi_major);

#endif
