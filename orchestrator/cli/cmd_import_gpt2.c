/*
 * cmd_import_gpt2.c - `orch import hf` and its older name `orch import-gpt2`:
 * the command line around gpt2_import (store/gpt2_import.h), which converts
 * GPT-2 weights in the Hugging Face layout (a model directory, or one
 * safetensors file) into an orch checkpoint directory that generate, eval and
 * serve load and that `orch train --init DIR` fine-tunes.
 */
#include <stdio.h>

#include "orchestrator/cli/commands.h"
#include "orchestrator/cli/flags.h"
#include "orchestrator/core/util.h"
#include "orchestrator/store/gpt2_import.h"

#include <string.h>

static const char usage_hf[] =
    "usage: orch import hf HF_DIR|MODEL.safetensors --out DIR [options]\n";
static const char usage_gpt2[] =
    "usage: orch import-gpt2 HF_DIR|MODEL.safetensors --out DIR [options]\n"
    "(the older name of orch import hf)\n";
static const char usage_text[] =
    "\n"
    "Import GPT-2 or LLaMA-family weights in the Hugging Face layout into a new\n"
    "checkpoint directory DIR. HF_DIR is a Hugging Face GPT2LMHeadModel or\n"
    "LlamaForCausalLM (also Mistral and Qwen2 configs that map exactly)\n"
    "directory: config.json (the model's shape) and model.safetensors, or shards\n"
    "listed in model.safetensors.index.json; F32, F16 or BF16. A llama model's\n"
    "tokenizer.json (and tokenizer_config.json, generation_config.json) are\n"
    "copied into DIR, its tokenizer recorded as hf. The new checkpoint\n"
    "holds model.safetensors, state.json with the config and checksums (no\n"
    "optimizer state). Use it with generate/eval/serve --checkpoint DIR,\n"
    "and fine-tune it with `orch train --init DIR` (the config's data section\n"
    "points at data/finetune/{train,val}_*.bin unless --config gives one).\n"
    "\noptions:\n";

int cmd_import_gpt2(int argc, char **argv) {
    return cmd_import_hf(argc, argv, "import-gpt2");
}

int cmd_import_hf(int argc, char **argv, const char *name) {
    int hf = strcmp(name, "import hf") == 0;
    char usage[2048];
    snprintf(usage, sizeof usage, "%s%s", hf ? usage_hf : usage_gpt2, usage_text);
    gpt2_import_opts o = { 0 };
    size_t n_in = 0;
    const flag_spec flags[] = {
        { "--out", FLAG_STRING, &o.out_dir, "DIR",
          .help = "checkpoint directory to create (required, must not\nexist)" },
        { "--heads", FLAG_U32, &o.heads, "N",
          .help = "attention heads (default: n_head of config.json in\n"
                  "HF_DIR or next to MODEL, else width/64)",
          .min = 1, .max = 4096 },
        { "--hf-config", FLAG_STRING, &o.hf_config, "FILE",
          .help =
              "Hugging Face config.json to read n_head and\nlayer_norm_epsilon from" },
        { "--tokenizer", FLAG_STRING, &o.tokenizer, "T",
          .help = "gpt2|byte|hf (default: hf for a llama model,\n"
                  "else gpt2 when the vocabulary has 50257+ tokens, else\nbyte)" },
        { "--config", FLAG_STRING, &o.base_config, "FILE",
          .help = "take the train/data/engine sections from this\n"
                  "config (the model section comes from the weights)" },
        { "--config-out", FLAG_STRING, &o.config_out, "FILE",
          .help = "also write the resulting config to FILE" },
        { NULL },
    };
    const flags_cmd cmd = {
        .name = name,
        .usage = usage,
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
        util_error("%s: need %s and --out DIR (see orch %s --help)", name,
                   hf ? "HF_DIR" : "MODEL.safetensors", name);
        return ORCH_EXIT_USAGE;
    }
    char err[2048];
    gpt2_import_result r;
    int kind;
    if (gpt2_import(&o, &r, &kind, err, sizeof err) != 0) {
        util_error("%s: %s", name, err);
        return kind == GPT2_IMPORT_ERR_INPUT ? ORCH_EXIT_USAGE : ORCH_EXIT_FAILURE;
    }
    if (strcmp(r.arch, "llama") == 0)
        printf("imported llama: %u layers, %u heads, %u kv heads, width %llu, mlp %llu, "
               "vocab %llu, context %llu, %s head, %llu parameters, tokenizer %s -> %s\n",
               r.layers, r.heads, r.kv_heads, (unsigned long long)r.width,
               (unsigned long long)r.mlp_width, (unsigned long long)r.vocab,
               (unsigned long long)r.context, r.tied ? "tied" : "untied",
               (unsigned long long)r.params, r.tokenizer, o.out_dir);
    else
        printf("imported GPT-2: %u layers, %u heads, width %llu, mlp %llu, vocab "
               "%llu, context %llu, %llu parameters, tokenizer %s -> %s\n",
               r.layers, r.heads, (unsigned long long)r.width,
               (unsigned long long)r.mlp_width, (unsigned long long)r.vocab,
               (unsigned long long)r.context, (unsigned long long)r.params, r.tokenizer,
               o.out_dir);
    return ORCH_EXIT_OK;
}
