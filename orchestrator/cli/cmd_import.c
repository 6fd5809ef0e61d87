/*
 * cmd_import.c - `orch import gguf FILE.gguf --out DIR`: the command line
 * around gguf_import (store/gguf_import.h), which turns a llama.cpp GGUF file
 * of a supported architecture into an orch checkpoint directory.
 */
#include <stdio.h>
#include <string.h>

#include "orchestrator/cli/commands.h"
#include "orchestrator/cli/flags.h"
#include "orchestrator/core/util.h"
#include "orchestrator/store/gguf_import.h"
#include "orchestrator/store/gpt2_import.h"

static const char usage_text[] =
    "usage: orch import gguf FILE.gguf --out DIR [options]\n"
    "\n"
    "Turn a GGUF file (llama.cpp's format; architecture gpt2 or llama with the\n"
    "GPT-2 tokenizer, or llama with a tokenizer turned into tokenizer.json; F32,\n"
    "F16, BF16 or Q8_0 tensors, dequantized to f32; llama's\n"
    "attn_q/attn_k rows permuted back to orch's RoPE layout) into a new\n"
    "checkpoint directory DIR for generate/eval/serve --checkpoint DIR and\n"
    "`orch train --init DIR`. (Hugging Face GPT-2: orch import hf.)\n"
    "\noptions:\n";

int cmd_import(int argc, char **argv) {
    gguf_import_opts o = { 0 };
    size_t n_pos = 0;
    const flag_spec flags[] = {
        { "--out", FLAG_STRING, &o.out_dir, "DIR",
          .help = "checkpoint directory to create (required, must not\nexist)" },
        { "--config", FLAG_STRING, &o.base_config, "FILE",
          .help = "take the train/data/engine sections from this\nconfig (the model "
                  "section comes from the file)" },
        { "--vocab-dir", FLAG_STRING, &o.vocab_dir, "D",
          .help = "GPT-2 encoder.json and vocab.bpe to compare the\nfile's tokenizer "
                  "with (default: the tokenizer search)" },
        { NULL },
    };
    const flags_cmd cmd = {
        .name = "import gguf",
        .usage = usage_text,
        .flags = flags,
        .footer = "exit status: 0 ok, 1 runtime failure, 2 bad usage or input file\n",
        .pos = &o.input,
        .max_pos = 1,
        .n_pos = &n_pos,
        .pos_name = "input file",
    };
    if (argc >= 2 && strcmp(argv[1], "hf") == 0)
        return cmd_import_hf(argc - 1, argv + 1, "import hf");
    if (argc < 2 || strcmp(argv[1], "gguf") != 0) {
        if (flags_wants_help(argc, argv)) {
            flags_print_usage(&cmd, stdout);
            return ORCH_EXIT_OK;
        }
        if (argc >= 2 && argv[1][0] == '-')
            util_error("import: unknown argument '%s' (see orch import --help)", argv[1]);
        else if (argc < 2)
            util_error("import: expected a format: orch import gguf|hf PATH --out DIR "
                       "(see orch import --help)");
        else
            util_error(
                "import: unknown format '%s' (supported: gguf, hf; see orch import "
                "--help)",
                argv[1]);
        return ORCH_EXIT_USAGE;
    }
    int rc;
    if (flags_parse(&cmd, argc - 1, argv + 1, &rc)) return rc;
    if (!o.input || !o.out_dir) {
        util_error("import gguf: need FILE.gguf and --out DIR (see orch import --help)");
        return ORCH_EXIT_USAGE;
    }
    char err[2048];
    gguf_import_result r;
    int kind = GPT2_IMPORT_ERR_INPUT;
    if (gguf_import(&o, &r, &kind, err, sizeof err) != 0) {
        util_error("import gguf: %s", err);
        return kind == GPT2_IMPORT_ERR_INPUT ? ORCH_EXIT_USAGE : ORCH_EXIT_FAILURE;
    }
    char kv[48] = "";
    if (strcmp(r.arch, "llama") == 0)
        snprintf(kv, sizeof kv, " (%u kv, %s head)", r.kv_heads,
                 r.tied ? "tied" : "untied");
    printf("imported GGUF %s: %u layers, %u heads%s, width %llu, mlp %llu, vocab %llu, "
           "context %llu, %llu parameters (tensors: %llu F32, %llu F16, %llu BF16, "
           "%llu Q8_0), tokenizer %s -> %s\n",
           r.arch, r.layers, r.heads, kv, (unsigned long long)r.width,
           (unsigned long long)r.mlp_width, (unsigned long long)r.vocab,
           (unsigned long long)r.context, (unsigned long long)r.params,
           (unsigned long long)r.n_f32, (unsigned long long)r.n_f16,
           (unsigned long long)r.n_bf16, (unsigned long long)r.n_q8_0, r.tokenizer,
           o.out_dir);
    return ORCH_EXIT_OK;
}
