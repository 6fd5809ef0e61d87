/*
 * engine_loader.c - resolve, dlopen, validate and probe engine libraries.
 * See engine_loader.h for the rules.
 */
#include "orchestrator/core/engine_loader.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "orchestrator/core/fsio.h"
#include "orchestrator/core/util.h"

static int file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

int engine_is_builtin_name(const char *name) {
    static const char *const builtin[] = { "mock", "cpu", "cuda" };
    for (size_t i = 0; name && i < sizeof builtin / sizeof builtin[0]; i++)
        if (strcmp(name, builtin[i]) == 0) return 1;
    return 0;
}

int engine_check_config_name(const char *name, const char *origin, int trusted, char *err,
                             size_t err_cap) {
    if (trusted || engine_is_builtin_name(name)) return 0;
    const char *n = name ? name : "";
    int path = strchr(n, '/') != NULL || strstr(n, ".so") != NULL;
    util_set_err(err, err_cap,
                 "%s%sconfig engine.name '%s' is %s; %s are only accepted from the "
                 "command line: pass --engine=%s, or --trust-config-engine",
                 origin ? origin : "", origin ? ": " : "", n,
                 path ? "a library path"
                      : "not a built-in engine (" ENGINE_BUILTIN_NAMES ")",
                 path ? "paths" : "other engines", n);
    return -1;
}

int engine_resolve(const char *value, char *out, size_t out_cap, char *err,
                   size_t err_cap) {
    if (!value || !*value) {
        util_set_err(err, err_cap, "empty --engine value");
        return -1;
    }
    if (strchr(value, '/')) {
        snprintf(out, out_cap, "%s", value);
        return 0;
    }
    char file[512];
    size_t n = strlen(value);
    if (n > 3 && (strstr(value, ".so") != NULL))
        snprintf(file, sizeof file, "%s", value);
    else
        snprintf(file, sizeof file, "libengine_%s.so", value);

    /* 1. $ORCH_ENGINE_PATH */
    const char *env = getenv("ORCH_ENGINE_PATH");
    if (env && *env) {
        char dirs[4096];
        snprintf(dirs, sizeof dirs, "%s", env);
        char *save = NULL;
        for (char *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
            char cand[4096 + 512];
            snprintf(cand, sizeof cand, "%s/%s", d, file);
            if (file_exists(cand)) {
                snprintf(out, out_cap, "%s", cand);
                return 0;
            }
        }
    }
    /* 2. next to the orch binary */
    char exe[4096];
    if (util_exe_dir(exe, sizeof exe) == 0) {
        char cand[4096 + 512];
        snprintf(cand, sizeof cand, "%s/%s", exe, file);
        if (file_exists(cand)) {
            snprintf(out, out_cap, "%s", cand);
            return 0;
        }
    }
    /* 3. the system library path: leave the bare name for dlopen. */
    snprintf(out, out_cap, "%s", file);
    return 0;
}

static int check_elf(const char *path, char *why, size_t cap) {
    int fd;
    char msg[512];
    if (fsio_open_regular(path, &fd, NULL, msg, sizeof msg) != 0) {
        if (errno == EISDIR || errno == EINVAL)
            snprintf(why, cap, "%s, not a shared library",
                     errno == EISDIR ? "is a directory" : "not a regular file");
        else
            snprintf(why, cap, "cannot open: %s", strerror(errno));
        return -1;
    }
    unsigned char magic[4] = { 0 };
    ssize_t n = read(fd, magic, 4);
    close(fd);
    if (n != 4 || memcmp(magic,
                         "\x7f"
                         "ELF",
                         4) != 0) {
        snprintf(why, cap, "not a shared library (no ELF header)");
        return -1;
    }
    return 0;
}

