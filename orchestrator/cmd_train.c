/*
 * cmd_train.c - placeholder for `orch train` until issue 4 lands.
 */
#include <stdio.h>

#include "orchestrator/commands.h"
#include "orchestrator/util.h"

int cmd_train(int argc, char **argv) {
    (void)argc;
    (void)argv;
    util_error("train: not available in this build yet (issue 4)");
    return ORCH_EXIT_USAGE;
}
