/* no_entry.c - test engine that lacks the entry symbol orch_engine_get_api
 * (it exports a differently named function instead). */
#include "engine_api/orch_engine.h"

ORCH_ENGINE_EXPORT int orch_engine_get_api_v0(void);
int orch_engine_get_api_v0(void) { return 1; }