/* Members every engine must provide, and those a capability requires. */
struct member_req {
    const char *name;
    size_t offset;
    uint64_t cap; /* 0 = always required */
};
#define MEMBER(m, c) \
    { #m, offsetof(orch_engine_api, m), c }
static const struct member_req required_members[] = {
    MEMBER(probe, 0),
    MEMBER(status_string, 0),
    MEMBER(context_create, 0),
    MEMBER(context_destroy, 0),
    MEMBER(last_error, 0),
    MEMBER(tensor_count, 0),
    MEMBER(tensor_info, 0),
    MEMBER(tensor_read, 0),
    MEMBER(tensor_write, 0),
    MEMBER(grads_zero, ORCH_CAP_TRAIN),
    MEMBER(grads_read, ORCH_CAP_TRAIN),
    MEMBER(grads_write, ORCH_CAP_TRAIN),
    MEMBER(forward_backward, ORCH_CAP_TRAIN),
    MEMBER(optimizer_step, ORCH_CAP_TRAIN),
    MEMBER(eval_loss, ORCH_CAP_EVAL),
    MEMBER(kv_block_bytes, ORCH_CAP_INFER),
    MEMBER(kv_configure, ORCH_CAP_INFER),
    MEMBER(infer_forward, ORCH_CAP_INFER),
    MEMBER(kv_copy_blocks, ORCH_CAP_KV_COPY),
    /* ABI 1.4: an engine that claims adapters must provide all their calls. */
    MEMBER(adapter_create, ORCH_CAP_LORA),
    MEMBER(adapter_destroy, ORCH_CAP_LORA),
    MEMBER(adapter_tensor_count, ORCH_CAP_LORA),
    MEMBER(adapter_tensor_info, ORCH_CAP_LORA),
    MEMBER(adapter_tensor_read, ORCH_CAP_LORA),
    MEMBER(adapter_tensor_write, ORCH_CAP_LORA),
    MEMBER(adapter_grads_zero, ORCH_CAP_LORA),
    MEMBER(adapter_grads_read, ORCH_CAP_LORA),
    MEMBER(adapter_grads_write, ORCH_CAP_LORA),
    MEMBER(adapter_forward_backward, ORCH_CAP_LORA),
    MEMBER(adapter_eval_loss, ORCH_CAP_LORA),
    MEMBER(adapter_optimizer_step, ORCH_CAP_LORA),
    MEMBER(coserve_forward, ORCH_CAP_COSERVE),
    /* ABI 1.5: token-level fine-tuning. */
    MEMBER(ft_stream_open, ORCH_CAP_FT_STREAM),
    MEMBER(ft_stream_close, ORCH_CAP_FT_STREAM),
    MEMBER(coserve_step, ORCH_CAP_FT_STREAM),
};
#undef MEMBER

/* Size of the ABI 1.0 table: the end of its last member. */
#define ABI_1_0_SIZE (offsetof(orch_engine_api, kv_copy_blocks) + sizeof(void (*)(void)))

int engine_load(const char *value, engine_handle *out, char *err, size_t err_cap) {
    char path[4096];
    if (engine_resolve(value, path, sizeof path, err, err_cap) != 0) return -1;

    char why[1024] = "";
    int has_slash = strchr(path, '/') != NULL;
    if (has_slash) {
        if (access(path, F_OK) != 0) {
            util_set_err(err, err_cap, "engine '%s': file not found", path);
            return -1;
        }
        if (check_elf(path, why, sizeof why) != 0) {
            util_set_err(err, err_cap, "engine '%s': %s", path, why);
            return -1;
        }
    }
    dlerror();
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!dl) {
        const char *e = dlerror();
        if (!has_slash) {
            util_set_err(err, err_cap,
                         "engine '%s': not found in $ORCH_ENGINE_PATH, next to "
                         "orch, or the system library path (%s)",
                         path, e ? e : "dlopen failed");
        } else {
            util_set_err(err, err_cap, "engine '%s': not a loadable shared library (%s)",
                         path, e ? e : "dlopen failed");
        }
        return -1;
    }
    dlerror();
    void *sym = dlsym(dl, ORCH_ENGINE_ENTRY_SYMBOL);
    if (!sym) {
        util_set_err(err, err_cap, "engine '%s': missing entry symbol %s", path,
                     ORCH_ENGINE_ENTRY_SYMBOL);
        dlclose(dl);
        return -1;
    }
    orch_engine_get_api_fn get_api;
    memcpy(&get_api, &sym, sizeof get_api);
    const orch_engine_api *api = get_api(ORCH_ENGINE_ABI_MAJOR);
    if (!api) {
        util_set_err(err, err_cap,
                     "engine '%s': does not provide ABI major %u (%s returned "
                     "NULL)",
                     path, ORCH_ENGINE_ABI_MAJOR, ORCH_ENGINE_ENTRY_SYMBOL);
        dlclose(dl);
        return -1;
    }
    if (api->abi_major != ORCH_ENGINE_ABI_MAJOR) {
        util_set_err(err, err_cap,
                     "engine '%s': ABI version mismatch: engine has %u.%u, orch "
                     "needs %u.x",
                     path, api->abi_major, api->abi_minor, ORCH_ENGINE_ABI_MAJOR);
        dlclose(dl);
        return -1;
    }
    if (api->struct_size < ABI_1_0_SIZE) {
        util_set_err(err, err_cap,
                     "engine '%s': function table too short (%u bytes, ABI 1.0 "
                     "needs %zu)",
                     path, api->struct_size, (size_t)ABI_1_0_SIZE);
        dlclose(dl);
        return -1;
    }
    if (!api->name || !*api->name) {
        util_set_err(err, err_cap, "engine '%s': table has no name", path);
        dlclose(dl);
        return -1;
    }
    for (size_t i = 0; i < sizeof required_members / sizeof required_members[0]; i++) {
        const struct member_req *r = &required_members[i];
        if (r->cap && !(api->capabilities & r->cap)) continue;
        if (api->struct_size < r->offset + sizeof(void (*)(void))) {
            /* A capability of a later minor claimed by a table too short
             * to hold its calls. */
            util_set_err(err, err_cap,
                         "engine '%s': claims a capability whose member '%s' is "
                         "beyond its function table (%u bytes, ABI %u.%u)",
                         path, r->name, api->struct_size, api->abi_major, api->abi_minor);
            dlclose(dl);
            return -1;
        }
        const void *fn;
        memcpy(&fn, (const char *)api + r->offset, sizeof fn);
        if (!fn) {
            util_set_err(err, err_cap, "engine '%s': required member '%s' is NULL", path,
                         r->name);
            dlclose(dl);
            return -1;
        }
    }
    char msg[1024] = "";
    int32_t st = api->probe(msg, sizeof msg);
    msg[sizeof msg - 1] = '\0';
    if (st != ORCH_OK) {
        util_set_err(err, err_cap, "engine '%s': cannot run here: %s", path,
                     *msg ? msg : api->status_string(st));
        dlclose(dl);
        return -1;
    }
    memset(out, 0, sizeof *out);
    out->dl = dl;
    out->api = api;
    snprintf(out->path, sizeof out->path, "%s", path);
    snprintf(out->probe_msg, sizeof out->probe_msg, "%s", msg);
    return 0;
}

