/*
 * cmd_bench.c - placeholder for `orch bench` until issue 3 lands.
 */
#include <stdio.h>

#include "orchestrator/commands.h"
#include "orchestrator/util.h"

int cmd_bench(int argc, char **argv) {
    (void)argc;
    (void)argv;
    util_error("bench: not available in this build yet (issue 3)");
    return ORCH_EXIT_USAGE;
}
