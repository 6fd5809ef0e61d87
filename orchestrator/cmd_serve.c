/*
 * cmd_serve.c - placeholder for `orch serve` until issue 5 lands.
 */
#include <stdio.h>

#include "orchestrator/commands.h"
#include "orchestrator/util.h"

int cmd_serve(int argc, char **argv) {
    (void)argc;
    (void)argv;
    util_error("serve: not available in this build yet (issue 5)");
    return ORCH_EXIT_USAGE;
}
