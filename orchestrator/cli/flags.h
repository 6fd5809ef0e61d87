/*
 * flags.h - the table-driven command-line parser of the orch subcommands.
 *
 * A command describes its flags once, as a table of flag_spec (name, kind,
 * destination, metavar, help text, allowed range) inside a flags_cmd (the
 * command's name, its --help text, where positional arguments go), and one
 * call parses argv:
 *
 *   - "--name=value" and "--name value" (the next argument is taken whatever
 *     it looks like, so --prompt -x works); a value-less flag (FLAG_TRUE,
 *     FLAG_FALSE) is "--name" alone; FLAG_OPTIONAL is "--name" or
 *     "--name=value" (never the next argument);
 *   - "--help" or "-h" anywhere (outside flag values and after no "--") prints
 *     the usage and ends parsing with FLAGS_HELP, even when other arguments
 *     are wrong;
 *   - "--" ends the flags: what follows is positional;
 *   - an argument that does not start with '-' (or is "-" alone) is
 *     positional when the command takes positionals;
 *   - the same flag given twice: the last one counts (FLAG_LIST appends).
 *
 * Error texts (one line, no "orch: error:" prefix; CMD is flags_cmd.name):
 *   CMD: unknown argument 'ARG' (see orch CMD --help)
 *   CMD: --name: missing value
 *   CMD: --name: takes no value ('ARG')
 *   CMD: --name 'VALUE': expected a non-negative integer
 *                        expected a positive integer
 *                        expected an integer
 *                        expected an integer >= MIN
 *                        expected an integer in [MIN, MAX]
 *                        expected a number
 *                        expected a number > MIN   (>= MIN)
 *                        expected a number in [MIN, MAX]   ((MIN, MAX])
 *   CMD: too many --name options (at most N)
 *   CMD: more than one POS given ('FIRST', 'ARG')     (max_pos == 1)
 *   CMD: more than N POS given ('ARG')                (max_pos > 1)
 *
 * --help output: flags_cmd.usage verbatim, then one line per flag that has a
 * help text ("  --name ARG   help", continuation lines after each '\n' of
 * the help aligned under it), then flags_cmd.footer verbatim.
 *
 * A command (its destinations are its locals, so the table is an automatic
 * array; entries name .help and later fields by designator):
 *     uint64_t steps = 0;
 *     const char *out = NULL;
 *     const flag_spec flags[] = {
 *         { "--steps", FLAG_U64, &steps, "N", .help = "train to step N", .min = 1 },
 *         { "--out", FLAG_STRING, &out, "DIR", .help = "run directory" },
 *         { NULL },
 *     };
 *     const flags_cmd cmd = { .name = "train", .usage = "usage: ...\n\n",
 *                             .flags = flags };
 *     int rc;
 *     if (flags_parse(&cmd, argc, argv, &rc)) return rc;
 *
 * Memory: string destinations point into argv (nothing is allocated).
 * Threads: no shared state; a table may be used from any thread.
 * Errors: flags_parse_args fills err and returns FLAGS_ERROR; flags_parse
 * (the CLI wrapper) prints the line with util_error. On an error the
 * destinations of flags parsed before it may already be written.
 */
#ifndef ORCH_FLAGS_H
#define ORCH_FLAGS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum flag_kind {
    FLAG_STRING,   /* const char *: the value */
    FLAG_OPTIONAL, /* const char *: "--name" (leaves it, sets *seen) or
                      "--name=VALUE" (non-empty) */
    FLAG_LIST,     /* const char *[max]: each occurrence appended, *count */
    FLAG_U64,      /* uint64_t */
    FLAG_U32,      /* uint32_t */
    FLAG_INT,      /* int */
    FLAG_I64,      /* int64_t */
    FLAG_DOUBLE,   /* double */
    FLAG_FLOAT,    /* float (parsed as double, range checked, narrowed) */
    FLAG_TRUE,     /* int set to 1; takes no value */
    FLAG_FALSE     /* int set to 0; takes no value (e.g. --no-echo) */
} flag_kind;

typedef struct flag_spec {
    const char *name; /* with the dashes: "--max-tokens"; NULL ends a table */
    flag_kind kind;
    void *dst;        /* destination of the kind's type */
    const char *arg;  /* metavar in the usage: "N", "FILE", "[=DIR]" */
    const char *help; /* usage text ('\n' = continuation); NULL: unlisted */
    /* Integer kinds: allowed [min, max]; max 0 means the type's largest
     * value; min == max == 0 means the type's whole range. FLAG_LIST: max is
     * the capacity of dst (required). */
    int64_t min, max;
    /* Number kinds: allowed [dmin, dmax] when dmin < dmax (dmax may be
     * HUGE_VAL); dmin_open excludes dmin itself. */
    double dmin, dmax;
    int dmin_open;
    int *seen;     /* set to 1 when the flag is given; may be NULL */
    size_t *count; /* FLAG_LIST: entries in dst (required) */
} flag_spec;

typedef struct flags_cmd {
    const char *name;       /* "generate", "bench train": starts each message */
    const char *usage;      /* --help text before the flag lines */
    const flag_spec *flags; /* ends with an entry whose name is NULL */
    const char *footer;     /* --help text after the flag lines; may be NULL */
    const char **pos;       /* positional arguments (NULL: none taken) */
    size_t max_pos;         /* capacity of pos */
    size_t *n_pos;          /* positional arguments found */
    const char *pos_name;   /* "FILE": names them in errors */
} flags_cmd;

enum { FLAGS_OK = 0, FLAGS_HELP = 1, FLAGS_ERROR = 2 };

/* Parse argv[1..argc-1] (argv[0] is the command's name). Returns FLAGS_OK,
 * FLAGS_HELP after printing the usage to help_out (if not NULL), or
 * FLAGS_ERROR with one line in err. */
int flags_parse_args(const flags_cmd *c, int argc, char **argv, FILE *help_out, char *err,
                     size_t err_cap);

/* The CLI form: returns 0 to go on, or 1 when the command should return
 * *exit_status now: ORCH_EXIT_OK after --help printed the usage to stdout,
 * ORCH_EXIT_USAGE after printing the error line (util_error). */
int flags_parse(const flags_cmd *c, int argc, char **argv, int *exit_status);

/* Print the --help text of c to f. */
void flags_print_usage(const flags_cmd *c, FILE *f);

/* 1 if argv[1..] holds --help or -h before any "--" (for commands that read
 * a subcommand before they know their flag table). */
int flags_wants_help(int argc, char **argv);

#endif
