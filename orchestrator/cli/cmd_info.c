/*
 * cmd_info.c - `orch info --engine=E`: loads an engine through the loader and
 * prints its name, version, ABI version, capabilities and probe result.
 */
#include <stdio.h>
#include <string.h>

#include "orchestrator/cli/commands.h"
#include "orchestrator/cli/flags.h"
#include "orchestrator/core/engine_loader.h"
#include "orchestrator/core/util.h"

int cmd_info(int argc, char **argv) {
    const char *engine = "cpu";
    const flag_spec flags[] = {
        { "--engine", FLAG_STRING, &engine, "E",
          .help = "mock | cpu | cuda | FILE.so | PATH (default cpu)" },
        { NULL },
    };
    const flags_cmd cmd = {
        .name = "info",
        .usage = "usage: orch info [--engine=mock|cpu|cuda|FILE.so|PATH]\n\n"
                 "Loads the engine (default: cpu) and prints its name, version,\n"
                 "ABI version, capabilities and what probe() says about this\n"
                 "machine. Exit status 2 when the engine cannot be loaded or\n"
                 "cannot run here.\n\n",
        .flags = flags,
    };
    int rc;
    if (flags_parse(&cmd, argc, argv, &rc)) return rc;
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
    printf("abi:          %u.%u (orch %u.%u)\n", h.api->abi_major, h.api->abi_minor,
           ORCH_ENGINE_ABI_MAJOR, ORCH_ENGINE_ABI_MINOR);
    printf("capabilities: %s\n", caps);
    printf("probe:        ok: %s\n", h.probe_msg);
    engine_unload(&h);
    return ORCH_EXIT_OK;
}
