/*
 * cmd_eval.c - `orch eval`: validation loss and perplexity of a checkpoint
 * over the validation shards named in its config, on the same fixed,
 * evenly spaced evaluation windows the training loop uses
 * (data_eval_set_build), so the numbers match the run's val_loss.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/cli/commands.h"
#include "orchestrator/cli/flags.h"
#include "orchestrator/data/data_loader.h"
#include "orchestrator/infer/inference_model.h"
#include "orchestrator/data/shard.h"
#include "orchestrator/core/util.h"

int cmd_eval(int argc, char **argv) {
    const char *ckpt = NULL, *engine = NULL, *val = NULL, *quantize = NULL;
    uint64_t batches = 0;
    int threads = -1, trust_engine = 0;
    const flag_spec flags[] = {
        { "--checkpoint", FLAG_STRING, &ckpt, "DIR",
          .help = "run directory (newest complete checkpoint) or a\n"
                  "checkpoint directory (required)" },
        { "--batches", FLAG_U64, &batches, "N",
          .help = "number of batches (default: train.eval_batches)", .min = 1,
          .max = 1048576 },
        { "--val", FLAG_STRING, &val, "GLOB",
          .help = "validation shards (default: the config's data.val)" },
        { "--engine", FLAG_STRING, &engine, "E",
          .help = "engine (default: the checkpoint config's)" },
        { "--trust-config-engine", FLAG_TRUE, &trust_engine, NULL,
          .help = "load the checkpoint config's engine even when it\n"
                  "is a library file or path (default: only mock,\n"
                  "cpu and cuda)" },
        { "--threads", FLAG_INT, &threads, "N",
          .help = "engine threads (default: the config's)", .min = 0, .max = 4096 },
        { "--quantize", FLAG_STRING, &quantize, "FMT",
          .help = "weights as FMT for inference: int8 (engine option\n"
                  "weights=int8: int8 blocks of 32, fp32 scales) or\n"
                  "fp32 (default)" },
        { NULL },
    };
    const flags_cmd cmd = {
        .name = "eval",
        .usage = "usage: orch eval --checkpoint DIR [options]\n"
                 "\n"
                 "Print the validation loss and perplexity of a checkpoint over the\n"
                 "validation shards named in its config (data.val), on the same fixed\n"
                 "windows training evaluates (train.eval_batches batches of\n"
                 "train.micro_batch x train.seq_len tokens).\n"
                 "\noptions:\n",
        .flags = flags,
        .footer = "\n--quantize int8 evaluates the weights rounded to int8 (the cpu\n"
                  "engine computes the loss in fp32 on the dequantized values).\n"
                  "output lines: checkpoint, step, tokens, val_loss, perplexity\n"
                  "exit status: 0 ok, 1 runtime failure, 2 bad usage/checkpoint/data/"
                  "engine\n",
    };
    int st;
    if (flags_parse(&cmd, argc, argv, &st)) return st;
    if (!ckpt) {
        util_error("eval: --checkpoint DIR is required (see orch eval --help)");
        return ORCH_EXIT_USAGE;
    }
    char err[2048], warn[2048], qopts[64];
    const char *options = inference_model_quantize_options(quantize, NULL, qopts,
                                                           sizeof qopts, err, sizeof err);
    if (quantize && !options) {
        util_error("eval: %s", err);
        return ORCH_EXIT_USAGE;
    }
    inference_model m;
    inference_model_opts mo = { ckpt, engine, threads, options,
                                trust_engine ? INFERENCE_MODEL_TRUST_CONFIG_ENGINE : 0 };
    if (inference_model_open(&mo, &m, warn, sizeof warn, err, sizeof err) != 0) {
        util_error("eval: %s", err);
        return ORCH_EXIT_USAGE;
    }
    if (warn[0]) util_warn("%s", warn);
    int rc = ORCH_EXIT_USAGE;
    dataset *ds = NULL;
    data_eval_set es;
    memset(&es, 0, sizeof es);
    const orch_config *cfg = m.cfg;
    if (!(m.engine.api->capabilities & ORCH_CAP_EVAL)) {
        util_error("eval: engine %s cannot evaluate (no eval capability)",
                   m.engine.api->name);
        goto out;
    }
    if (!val) val = cfg->data.val;
    if (dataset_open(val, &ds, err, sizeof err) != 0) {
        util_error("eval: validation data: %s", err);
        goto out;
    }
    if (strcmp(dataset_tokenizer_name(ds), cfg->data.tokenizer) != 0 ||
        dataset_vocab_size(ds) > m.desc.vocab_size) {
        util_error("eval: validation shards '%s' were made with tokenizer %s "
                   "(vocab %u) but the model uses %s (vocab %u)",
                   val, dataset_tokenizer_name(ds), dataset_vocab_size(ds),
                   cfg->data.tokenizer, m.desc.vocab_size);
        goto out;
    }
    uint32_t nb = batches ? (uint32_t)batches : cfg->train.eval_batches;
    uint32_t bsz = cfg->train.micro_batch, T = cfg->train.seq_len;
    if (data_eval_set_build(ds, nb, bsz, T, &es, err, sizeof err) != 0) {
        util_error("eval: %s", err);
        goto out;
    }
    rc = ORCH_EXIT_FAILURE;
    double sum = 0;
    size_t per = (size_t)bsz * T;
    for (uint32_t b = 0; b < es.n_batches; b++) {
        float loss = 0;
        int32_t st = m.engine.api->eval_loss(m.ctx, es.tokens + b * per,
                                             es.targets + b * per, bsz, T, &loss);
        if (st != ORCH_OK) {
            engine_format_error(&m.engine, m.ctx, st, err, sizeof err);
            util_error("eval: eval_loss (batch %u): %s", b, err);
            goto out;
        }
        sum += loss;
    }
    double mean = sum / es.n_batches;
    printf("checkpoint: %s\n", m.ckpt_dir);
    printf("step: %llu\n", (unsigned long long)m.step);
    printf("tokens: %llu (%u batches x %u x %u)\n",
           (unsigned long long)es.n_batches * per, es.n_batches, bsz, T);
    printf("val_loss: %.9g\n", mean);
    printf("perplexity: %.9g\n", exp(mean));
    rc = isfinite(mean) ? ORCH_EXIT_OK : ORCH_EXIT_FAILURE;
    if (rc != ORCH_EXIT_OK) util_error("eval: the loss is not finite");
out:
    data_eval_set_free(&es);
    dataset_close(ds);
    inference_model_close(&m);
    return rc;
}
