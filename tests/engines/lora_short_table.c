/* lora_short_table.c - test engine that claims ORCH_CAP_LORA (ABI 1.4) with a
 * table that ends where ABI 1.2's did, so the adapter calls lie beyond it. */
#include <stddef.h>

#include "tests/engines/broken_common.h"

static const orch_engine_api api = { BROKEN_BASE_TABLE("lora-short-table") };
static orch_engine_api broken;

const orch_engine_api *orch_engine_get_api(uint32_t abi_major) {
    (void)abi_major;
    broken = api;
    broken.abi_minor = 2;
    broken.struct_size = offsetof(orch_engine_api, forward_backward_notify);
    broken.capabilities = ORCH_CAP_LORA;
    return &broken;
}
