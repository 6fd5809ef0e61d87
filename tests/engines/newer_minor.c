/* newer_minor.c - a VALID test engine from a later minor version (1.9) whose
 * table is longer than ABI 1.0's: the loader must accept it. */
#include "tests/engines/broken_common.h"

typedef struct {
    orch_engine_api v1_0;
    void (*appended[4])(void); /* members of minors we do not know */
} api_1_9;

static const api_1_9 api = {
    .v1_0 = { BROKEN_BASE_TABLE("newer-minor") },
};
static api_1_9 table;

const orch_engine_api *orch_engine_get_api(uint32_t abi_major) {
    (void)abi_major;
    table = api;
    table.v1_0.abi_minor = 9;
    table.v1_0.struct_size = sizeof(api_1_9);
    return &table.v1_0;
}
