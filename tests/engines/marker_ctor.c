/* marker_ctor.c - a VALID (capability-less) test engine whose library
 * constructor creates the file named by $ORCH_TEST_MARKER: it shows whether
 * orch dlopened it at all, since a constructor runs before the loader can
 * check anything. The trust tests (tests/trust_cli.sh) name it in a
 * checkpoint's or config's engine.name and assert that the marker does not
 * appear unless the library came from --engine or --trust-config-engine. */
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include "tests/engines/broken_common.h"

__attribute__((constructor)) static void write_marker(void) {
    const char *path = getenv("ORCH_TEST_MARKER");
    if (!path || !*path) return;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return;
    static const char text[] = "marker_ctor: constructor ran\n";
    ssize_t w = write(fd, text, sizeof text - 1);
    (void)w;
    close(fd);
}

static const orch_engine_api api = { BROKEN_BASE_TABLE("marker-ctor") };

const orch_engine_api *orch_engine_get_api(uint32_t abi_major) {
    (void)abi_major;
    return &api;
}
