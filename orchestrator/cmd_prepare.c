/*
 * cmd_prepare.c - placeholder for `orch prepare` until issue 4 lands.
 */
#include <stdio.h>

#include "orchestrator/commands.h"
#include "orchestrator/util.h"

int cmd_prepare(int argc, char **argv) {
    (void)argc;
    (void)argv;
    util_error("prepare: not available in this build yet (issue 4)");
    return ORCH_EXIT_USAGE;
}
