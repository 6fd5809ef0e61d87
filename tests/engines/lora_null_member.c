/* lora_null_member.c - test engine that claims ORCH_CAP_LORA but leaves the
 * adapter calls (required by that capability) NULL. */
#include "tests/engines/broken_common.h"

static const orch_engine_api api = { BROKEN_BASE_TABLE("lora-null-member") };
static orch_engine_api broken;

const orch_engine_api *orch_engine_get_api(uint32_t abi_major) {
    (void)abi_major;
    broken = api;
    broken.capabilities = ORCH_CAP_LORA;
    return &broken; /* adapter_create ... adapter_optimizer_step all NULL */
}
