/* null_member.c - test engine with a full-size table whose required member
 * tensor_read is NULL. */
#include "tests/engines/broken_common.h"

static const orch_engine_api api = { BROKEN_BASE_TABLE("null-member") };
static orch_engine_api broken;

const orch_engine_api *orch_engine_get_api(uint32_t abi_major) {
    (void)abi_major;
    broken = api;
    broken.tensor_read = NULL;
    return &broken;
}
