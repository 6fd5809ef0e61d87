/*
 * out_dir.c - take back the --out directories a failed command created; see
 * out_dir.h.
 */
#include "orchestrator/cli/out_dir.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

void out_dir_guard_begin(out_dir_guard *g, const char *dir) {
    memset(g, 0, sizeof *g);
    if (!dir || snprintf(g->path, sizeof g->path, "%s", dir) >= (int)sizeof g->path)
        return;
    size_t len = strlen(g->path);
    while (len > 1 && g->path[len - 1] == '/') g->path[--len] = '\0';
    while (len > 0 && g->n < sizeof g->cut / sizeof g->cut[0]) {
        char save = g->path[len];
        g->path[len] = '\0';
        int exists = access(g->path, F_OK) == 0 || strcmp(g->path, ".") == 0 ||
                     strcmp(g->path, "..") == 0;
        g->path[len] = save;
        if (exists) break;
        g->cut[g->n++] = len;
        while (len > 0 && g->path[len - 1] != '/') len--; /* up to the parent */
        while (len > 1 && g->path[len - 1] == '/') len--;
        if (len == 1 && g->path[0] == '/') break;
    }
}

void out_dir_guard_undo(out_dir_guard *g) {
    for (size_t i = 0; i < g->n; i++) {
        g->path[g->cut[i]] = '\0';
        if (rmdir(g->path) != 0) break; /* not empty, or not there: keep the rest */
    }
    g->n = 0;
}
