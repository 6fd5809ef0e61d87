/* null_api.c - test engine whose orch_engine_get_api returns NULL. */
#include "tests/engines/broken_common.h"

const orch_engine_api *orch_engine_get_api(uint32_t abi_major) {
    (void)abi_major;
    return NULL;
}
