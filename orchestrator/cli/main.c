/*
 * main.c - the orch command-line entry point: dispatches to subcommands.
 */
#include <stdio.h>
#include <string.h>

#include "engine_api/orch_engine.h"
#include "orchestrator/cli/commands.h"
#include "orchestrator/cli/version.h"
#include "orchestrator/core/util.h"

typedef struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} command;

static const command commands[] = {
    { "train", cmd_train, "train a model from a config (default: built-in)" },
    { "finetune", cmd_finetune,
      "LoRA fine-tuning of a checkpoint on JSONL (PEFT adapter)" },
    { "generate", cmd_generate, "generate text from a checkpoint" },
    { "eval", cmd_eval, "validation loss and perplexity of a checkpoint" },
    { "serve", cmd_serve, "OpenAI-compatible HTTP server" },
    { "route", cmd_route, "cache-aware router in front of several orch serve" },
    { "prepare", cmd_prepare, "tokenize a corpus into train/validation shards" },
    { "tokenize", cmd_tokenize, "text on stdin -> token ids" },
    { "detokenize", cmd_detokenize, "token ids on stdin -> text" },
    { "bench", cmd_bench, "training and inference benchmarks" },
    { "info", cmd_info, "show an engine's name, ABI, capabilities and probe" },
    { "config", cmd_config, "validate a config file (config check FILE)" },
    { "import-gpt2", cmd_import_gpt2, "the old name of import hf" },
    { "export", cmd_export, "a checkpoint as GGUF or Hugging Face (export gguf|hf)" },
    { "import", cmd_import, "GGUF or Hugging Face as a checkpoint (import gguf|hf)" },
};

static void usage(FILE *f) {
    fprintf(f, "usage: orch COMMAND [options]   (orch COMMAND --help for details)\n"
               "       orch --version\n"
               "\n"
               "orch trains, checkpoints and serves GPT-style language models\n"
               "through a pluggable engine (--engine=mock|cpu|cuda|FILE.so).\n"
               "\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\nexit status: 0 success, 1 runtime failure, 2 bad usage, input or "
               "engine;\n  train: 3 stopped by a signal after writing a checkpoint "
               "(requeue).\n");
}

static int version(void) {
    printf("orch %s (engine ABI %u.%u)\n", ORCH_VERSION, ORCH_ENGINE_ABI_MAJOR,
           ORCH_ENGINE_ABI_MINOR);
    return ORCH_EXIT_OK;
}

int main(int argc, char **argv) {
    if (argc < 2) { /* bare `orch`: say what it can do (`orch train` trains) */
        usage(stdout);
        return ORCH_EXIT_OK;
    }
    const char *name = argv[1];
    if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0 ||
        strcmp(name, "help") == 0) {
        usage(stdout);
        return ORCH_EXIT_OK;
    }
    if (strcmp(name, "--version") == 0 || strcmp(name, "version") == 0) return version();
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(commands[i].name, name) == 0)
            return commands[i].run(argc - 1, argv + 1);
    util_error("unknown command '%s' (see orch --help)", name);
    return ORCH_EXIT_USAGE;
}
