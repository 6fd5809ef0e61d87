/* probe_fails.c - test engine whose probe() says it cannot run here. */
#include "tests/engines/broken_common.h"

static int32_t probe_no(char *msg, uint32_t cap) {
    if (msg && cap) snprintf(msg, cap, "no test accelerator on this machine");
    return ORCH_ERR_DEVICE;
}

static const orch_engine_api api = { BROKEN_BASE_TABLE("probe-fails") };
static orch_engine_api broken;

const orch_engine_api *orch_engine_get_api(uint32_t abi_major) {
    (void)abi_major;
    broken = api;
    broken.probe = probe_no;
    return &broken;
}
