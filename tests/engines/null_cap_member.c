/* null_cap_member.c - test engine that claims ORCH_CAP_TRAIN but leaves
 * forward_backward (required by that capability) NULL. */
#include "tests/engines/broken_common.h"

static const orch_engine_api api = { BROKEN_BASE_TABLE("null-cap-member") };
static orch_engine_api broken;

const orch_engine_api *orch_engine_get_api(uint32_t abi_major) {
    (void)abi_major;
    broken = api;
    broken.capabilities = ORCH_CAP_TRAIN;
    return &broken; /* grads_zero ... optimizer_step all NULL */
}
