/*
 * config_schema.h - the schema of an orch run config (one table of key specs
 * per section: type, required, range, choices, default, where the value goes
 * in orch_config) and the validation of a parsed document against it. Used
 * by config.c (loading, --set overrides, serialisation); other modules use
 * config.h. The schema itself is documented in config.h.
 *
 * Memory: the tables are static; config_validate fills a caller struct.
 * Threads: reentrant (read-only tables).
 * Errors: config_validate returns 0 / -1 with "PATH: PROBLEM" in err (the
 * forms listed in config.h).
 */
#ifndef ORCH_CONFIG_SCHEMA_H
#define ORCH_CONFIG_SCHEMA_H

#include <stddef.h>

#include "orchestrator/core/config.h"

typedef enum config_key_type {
    CONFIG_KT_U32,
    CONFIG_KT_U64,
    CONFIG_KT_F64,
    CONFIG_KT_STR,
    CONFIG_KT_BOOL, /* true|false, stored as int */
    CONFIG_KT_OBJ   /* an object (or null) checked by config_validate itself;
                       nothing is stored by the table */
} config_key_type;

/* One key of a section. */
typedef struct config_key_spec {
    const char *name;
    config_key_type type;
    int required;
    double min, max;        /* numeric range (inclusive unless *_open) */
    int min_open, max_open; /* exclusive bounds */
    const char *choices;    /* STR: "a|b|c" or NULL (then non-empty) */
    size_t offset;          /* field offset inside the section struct */
    size_t cap;             /* STR: field capacity */
    double def_num;         /* default for optional numeric keys */
    const char *def_str;    /* default for optional string keys */
} config_key_spec;

typedef struct config_section_spec {
    const char *name;
    int required;
    const config_key_spec *keys;
    size_t n_keys;
    size_t offset; /* of the section struct inside orch_config */
} config_section_spec;

/* model, train, data, engine, in that order. */
extern const config_section_spec config_sections[];
extern const size_t config_n_sections;

/* The section named `name` / its key named `name`, or NULL. */
const config_section_spec *config_find_section(const char *name);
const config_key_spec *config_find_key(const config_section_spec *s, const char *name);
/* The key of a "section.key" path, or NULL. */
const config_key_spec *config_key_for_path(const char *path);

/* Validate doc (a const cJSON *, passed as void * so that this header does
 * not need cJSON.h) and fill every section of *cfg: defaults for absent
 * optional keys, derived model defaults, relations between keys. cfg's
 * fields before `source` are zeroed first. */
int config_validate(const void *doc, orch_config *cfg, char *err, size_t cap);

#endif
