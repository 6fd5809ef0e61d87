/*
 * cmd_export.c - `orch export gguf CKPT --out F.gguf` and `orch export hf
 * CKPT --out DIR`: the command lines around gguf_export (store/gguf_export.h),
 * which writes an orch checkpoint as a GGUF file that llama.cpp loads, and
 * hf_export (store/hf_export.h), which writes it as a Hugging Face
 * GPT2LMHeadModel directory.
 */
#include <stdio.h>
#include <string.h>

#include "orchestrator/cli/commands.h"
#include "orchestrator/cli/flags.h"
#include "orchestrator/core/util.h"
#include "orchestrator/store/gguf_export.h"
#include "orchestrator/store/gpt2_import.h"
#include "orchestrator/store/hf_export.h"

static const char usage_text[] =
    "usage: orch export gguf CKPT --out FILE.gguf [--type f32|f16|q8_0]\n"
    "\n"
    "Write the checkpoint CKPT (a run directory: its newest complete\n"
    "checkpoint; or a checkpoint directory) as a GGUF v3 file for llama.cpp\n"
    "(architecture gpt2 or llama, tokenizer metadata, llama.cpp's tensor\n"
    "names; llama's attn_q/attn_k rows permuted to llama.cpp's RoPE pairs).\n"
    "Checkpoints with the gpt2 tokenizer, or llama ones with an hf\n"
    "tokenizer.json that GGUF can express, export: the byte tokenizer has no\n"
    "GGUF equivalent. (Hugging Face: orch export hf.)\n"
    "\noptions:\n";

static const char hf_usage_text[] =
    "usage: orch export hf CKPT --out DIR [--type f32|f16|bf16]\n"
    "\n"
    "Write the checkpoint CKPT (a run directory: its newest complete\n"
    "checkpoint; or a checkpoint directory) of a gpt2 or llama model as a new\n"
    "Hugging Face directory DIR that transformers loads as GPT2LMHeadModel or\n"
    "LlamaForCausalLM: config.json, generation_config.json, model.safetensors\n"
    "(HF's tensor names; GPT-2's Conv1D weights [in, out]) and, for the gpt2\n"
    "tokenizer, vocab.json, merges.txt and tokenizer_config.json (an hf\n"
    "tokenizer: copies of its files). A byte-tokenizer checkpoint exports\n"
    "without tokenizer files (Hugging Face has no such tokenizer; said on\n"
    "stderr). `orch import hf DIR` reads it back.\n"
    "\noptions:\n";

static int export_hf(int argc, char **argv) {
    hf_export_opts o = { 0 };
    size_t n_pos = 0;
    const flag_spec flags[] = {
        { "--out", FLAG_STRING, &o.out, "DIR",
          .help = "the directory to create (required, must not\nexist)" },
        { "--type", FLAG_STRING, &o.type, "T",
          .help = "f32 (default, bit-exact), f16 or bf16" },
        { "--vocab-dir", FLAG_STRING, &o.vocab_dir, "D",
          .help = "GPT-2 encoder.json and vocab.bpe (default: the\ntokenizer search, "
                  "see orch tokenize --help)" },
        { NULL },
    };
    const flags_cmd cmd = {
        .name = "export hf",
        .usage = hf_usage_text,
        .flags = flags,
        .footer = "exit status: 0 ok, 1 runtime failure, 2 bad usage or checkpoint\n",
        .pos = &o.ckpt,
        .max_pos = 1,
        .n_pos = &n_pos,
        .pos_name = "checkpoint",
    };
    int rc;
    if (flags_parse(&cmd, argc, argv, &rc)) return rc;
    if (!o.ckpt || !o.out) {
        util_error("export hf: need CKPT and --out DIR (see orch export hf --help)");
        return ORCH_EXIT_USAGE;
    }
    char err[2048];
    static hf_export_result r;
    int kind = GPT2_IMPORT_ERR_INPUT;
    if (hf_export(&o, &r, &kind, err, sizeof err) != 0) {
        util_error("export hf: %s", err);
        return kind == GPT2_IMPORT_ERR_INPUT ? ORCH_EXIT_USAGE : ORCH_EXIT_FAILURE;
    }
    if (r.warn[0]) fprintf(stderr, "orch: warning: %s\n", r.warn);
    if (r.no_tokenizer)
        fprintf(stderr,
                "orch: warning: export hf: the byte tokenizer has no Hugging "
                "Face equivalent: %s holds no tokenizer files\n",
                o.out);
    printf("exported %s: %u layers, %llu tensors, %llu parameters, type %s -> %s "
           "(Hugging Face %s)\n",
           r.ckpt_dir, r.layers, (unsigned long long)r.tensors,
           (unsigned long long)r.params, o.type ? o.type : "f32", o.out,
           r.llama ? "LlamaForCausalLM" : "GPT2LMHeadModel");
    return ORCH_EXIT_OK;
}

