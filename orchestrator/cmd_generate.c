/*
 * cmd_generate.c - placeholder for `orch generate` until issue 4 lands.
 */
#include <stdio.h>

#include "orchestrator/commands.h"
#include "orchestrator/util.h"

int cmd_generate(int argc, char **argv) {
    (void)argc;
    (void)argv;
    util_error("generate: not available in this build yet (issue 4)");
    return ORCH_EXIT_USAGE;
}
