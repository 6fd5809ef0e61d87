// client_test.mjs - the official OpenAI Node client (npm `openai`, installed by
// tools/setup.sh into data/node/node_modules) against `orch serve` on the
// mock engine: a non-streaming and a streaming completion and chat
// completion, with the mock's exactly predictable greedy text.
// usage: node client_test.mjs BASE_URL NODE_MODULES_DIR
import { createRequire } from "node:module";
import path from "node:path";

const [baseURL, modules] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(modules), "noop.js"));
const OpenAI = require("openai").default ?? require("openai").OpenAI;

// The mock's greedy rule: next = 97 + (sum of token ids so far) mod 26 (byte tokens).
function greedy(prompt, n) {
  let s = [...Buffer.from(prompt, "utf8")].reduce((a, b) => a + b, 0);
  let out = "";
  for (let i = 0; i < n; i++) {
    const c = 97 + (s % 26);
    out += String.fromCharCode(c);
    s += c;
  }
  return out;
}

function assert(cond, msg) {
  if (!cond) {
    console.error("FAIL: " + msg);
    process.exit(1);
  }
}

const client = new OpenAI({ baseURL, apiKey: "sekret", maxRetries: 0, timeout: 20000 });

const models = await client.models.list();
assert(models.data.length === 1 && models.data[0].id === "mock-gpt2", "models.list: " + JSON.stringify(models.data));

const c = await client.completions.create({ model: "mock-gpt2", prompt: "Hello from node", max_tokens: 12, temperature: 0 });
assert(c.choices[0].text === greedy("Hello from node", 12), "completion text " + JSON.stringify(c));
assert(c.usage.completion_tokens === 12 && c.choices[0].finish_reason === "length", "completion usage/finish");

const stream = await client.completions.create({
  model: "mock-gpt2", prompt: "Streaming from node", max_tokens: 9, temperature: 0, stream: true,
  stream_options: { include_usage: true },
});
let text = "", chunks = 0, usage = null;
for await (const chunk of stream) {
  if (chunk.choices.length) { text += chunk.choices[0].text; chunks++; }
  if (chunk.usage) usage = chunk.usage;
}
assert(text === greedy("Streaming from node", 9), "streamed text " + text);
assert(chunks === 9 && usage && usage.completion_tokens === 9, "stream chunks " + chunks + " usage " + JSON.stringify(usage));

const messages = [{ role: "user", content: "Hi" }];
const prompt = "User: Hi\nAssistant:";
const chat = await client.chat.completions.create({ model: "mock-gpt2", messages, max_completion_tokens: 5, temperature: 0 });
assert(chat.choices[0].message.content === greedy(prompt, 5), "chat " + JSON.stringify(chat.choices));

const cs = await client.chat.completions.create({ model: "mock-gpt2", messages, max_tokens: 6, temperature: 0, stream: true });
let ctext = "";
for await (const chunk of cs) ctext += chunk.choices[0]?.delta?.content ?? "";
assert(ctext === greedy(prompt, 6), "chat stream " + ctext);

// errors surface as the client's typed errors
try {
  await client.completions.create({ model: "nope", prompt: "x" });
  assert(false, "unknown model accepted");
} catch (e) {
  assert(e.status === 404 && e.code === "model_not_found", "error mapping " + e);
}
const bad = new OpenAI({ baseURL, apiKey: "wrong", maxRetries: 0 });
try {
  await bad.completions.create({ model: "mock-gpt2", prompt: "x" });
  assert(false, "wrong key accepted");
} catch (e) {
  assert(e.status === 401, "401 mapping " + e);
}
console.log("openai node client: ok");
