/*
 * cmd_import_gpt2.c - `orch import-gpt2`: the command line around gpt2_import
 * (store/gpt2_import.h), which converts GPT-2 weights in the Hugging Face
 * layout into an orch checkpoint directory that generate, eval and serve load
 * and that `orch train --init DIR` fine-tunes.
 */
#include <stdio.h>

#include "orchestrator/cli/commands.h"
#include "orchestrator/cli/flags.h"
#include "orchestrator/core/util.h"
#include "orchestrator/store/gpt2_import.h"

static const char usage_text[] =
    "usage: orch import-gpt2 MODEL.safetensors --out DIR [options]\n"
    "\n"
    "Import GPT-2 weights in the Hugging Face layout into a new checkpoint\n"
    "directory DIR (model.safetensors, state.json with the config, checksums;\n"
    "no optimizer state). Use it with generate/eval/serve --checkpoint DIR,\n"
    "and fine-tune it with `orch train --init DIR` (the config's data section\n"
    "points at data/finetune/{train,val}_*.bin unless --config gives one).\n"
    "\noptions:\n";

int cmd_import_gpt2(int argc, char **argv) {
    gpt2_import_opts o = { 0 };
    size_t n_in = 0;
    const flag_spec flags[] = {
        { "--out", FLAG_STRING, &o.out_dir, "DIR",
          .help = "checkpoint directory to create (required, must not\nexist)" },
        { "--heads", FLAG_U32, &o.heads, "N",
          .help = "attention heads (default: n_head of config.json next\n"
                  "to MODEL, else width/64)",
          .min = 1, .max = 4096 },
        { "--hf-config", FLAG_STRING, &o.hf_config, "FILE",
          .help =
              "Hugging Face config.json to read n_head and\nlayer_norm_epsilon from" },
        { "--tokenizer", FLAG_STRING, &o.tokenizer, "T",
          .help = "gpt2|byte (default gpt2 when the vocabulary has\n"
                  "50257+ tokens, else byte)" },
        { "--config", FLAG_STRING, &o.base_config, "FILE",
          .help = "take the train/data/engine sections from this\n"
                  "config (the model section comes from the weights)" },
        { "--config-out", FLAG_STRING, &o.config_out, "FILE",
          .help = "also write the resulting config to FILE" },
        { NULL },
    };
    const flags_cmd cmd = {
        .name = "import-gpt2",
        .usage = usage_text,
        .flags = flags,
        .footer = "exit status: 0 ok, 1 runtime failure, 2 bad usage or input file\n",
        .pos = &o.input,
        .max_pos = 1,
        .n_pos = &n_in,
        .pos_name = "input file",
    };
    int rc;
    if (flags_parse(&cmd, argc, argv, &rc)) return rc;
    if (!o.input || !o.out_dir) {
        util_error("import-gpt2: need MODEL.safetensors and --out DIR (see orch "
                   "import-gpt2 --help)");
        return ORCH_EXIT_USAGE;
    }
    char err[2048];
    gpt2_import_result r;
    int kind;
    if (gpt2_import(&o, &r, &kind, err, sizeof err) != 0) {
        util_error("import-gpt2: %s", err);
        return kind == GPT2_IMPORT_ERR_INPUT ? ORCH_EXIT_USAGE : ORCH_EXIT_FAILURE;
    }
    printf("imported GPT-2: %u layers, %u heads, width %llu, mlp %llu, vocab "
           "%llu, context %llu, %llu parameters, tokenizer %s -> %s\n",
           r.layers, r.heads, (unsigned long long)r.width,
           (unsigned long long)r.mlp_width, (unsigned long long)r.vocab,
           (unsigned long long)r.context, (unsigned long long)r.params, r.tokenizer,
           o.out_dir);
    return ORCH_EXIT_OK;
}
