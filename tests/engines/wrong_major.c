/* wrong_major.c - test engine built for ABI 2.3: the loader must refuse it
 * and name both versions. */
#include "tests/engines/broken_common.h"

static const orch_engine_api api = { BROKEN_BASE_TABLE("wrong-major") };
static orch_engine_api api2;

const orch_engine_api *orch_engine_get_api(uint32_t abi_major) {
    (void)abi_major;
    api2 = api;
    api2.abi_major = 2;
    api2.abi_minor = 3;
    return &api2;
}
