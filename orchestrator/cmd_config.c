/*
 * cmd_config.c - placeholder for `orch config` until issue 4 lands.
 */
#include <stdio.h>

#include "orchestrator/commands.h"
#include "orchestrator/util.h"

int cmd_config(int argc, char **argv) {
    (void)argc;
    (void)argv;
    util_error("config: not available in this build yet (issue 4)");
    return ORCH_EXIT_USAGE;
}
