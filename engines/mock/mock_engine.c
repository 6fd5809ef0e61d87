/* mock_engine.c - placeholder until the mock engine lands. */
#include "engine_api/orch_engine.h"
ORCH_ENGINE_EXPORT const orch_engine_api *orch_engine_get_api(uint32_t abi_major);
const orch_engine_api *orch_engine_get_api(uint32_t abi_major) { (void)abi_major; return 0; }
