/*
 * cmd_info.c - `orch info --engine=E`: loads an engine through the loader and
 * prints its name, version, ABI version, capabilities and probe result.
 */
#include <stdio.h>
#include <string.h>

#include "orchestrator/cli/commands.h"
#include "orchestrator/core/engine_loader.h"
#include "orchestrator/core/util.h"

int cmd_info(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) {
        printf("usage: orch info [--engine=mock|cpu|cuda|FILE.so|PATH]\n\n"
               "Loads the engine (default: cpu) and prints its name, version,\n"
               "ABI version, capabilities and what probe() says about this\n"
               "machine. Exit status 2 when the engine cannot be loaded or\n"
               "cannot run here.\n");
        return ORCH_EXIT_OK;
    }
    const char *engine = "cpu";
    for (int i = 1; i < argc; i++) {
        const char *v = util_flag_value("--engine", argc, argv, &i);
        if (v) {
            engine = v;
            continue;
        }
        util_error("info: unknown argument '%s'", argv[i]);
        return ORCH_EXIT_USAGE;
    }
    engine_handle h;
    char err[2048];
    if (engine_load(engine, &h, err, sizeof err) != 0) {
        util_error("%s", err);
        return ORCH_EXIT_USAGE;
    }
    char caps[256];
    engine_caps_string(h.api->capabilities, caps, sizeof caps);
    printf("engine:       %s\n", h.api->name);
    printf("file:         %s\n", h.path);
    printf("version:      %s\n", h.api->version ? h.api->version : "?");
    printf("abi:          %u.%u (orch %u.%u)\n", h.api->abi_major,
           h.api->abi_minor, ORCH_ENGINE_ABI_MAJOR, ORCH_ENGINE_ABI_MINOR);
    printf("capabilities: %s\n", caps);
    printf("probe:        ok: %s\n", h.probe_msg);
    engine_unload(&h);
    return ORCH_EXIT_OK;
}
