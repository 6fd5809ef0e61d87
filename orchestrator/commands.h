/*
 * commands.h - entry points of the orch subcommands, one cmd_*.c file each.
 *
 * Each takes the arguments after the command name (argv[0] is the command
 * name), handles --help/-h by printing usage to stdout and returning 0, and
 * returns the process exit status (ORCH_EXIT_* in util.h, or a documented
 * command-specific one). Errors are reported as one line via util_error.
 */
#ifndef ORCH_COMMANDS_H
#define ORCH_COMMANDS_H

int cmd_info(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_prepare(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_config(int argc, char **argv);
int cmd_import_gpt2(int argc, char **argv);

/* True if any argument is --help or -h. */
int cmd_wants_help(int argc, char **argv);

#endif
