/*
 * cmd_eval.c - placeholder for `orch eval` until issue 4 lands.
 */
#include <stdio.h>

#include "orchestrator/commands.h"
#include "orchestrator/util.h"

int cmd_eval(int argc, char **argv) {
    (void)argc;
    (void)argv;
    util_error("eval: not available in this build yet (issue 4)");
    return ORCH_EXIT_USAGE;
}
