/*
 * commands.h - entry points of the orch subcommands, one cmd_*.c file each.
 *
 * Each takes the arguments after the command name (argv[0] is the command
 * name), parses them with the table-driven parser of flags.h (which handles
 * --help/-h by printing the usage to stdout and returning 0), and returns the
 * process exit status (ORCH_EXIT_* in util.h, or a documented
 * command-specific one). Errors are reported as one line via util_error.
 */
#ifndef ORCH_COMMANDS_H
#define ORCH_COMMANDS_H

#include <stddef.h>

int cmd_info(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_finetune(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_route(int argc, char **argv);
int cmd_prepare(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_config(int argc, char **argv);
int cmd_import_gpt2(int argc, char **argv);
/* `orch import hf` and its old name `orch import-gpt2`: name ("import hf" or
 * "import-gpt2") is the command in usage and messages; argv[0] is skipped. */
int cmd_import_hf(int argc, char **argv, const char *name);
int cmd_export(int argc, char **argv);
int cmd_import(int argc, char **argv);

struct tokenizer;
/* Shared front half of `tokenize` and `detokenize`: parse --tokenizer and
 * --vocab-dir (argv[0] is the command name, used in messages; usage and
 * footer frame the --help text, see flags.h), open the tokenizer and read all
 * of stdin. Returns 0 with *t and *in (NUL-terminated, *len bytes) owned by
 * the caller (tokenizer_free, free), or 1 when the command should return
 * *exit_status now (after --help, or after printing one error line; nothing
 * held). */
int cmd_open_tokenizer_read_stdin(int argc, char **argv, const char *usage,
                                  const char *footer, struct tokenizer **t, char **in,
                                  size_t *len, int *exit_status);

#endif
