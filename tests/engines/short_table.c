/* short_table.c - test engine whose table claims a struct_size that ends
 * before the ABI 1.0 members do. */
#include <stddef.h>

#include "tests/engines/broken_common.h"

static const orch_engine_api api = {
    .abi_major = ORCH_ENGINE_ABI_MAJOR,
    .abi_minor = ORCH_ENGINE_ABI_MINOR,
    .struct_size = offsetof(orch_engine_api, tensor_count),
    .name = "short-table",
    .version = "test",
    .probe = stub_probe,
    .status_string = stub_status_string,
    .context_create = stub_create,
    .context_destroy = stub_destroy,
    .last_error = stub_last_error,
};

const orch_engine_api *orch_engine_get_api(uint32_t abi_major) {
    (void)abi_major;
    return &api;
}
