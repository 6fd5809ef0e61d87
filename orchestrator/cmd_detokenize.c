/*
 * cmd_detokenize.c - placeholder for `orch detokenize` until issue 4 lands.
 */
#include <stdio.h>

#include "orchestrator/commands.h"
#include "orchestrator/util.h"

int cmd_detokenize(int argc, char **argv) {
    (void)argc;
    (void)argv;
    util_error("detokenize: not available in this build yet (issue 4)");
    return ORCH_EXIT_USAGE;
}
