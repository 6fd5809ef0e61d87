/*
 * cmd_tokenize.c - placeholder for `orch tokenize` until issue 4 lands.
 */
#include <stdio.h>

#include "orchestrator/commands.h"
#include "orchestrator/util.h"

int cmd_tokenize(int argc, char **argv) {
    (void)argc;
    (void)argv;
    util_error("tokenize: not available in this build yet (issue 4)");
    return ORCH_EXIT_USAGE;
}
