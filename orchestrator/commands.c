/*
 * commands.c - helpers shared by the cmd_*.c subcommand implementations.
 */
#include <string.h>

#include "orchestrator/commands.h"

int cmd_wants_help(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) break;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return 1;
    }
    return 0;
}
