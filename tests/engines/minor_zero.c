/* minor_zero.c - a VALID test engine of ABI 1.0 (minor 0): the loader loads
 * it, but never gives it a llama model, whose ABI 1.1 members a 1.0 engine
 * would read as reserved words and ignore. */
#include "tests/engines/broken_common.h"

static const orch_engine_api api = { BROKEN_BASE_TABLE("minor-zero") };
static orch_engine_api table;

const orch_engine_api *orch_engine_get_api(uint32_t abi_major) {
    (void)abi_major;
    table = api;
    table.abi_minor = 0;
    return &table;
}
