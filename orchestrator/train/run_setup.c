/*
 * run_setup.c - fresh run vs --resume vs --init, the run directory, the
 * checkpoint, the merged config and the checks before `orch train` writes
 * anything (see run_setup.h).
 */
#include <glob.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "orchestrator/core/config.h"
#include "orchestrator/core/engine_loader.h"
#include "orchestrator/core/util.h"
#include "orchestrator/store/checkpoint.h"
#include "orchestrator/train/run_setup.h"

static int is_file(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* 1 if PATH/configs/default.json exists. */
static int has_default(const char *root) {
    char cand[PATH_MAX + 32];
    snprintf(cand, sizeof cand, "%s/configs/default.json", root);
    return is_file(cand);
}

/* The directory holding configs/default.json: o->default_root, else
 * <exe dir>/.. (resolved), else ".". */
static int find_default_root(const char *given, char *root, size_t cap) {
    if (given) {
        snprintf(root, cap, "%s", given);
        return has_default(root) ? 0 : -1;
    }
    char exe[PATH_MAX];
    if (util_exe_dir(exe, sizeof exe) == 0) {
        char r[PATH_MAX + 8];
        snprintf(r, sizeof r, "%s/..", exe);
        if (has_default(r)) {
            char real[PATH_MAX];
            if (realpath(r, real))
                snprintf(root, cap, "%s", real);
            else
                snprintf(root, cap, "%.*s", PATH_MAX - 1, r);
            return 0;
        }
    }
    snprintf(root, cap, ".");
    return has_default(root) ? 0 : -1;
}

/* Config basename without directory and .json: "configs/x.json" -> "x". */
static void config_stem(const char *path, char *out, size_t cap) {
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    snprintf(out, cap, "%s", b);
    size_t n = strlen(out);
    if (n > 5 && strcmp(out + n - 5, ".json") == 0) out[n - 5] = '\0';
}

/* The run directory of the options (see run_setup.h). */
static void choose_run_dir(const run_setup_opts *o, char *run_dir, size_t cap) {
    if (o->out_dir) {
        snprintf(run_dir, cap, "%s", o->out_dir);
    } else if (o->resume_from) {
        /* A checkpoint directory (holds state.json) belongs to its parent. */
        char sj[PATH_MAX + 16];
        snprintf(sj, sizeof sj, "%s/state.json", o->resume_from);
        snprintf(run_dir, cap, "%s", o->resume_from);
        if (is_file(sj)) {
            char *s = strrchr(run_dir, '/');
            while (s && s[1] == '\0' && s > run_dir) { /* trailing slash */
                *s = '\0';
                s = strrchr(run_dir, '/');
            }
            if (s)
                *s = '\0';
            else
                snprintf(run_dir, cap, ".");
        }
    } else if (o->config_path) {
        char stem[256];
        config_stem(o->config_path, stem, sizeof stem);
        snprintf(run_dir, cap, "runs/%s", stem);
    } else if (o->init_from) {
        snprintf(run_dir, cap, "runs/finetune");
    } else {
        snprintf(run_dir, cap, "runs/default");
    }
}

/* The newest complete checkpoint of `from` into out and its config into
 * *cfg; errors are prefixed with what (--resume, --init). */
static int take_checkpoint(const char *what, const char *from, char *out, size_t cap,
                           orch_config **cfg, run_setup *rs, char *err, size_t err_cap) {
    char e[2048];
    if (!out[0] &&
        ckpt_find_latest(from, out, cap, rs->warn, sizeof rs->warn, e, sizeof e) != 0) {
        util_set_err(err, err_cap, "%s: %s", what, e);
        return -1;
    }
    if (ckpt_read_config(out, cfg, NULL, 0, e, sizeof e) != 0) {
        util_set_err(err, err_cap, "%s: %s", what, e);
        return -1;
    }
    return 0;
}

/* The built-in default config, with relative data paths under its root. */
static int load_default(const run_setup_opts *o, orch_config **cfg, char *err,
                        size_t err_cap) {
    char root[PATH_MAX];
    if (find_default_root(o->default_root, root, sizeof root) != 0) {
        util_set_err(err, err_cap,
                     "no --config given and the built-in default "
                     "(configs/default.json next to orch or in the "
                     "current directory) is missing");
        return -1;
    }
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/configs/default.json", root);
    if (strcmp(root, ".") == 0) snprintf(path, sizeof path, "configs/default.json");
    if (config_load_file(path, cfg, err, err_cap) != 0) return -1;
    char sets[2][CONFIG_PATH_MAX + 16];
    const char *set_ptrs[2];
    const char *keys[2] = { "data.train", "data.val" };
    const char *vals[2] = { (*cfg)->data.train, (*cfg)->data.val };
    size_t n = 0;
    for (int k = 0; k < 2; k++) {
        if (vals[k][0] == '/' || strcmp(root, ".") == 0) continue;
        snprintf(sets[n], sizeof sets[n], "%s=%s/%s", keys[k], root, vals[k]);
        set_ptrs[n] = sets[n];
        n++;
    }
    if (config_apply_overrides(*cfg, set_ptrs, n, err, err_cap) != 0) {
        config_free(*cfg);
        *cfg = NULL;
        return -1;
    }
    return 0;
}

/* --set, then --steps and --engine. */
static int apply_overrides(const run_setup_opts *o, orch_config *cfg, char *err,
                           size_t err_cap) {
    const char **sets = util_calloc(o->n_sets + 3, sizeof *sets);
    if (!sets) {
        util_set_err(err, err_cap, "out of memory");
        return -1;
    }
    size_t n = 0;
    for (; n < o->n_sets; n++) sets[n] = o->sets[n];
    char steps_set[64], engine_set[CONFIG_PATH_MAX + 16];
    if (o->steps) {
        sets[n++] = "train.epochs=null";
        snprintf(steps_set, sizeof steps_set, "train.max_steps=%llu",
                 (unsigned long long)o->steps);
        sets[n++] = steps_set;
    }
    if (o->engine) {
        snprintf(engine_set, sizeof engine_set, "engine.name=%s", o->engine);
        sets[n++] = engine_set;
    }
    int rc = config_apply_overrides(cfg, sets, n, err, err_cap);
    free(sets);
    return rc;
}

/* The merged config against the checkpoint's model section. */
static int check_model_kept(const run_setup *rs, char *err, size_t err_cap) {
    const char *from = rs->resume_ckpt[0] ? rs->resume_ckpt : rs->init_ckpt;
    if (!from[0]) return 0;
    orch_config *check = NULL;
    char e[1024];
    if (ckpt_read_config(from, &check, NULL, 0, e, sizeof e) != 0) return 0;
    int same = config_same_model(rs->cfg, check);
    config_free(check);
    if (same) return 0;
    util_set_err(err, err_cap,
                 "%s: the model section cannot change (it differs from "
                 "%s/state.json)",
                 rs->resume_ckpt[0] ? "--resume" : "--init", from);
    return -1;
}

/* engine.name from a file (not --engine or --set engine.name=) must be a
 * built-in name unless trusted. */
static int check_engine_trust(const run_setup_opts *o, const run_setup *rs, char *err,
                              size_t err_cap) {
    if (o->engine) return 0;
    for (size_t i = 0; i < o->n_sets; i++)
        if (strncmp(o->sets[i], "engine.name=", 12) == 0) return 0;
    const char *ckpt = rs->resume_ckpt[0] ? rs->resume_ckpt : rs->init_ckpt;
    char origin[PATH_MAX + 16];
    if (o->config_path)
        snprintf(origin, sizeof origin, "%s", o->config_path);
    else if (ckpt[0])
        snprintf(origin, sizeof origin, "%s/state.json", ckpt);
    else
        snprintf(origin, sizeof origin, "%.*s", PATH_MAX, rs->cfg->source);
    return engine_check_config_name(rs->cfg->engine.name, origin, o->trust_config_engine,
                                    err, err_cap);
}

/* A fresh run must not silently mix with an existing one. */
static int check_fresh_dir(const run_setup *rs, char *err, size_t err_cap) {
    if (rs->resume_ckpt[0] || !is_dir(rs->run_dir)) return 0;
    char w[1024], e[1024], found[PATH_MAX];
    if (ckpt_find_latest(rs->run_dir, found, sizeof found, w, sizeof w, e, sizeof e) != 0)
        return 0;
    util_set_err(err, err_cap,
                 "%s already holds checkpoints (newest %s): use --resume "
                 "to continue it or --out for a new run",
                 rs->run_dir, found);
    return -1;
}

int run_setup_prepare(const run_setup_opts *o, run_setup *rs, char *err, size_t err_cap) {
    memset(rs, 0, sizeof *rs);
    if (o->init_from && o->resume) {
        util_set_err(err, err_cap,
                     "--init starts a new run; it cannot be combined "
                     "with --resume");
        return -1;
    }
    choose_run_dir(o, rs->run_dir, sizeof rs->run_dir);
    int resume = o->resume;
    int using_default = !o->config_path && !resume && !o->init_from;
    if (using_default && !o->out_dir) { /* the default continues its own run */
        char w[1024], e[1024];
        if (is_dir(rs->run_dir) &&
            ckpt_find_latest(rs->run_dir, rs->resume_ckpt, sizeof rs->resume_ckpt, w,
                             sizeof w, e, sizeof e) == 0) {
            resume = 1;
            using_default = 0; /* take the checkpoint's config */
            rs->default_continued = 1;
        } else {
            rs->resume_ckpt[0] = '\0';
        }
    }
    orch_config *ckpt_cfg = NULL;
    if (resume &&
        take_checkpoint("--resume", o->resume_from ? o->resume_from : rs->run_dir,
                        rs->resume_ckpt, sizeof rs->resume_ckpt, &ckpt_cfg, rs, err,
                        err_cap) != 0)
        goto fail;
    if (o->init_from &&
        take_checkpoint("--init", o->init_from, rs->init_ckpt, sizeof rs->init_ckpt,
                        &ckpt_cfg, rs, err, err_cap) != 0)
        goto fail;

    if (o->config_path) {
        if (config_load_file(o->config_path, &rs->cfg, err, err_cap) != 0) goto fail;
        if (ckpt_cfg && !config_same_model(rs->cfg, ckpt_cfg)) {
            util_set_err(err, err_cap,
                         "%s: the model section of %s differs from the "
                         "one in %s/state.json",
                         o->init_from ? "--init" : "--resume", o->config_path,
                         o->init_from ? rs->init_ckpt : rs->resume_ckpt);
            goto fail;
        }
    } else if (ckpt_cfg) {
        rs->cfg = ckpt_cfg;
        ckpt_cfg = NULL;
    } else if (load_default(o, &rs->cfg, err, err_cap) != 0) {
        goto fail;
    }
    if (apply_overrides(o, rs->cfg, err, err_cap) != 0 ||
        check_model_kept(rs, err, err_cap) != 0 ||
        check_fresh_dir(rs, err, err_cap) != 0 ||
        check_engine_trust(o, rs, err, err_cap) != 0)
        goto fail;
    config_free(ckpt_cfg);
    return 0;
fail:
    config_free(ckpt_cfg);
    run_setup_free(rs);
    return -1;
}

void run_setup_free(run_setup *rs) {
    config_free(rs->cfg);
    rs->cfg = NULL;
}

static int glob_matches(const char *pattern) {
    glob_t g;
    int rc = glob(pattern, 0, NULL, &g);
    size_t n = rc == 0 ? g.gl_pathc : 0;
    if (rc == 0) globfree(&g);
    return n > 0;
}

int run_setup_default_corpus(const orch_config *cfg, char *data_dir, size_t cap) {
    if (glob_matches(cfg->data.train) && glob_matches(cfg->data.val)) return 0;
    char want[64];
    snprintf(want, sizeof want, "kjv-%s", cfg->data.tokenizer);
    char dir[CONFIG_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", cfg->data.train);
    char *slash = strrchr(dir, '/');
    if (!slash) return 0;
    *slash = '\0';
    char *base = strrchr(dir, '/');
    const char *leaf = base ? base + 1 : dir;
    if (strcmp(leaf, want) != 0) return 0;
    if (base) {
        *base = '\0';
        snprintf(data_dir, cap, "%s", *dir ? dir : "/");
    } else {
        snprintf(data_dir, cap, ".");
    }
    return 1;
}
