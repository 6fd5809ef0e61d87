// client_test.mjs - the official OpenAI Node client (npm `openai`, installed by
// tools/setup.sh into data/node/node_modules) against `orch serve` on the
// mock engine: a non-streaming and a streaming completion and chat
// completion, with the mock's exactly predictable greedy text; structured
// output (response_format json_schema / json_object) and tools (required,
// named and streamed, a tool-result conversation, a refused schema).
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

// structured output: response_format json_schema and tools through the client's own types
const schema = {
  type: "object",
  properties: { city: { type: "string", maxLength: 10 }, temp: { type: "integer", minimum: -50, maximum: 50 } },
  required: ["city", "temp"], additionalProperties: false,
};
for (let seed = 0; seed < 4; seed++) {
  const r = await client.chat.completions.create({
    model: "mock-gpt2", messages, max_tokens: 200, seed,
    response_format: { type: "json_schema", json_schema: { name: "weather", schema, strict: true } },
  });
  const v = JSON.parse(r.choices[0].message.content);
  assert(typeof v.city === "string" && v.city.length <= 10 && Number.isInteger(v.temp) && v.temp >= -50 &&
         v.temp <= 50 && Object.keys(v).length === 2 && r.choices[0].finish_reason === "stop",
         "json_schema " + JSON.stringify(r.choices[0]));
}
const jo = await client.chat.completions.create({ model: "mock-gpt2", messages, max_tokens: 300, seed: 3,
  response_format: { type: "json_object" } });
assert(typeof JSON.parse(jo.choices[0].message.content) === "object", "json_object " + jo.choices[0].message.content);
const tools = [{ type: "function", function: { name: "get_weather", parameters: schema } }];
const tc = await client.chat.completions.create({ model: "mock-gpt2", messages, tools, tool_choice: "required", max_tokens: 200 });
const call = tc.choices[0].message.tool_calls?.[0];
assert(tc.choices[0].finish_reason === "tool_calls" && call && call.type === "function" && call.id.startsWith("call_") &&
       call.function.name === "get_weather" && typeof JSON.parse(call.function.arguments).temp === "number",
       "tool call " + JSON.stringify(tc.choices[0]));
const ts = await client.chat.completions.create({ model: "mock-gpt2", messages, tools, max_tokens: 200, stream: true,
  tool_choice: { type: "function", function: { name: "get_weather" } } });
let sargs = "", sname = "", sid = "", sfin = null;
for await (const chunk of ts) {
  const d = chunk.choices[0];
  if (!d) continue;
  for (const t of d.delta?.tool_calls ?? []) {
    if (t.id) sid = t.id;
    if (t.function?.name) sname = t.function.name;
    sargs += t.function?.arguments ?? "";
  }
  if (d.finish_reason) sfin = d.finish_reason;
}
assert(sid.startsWith("call_") && sname === "get_weather" && sfin === "tool_calls" &&
       typeof JSON.parse(sargs).city === "string", "streamed tool call " + sid + " " + sname + " " + sargs);
const follow = await client.chat.completions.create({ model: "mock-gpt2", max_tokens: 3, tools, tool_choice: "none",
  messages: [...messages, tc.choices[0].message, { role: "tool", tool_call_id: call.id, content: "sunny" }] });
assert(typeof follow.choices[0].message.content === "string", "tool result conversation");
try {
  await client.chat.completions.create({ model: "mock-gpt2", messages,
    response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "string", format: "email" } } } });
  assert(false, "unsupported keyword accepted");
} catch (e) {
  assert(e.status === 400 && /format/.test(e.message) && /json_schema\.schema/.test(e.message), "schema refusal " + e);
}

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