int cmd_export(int argc, char **argv) {
    gguf_export_opts o = { 0 };
    size_t n_pos = 0;
    const flag_spec flags[] = {
        { "--out", FLAG_STRING, &o.out, "FILE",
          .help = "the .gguf file to write (required; replaced\natomically)" },
        { "--type", FLAG_STRING, &o.type, "T",
          .help = "f32 (default), f16 or q8_0 (blocks of 32 int8\nwith an f16 scale); "
                  "vectors stay f32" },
        { "--vocab-dir", FLAG_STRING, &o.vocab_dir, "D",
          .help = "GPT-2 encoder.json and vocab.bpe (default: the\ntokenizer search, "
                  "see orch tokenize --help)" },
        { NULL },
    };
    const flags_cmd cmd = {
        .name = "export gguf",
        .usage = usage_text,
        .flags = flags,
        .footer = "exit status: 0 ok, 1 runtime failure, 2 bad usage or checkpoint\n",
        .pos = &o.ckpt,
        .max_pos = 1,
        .n_pos = &n_pos,
        .pos_name = "checkpoint",
    };
    if (argc >= 2 && strcmp(argv[1], "hf") == 0) return export_hf(argc - 1, argv + 1);
    if (argc < 2 || strcmp(argv[1], "gguf") != 0) {
        if (flags_wants_help(argc, argv)) {
            flags_print_usage(&cmd, stdout);
            return ORCH_EXIT_OK;
        }
        if (argc >= 2 && argv[1][0] == '-')
            util_error("export: unknown argument '%s' (see orch export --help)", argv[1]);
        else if (argc < 2)
            util_error("export: expected a format: orch export gguf|hf CKPT --out "
                       "PATH (see orch export --help)");
        else
            util_error(
                "export: unknown format '%s' (supported: gguf, hf; see orch export "
                "--help)",
                argv[1]);
        return ORCH_EXIT_USAGE;
    }
    int rc;
    if (flags_parse(&cmd, argc - 1, argv + 1, &rc)) return rc;
    if (!o.ckpt || !o.out) {
        util_error("export gguf: need CKPT and --out FILE.gguf (see orch export --help)");
        return ORCH_EXIT_USAGE;
    }
    char err[2048];
    static gguf_export_result r;
    int kind = GPT2_IMPORT_ERR_INPUT;
    if (gguf_export(&o, &r, &kind, err, sizeof err) != 0) {
        util_error("export gguf: %s", err);
        return kind == GPT2_IMPORT_ERR_INPUT ? ORCH_EXIT_USAGE : ORCH_EXIT_FAILURE;
    }
    if (r.warn[0]) fprintf(stderr, "orch: warning: %s\n", r.warn);
    printf("exported %s: %u layers, %llu tensors, %llu parameters, type %s -> %s "
           "(%llu bytes)\n",
           r.ckpt_dir, r.layers, (unsigned long long)r.tensors,
           (unsigned long long)r.params, o.type ? o.type : "f32", o.out,
           (unsigned long long)r.bytes);
    return ORCH_EXIT_OK;
}
