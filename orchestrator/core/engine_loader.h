/*
 * engine_loader.h - finds, opens and validates an engine shared library and
 * creates contexts on it. The only orchestrator module that calls dlopen.
 *
 * `--engine=VALUE` accepts:
 *   mock | cpu | cuda          -> libengine_<name>.so, searched as below
 *   a file name (libfoo.so)    -> searched in $ORCH_ENGINE_PATH (colon list),
 *                                 then next to the orch binary, then the system
 *                                 library path (dlopen's own search)
 *   a path (contains '/')      -> used as is
 * The library is opened with RTLD_NOW|RTLD_LOCAL and rejected, with one line
 * naming the file and the reason, when: it is missing, it is not a shared
 * library, it lacks the entry symbol, its ABI major differs (both versions
 * named), its table is shorter than ABI 1.0, a required member is NULL, or its
 * probe() says it cannot run here.
 *
 * A FIFO, device or directory given as the library is refused without
 * blocking.
 *
 * Trust: a path or a file name is only loaded when it came from the command
 * line. An engine.name read from a config file or a checkpoint's state.json
 * must be one of the built-in names (ENGINE_BUILTIN_NAMES) unless the user
 * passed --trust-config-engine; engine_check_config_name says so, and callers
 * run it BEFORE engine_load (dlopen runs a library's constructors before any
 * check could).
 *
 * Thread rules: engine_load/engine_unload are not thread-safe with respect to
 * the same handle; distinct handles are independent.
 * Memory: the handle owns the dlopen handle; engine_unload releases it (after
 * every context on it has been destroyed).
 */
#ifndef ORCH_ENGINE_LOADER_H
#define ORCH_ENGINE_LOADER_H

#include <stddef.h>
#include <stdint.h>

#include "engine_api/orch_engine.h"

typedef struct engine_handle {
    void *dl;                   /* dlopen handle */
    const orch_engine_api *api; /* validated table */
    char path[4096];            /* file that was opened */
    char probe_msg[1024];       /* what probe() said */
} engine_handle;

/* The built-in engines, as a message lists them. */
#define ENGINE_BUILTIN_NAMES "mock, cpu, cuda"

/* 1 when name is a built-in engine name (mock, cpu, cuda), else 0. */
int engine_is_builtin_name(const char *name);

/* An engine.name taken from a file (a config file or a checkpoint's
 * state.json, named by origin) rather than the command line: 0 when it is a
 * built-in name or trusted is set, else -1 with one line in err, e.g.
 *   "run/ckpt-00000003/state.json: config engine.name 'x.so' is a library
 *    path; paths are only accepted from the command line: pass --engine=x.so,
 *    or --trust-config-engine"
 *   "cfg.json: config engine.name 'foo' is not a built-in engine (mock, cpu,
 *    cuda); other engines are only accepted from the command line: pass
 *    --engine=foo, or --trust-config-engine". */
int engine_check_config_name(const char *name, const char *origin, int trusted, char *err,
                             size_t err_cap);

/* Resolve VALUE to a file name/path into out (see above). Returns 0, or -1 with
 * a message in err when nothing was found. */
int engine_resolve(const char *value, char *out, size_t out_cap, char *err,
                   size_t err_cap);

/* Open, validate and probe. Returns 0 and fills *out, or -1 with a one-line
 * message "engine 'FILE': REASON" in err (out untouched). */
int engine_load(const char *value, engine_handle *out, char *err, size_t err_cap);

/* Close the library. Safe on a zeroed or already-unloaded handle. */
void engine_unload(engine_handle *h);

/* Create a context. threads 0 = all cores; options may be NULL. Returns 0, or
 * -1 with "engine NAME: cannot create context: STATUS: MESSAGE" in err. A
 * llama model is refused without calling the engine when its ABI minor is 0
 * ("engine 'FILE': ABI version 1.0 cannot run model.arch llama (llama needs
 * ABI 1.1 or later)"): such an engine would ignore the 1.1 members. */
int engine_create_context(const engine_handle *h, const orch_model_desc *model,
                          uint32_t threads, uint64_t seed, const char *options,
                          orch_engine_ctx **out, char *err, size_t err_cap);

/* Format the most recent failure on ctx as "STATUS TEXT: LAST ERROR". */
void engine_format_error(const engine_handle *h, const orch_engine_ctx *ctx,
                         int32_t status, char *buf, size_t cap);

/* Human list of capability bits, e.g. "train,infer,kv-copy". */
void engine_caps_string(uint64_t caps, char *buf, size_t cap);

#endif
