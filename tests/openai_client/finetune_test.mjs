// finetune_test.mjs - the official OpenAI Node client's fine-tuning API
// (npm `openai`) against `orch serve --state-dir` (mock engine): upload a
// JSONL, create a job, follow it to "succeeded", list its events and
// checkpoints, use the fine-tuned model at once, and cancel a second job.
// usage: node finetune_test.mjs BASE_URL NODE_MODULES_DIR TRAIN.jsonl
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";

const [baseURL, modules, train] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(modules), "noop.js"));
const OpenAI = require("openai").default ?? require("openai").OpenAI;

function assert(cond, msg) {
  if (!cond) {
    console.error("FAIL: " + msg);
    process.exit(1);
  }
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const client = new OpenAI({ baseURL, apiKey: "sekret", maxRetries: 0, timeout: 20000 });

const file = await client.files.create({ file: fs.createReadStream(train), purpose: "fine-tune" });
let job = await client.fineTuning.jobs.create({
  model: "mock-gpt2",
  training_file: file.id,
  hyperparameters: { n_epochs: 1, batch_size: 2, learning_rate_multiplier: "auto" },
  suffix: "node",
  seed: 7,
});
assert(job.object === "fine_tuning.job" && job.status === "validating_files", "create " + JSON.stringify(job));
for (let i = 0; i < 200 && !["succeeded", "failed", "cancelled"].includes(job.status); i++) {
  await sleep(50);
  job = await client.fineTuning.jobs.retrieve(job.id);
}
assert(job.status === "succeeded", "job ended " + JSON.stringify(job));
assert(job.fine_tuned_model && job.fine_tuned_model.startsWith("ft:mock-gpt2:node:"), "name " + job.fine_tuned_model);
assert(job.trained_tokens > 0, "trained_tokens " + job.trained_tokens);

const list = await client.fineTuning.jobs.list({ limit: 10 });
assert(list.data.some((j) => j.id === job.id), "jobs.list");
const events = await client.fineTuning.jobs.listEvents(job.id, { limit: 100 });
assert(events.data.some((e) => /^Step \d+\/\d+: training loss=/.test(e.message)), "events " + JSON.stringify(events.data.slice(0, 3)));
const ckpts = await client.fineTuning.jobs.checkpoints.list(job.id);
assert(ckpts.data.length === 1 && ckpts.data[0].fine_tuned_model_checkpoint === job.fine_tuned_model, "checkpoints " + JSON.stringify(ckpts.data));

const models = await client.models.list();
assert(models.data.some((m) => m.id === job.fine_tuned_model), "models.list " + JSON.stringify(models.data));
const c = await client.completions.create({ model: job.fine_tuned_model, prompt: "Hello", max_tokens: 4, temperature: 0 });
assert(c.model === job.fine_tuned_model && c.choices[0].text.length > 0, "completion " + JSON.stringify(c));

let second = await client.fineTuning.jobs.create({ model: "mock-gpt2", training_file: file.id, hyperparameters: { n_epochs: 50 } });
second = await client.fineTuning.jobs.cancel(second.id);
assert(second.status === "cancelled", "cancel " + JSON.stringify(second));
let refused = null;
try {
  await client.fineTuning.jobs.create({ model: "gpt-4o-mini", training_file: file.id });
} catch (e) {
  refused = e;
}
assert(refused && refused.status === 400 && /not served here/.test(refused.message), "unknown model: " + (refused && refused.message));
console.log("ok " + job.fine_tuned_model);
