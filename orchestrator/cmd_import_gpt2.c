/*
 * cmd_import_gpt2.c - placeholder for `orch import-gpt2` until issue 4 lands.
 */
#include <stdio.h>

#include "orchestrator/commands.h"
#include "orchestrator/util.h"

int cmd_import_gpt2(int argc, char **argv) {
    (void)argc;
    (void)argv;
    util_error("import-gpt2: not available in this build yet (issue 4)");
    return ORCH_EXIT_USAGE;
}