void engine_unload(engine_handle *h) {
    if (!h) return;
    /* Under sanitizers keep the library mapped so leak reports can name
     * engine frames. */
    if (h->dl && !getenv("ORCH_SAN")) dlclose(h->dl);
    h->dl = NULL;
    h->api = NULL;
}

int engine_create_context(const engine_handle *h, const orch_model_desc *model,
                          uint32_t threads, uint64_t seed, const char *options,
                          orch_engine_ctx **out, char *err, size_t err_cap) {
    orch_engine_options o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.threads = threads;
    o.seed = seed;
    o.options = options;
    if (model && model->arch == ORCH_ARCH_LLAMA && h->api->abi_minor < 1) {
        /* A 1.0 engine reads the 1.1 members (flags, rope scaling) as
         * reserved words and would ignore them. */
        util_set_err(err, err_cap,
                     "engine '%s': ABI version %u.%u cannot run model.arch llama "
                     "(llama needs ABI %u.1 or later)",
                     h->path, h->api->abi_major, h->api->abi_minor,
                     ORCH_ENGINE_ABI_MAJOR);
        return -1;
    }
    char msg[1024] = "";
    orch_engine_ctx *ctx = NULL;
    int32_t st = h->api->context_create(model, &o, &ctx, msg, sizeof msg);
    msg[sizeof msg - 1] = '\0';
    if (st != ORCH_OK || !ctx) {
        util_set_err(err, err_cap, "engine %s: cannot create context: %s%s%s",
                     h->api->name, h->api->status_string(st), *msg ? ": " : "", msg);
        return -1;
    }
    *out = ctx;
    return 0;
}

void engine_format_error(const engine_handle *h, const orch_engine_ctx *ctx,
                         int32_t status, char *buf, size_t cap) {
    const char *le = ctx ? h->api->last_error(ctx) : "";
    util_set_err(buf, cap, "%s%s%s", h->api->status_string(status),
                 (le && *le) ? ": " : "", le ? le : "");
}

void engine_caps_string(uint64_t caps, char *buf, size_t cap) {
    static const struct {
        uint64_t bit;
        const char *name;
    } names[] = { { ORCH_CAP_TRAIN, "train" },
                  { ORCH_CAP_INFER, "infer" },
                  { ORCH_CAP_KV_COPY, "kv-copy" },
                  { ORCH_CAP_EVAL, "eval" },
                  { ORCH_CAP_DETERMINISTIC, "deterministic" },
                  { ORCH_CAP_GPU, "gpu" },
                  { ORCH_CAP_FAULT_INJECTION, "fault-injection" },
                  { ORCH_CAP_LORA, "lora" },
                  { ORCH_CAP_COSERVE, "coserve" },
                  { ORCH_CAP_FT_STREAM, "ft-stream" } };
    size_t used = 0;
    if (cap) buf[0] = '\0';
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (!(caps & names[i].bit)) continue;
        int n = snprintf(buf + used, cap > used ? cap - used : 0, "%s%s", used ? "," : "",
                         names[i].name);
        if (n > 0) used += (size_t)n;
        if (used >= cap) break;
    }
    if (cap && used == 0) snprintf(buf, cap, "none");
}
