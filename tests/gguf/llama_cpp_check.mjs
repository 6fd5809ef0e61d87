// llama_cpp_check.mjs - loads a GGUF written by `orch export gguf` in
// llama.cpp (npm node-llama-cpp, prebuilt CPU library) and compares, prompt
// by prompt, its greedy continuation and next-token log-probabilities with
// orch serve's (/v1/completions, temperature 0, logprobs 5) on an orch
// checkpoint with the same weights.
//
// usage: node llama_cpp_check.mjs MODULES FILE.gguf ORCH_URL MAX_TOKENS TOL PROMPT...
//   MODULES   node_modules holding node-llama-cpp
//   TOL       largest |logprob(llama) - logprob(orch)| allowed, per top-5 token
//             and per chosen token, over every step of every prompt
// Checks: the prompt tokenizes to the same ids in both (so tokenizer
// metadata and vocabulary agree); the greedy texts are equal; every logprob
// orch reports (chosen and top 5) is within TOL of llama.cpp's log-softmax of
// its raw logits for the same token. Prints the largest difference seen.
// With EXPECT_DIR set, EXPECT_DIR/N.txt (N the prompt's index) holds
// `orch generate --temperature 0 --no-echo` output for prompt N, which must
// be llama.cpp's text too (plus the newline generate ends with).
// Exit status 0 when everything agrees, 1 otherwise (the reason printed).
import { readFileSync } from "node:fs";
const [modules, gguf, url, maxTokensArg, tolArg, ...prompts] = process.argv.slice(2);
const maxTokens = Number(maxTokensArg), tol = Number(tolArg);
const { getLlama, LlamaLogLevel } = await import(modules + "/node-llama-cpp/dist/index.js");
const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error,
                               progressLogs: false });
const model = await llama.loadModel({ modelPath: gguf });
const EOT = 50256;
let worst = 0, failed = 0;
const fail = (msg) => { console.log("FAIL: " + msg); failed++; };

async function orchCompletion(prompt) {
  const r = await fetch(url + "/v1/completions", {
    method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ prompt, max_tokens: maxTokens, temperature: 0, logprobs: 5 }),
  });
  if (r.status !== 200) throw new Error("orch serve: HTTP " + r.status + " " + (await r.text()));
  return (await r.json()).choices[0];
}

async function orchTokenize(prompt) {
  const r = await fetch(url + "/tokenize", {
    method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ prompt }),
  });
  if (r.status !== 200) throw new Error("orch /tokenize: HTTP " + r.status);
  return (await r.json()).tokens;
}

// llama.cpp greedy decoding with full logits at each step.
async function llamaGreedy(ctx, prompt) {
  const seq = ctx.getSequence();
  const ids = model.tokenize(prompt);
  const steps = [];
  let input = ids.map((t, i) => i === ids.length - 1 ? [t, { generateNext: { logits: true } }] : t);
  for (let s = 0; s < maxTokens; s++) {
    const res = await seq.controlledEvaluate(input);
    const logits = res[input.length - 1].next.logits;
    let best = -1, bestv = -Infinity, max = -Infinity;
    for (const [t, v] of logits) { if (v > max) max = v; if (v > bestv || (v === bestv && t < best)) { best = t; bestv = v; } }
    let sum = 0;
    for (const v of logits.values()) sum += Math.exp(v - max);
    const lse = max + Math.log(sum);
    const logprob = new Map();
    for (const [t, v] of logits) logprob.set(t, v - lse);
    steps.push({ token: best, logprob });
    if (best === EOT) break;
    input = [[best, { generateNext: { logits: true } }]];
  }
  seq.dispose();
  return { ids, steps };
}

// f32 KV cache and no flash attention: the f32 math orch does (the default
// f16 cache alone moves logprobs by ~3e-3).
const ctx = await model.createContext({ contextSize: 256, threads: 1, flashAttention: false,
  experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32" });
for (const [pi, prompt] of prompts.entries()) {
  const [orchIds, oc, ll] = [await orchTokenize(prompt), await orchCompletion(prompt), await llamaGreedy(ctx, prompt)];
  if (JSON.stringify(orchIds) !== JSON.stringify(Array.from(ll.ids)))
    fail(`'${prompt}': prompt tokens differ: orch ${JSON.stringify(orchIds)}, llama.cpp ${JSON.stringify(Array.from(ll.ids))}`);
  const llTokens = ll.steps.map((s) => s.token).filter((t) => t !== EOT);
  const llText = model.detokenize(llTokens);
  if (llText !== oc.text) {
    fail(`'${prompt}': greedy text differs: orch ${JSON.stringify(oc.text)}, llama.cpp ${JSON.stringify(llText)}`);
    continue;
  }
  if (process.env.EXPECT_DIR) {
    const want = readFileSync(`${process.env.EXPECT_DIR}/${pi}.txt`, "utf8");
    if (want !== llText && want !== llText + "\n")
      fail(`'${prompt}': orch generate printed ${JSON.stringify(want)}, llama.cpp ${JSON.stringify(llText)}`);
  }
  const lp = oc.logprobs;
  // A token's text -> llama.cpp id (orch's top_logprobs are keyed by text).
  const idOf = (text, step) => {
    for (const t of ll.steps[step].logprob.keys()) if (model.detokenize([t]) === text) return t;
    return -1;
  };
  for (let s = 0; s < lp.tokens.length && s < ll.steps.length; s++) {
    const d = Math.abs(lp.token_logprobs[s] - ll.steps[s].logprob.get(ll.steps[s].token));
    worst = Math.max(worst, d);
    if (!(d <= tol)) fail(`'${prompt}' step ${s}: chosen-token logprob orch ${lp.token_logprobs[s]} vs llama.cpp ${ll.steps[s].logprob.get(ll.steps[s].token)}`);
    for (const [text, v] of Object.entries(lp.top_logprobs[s] || {})) {
      const id = idOf(text, s);
      if (id < 0) { fail(`'${prompt}' step ${s}: top token ${JSON.stringify(text)} unknown to llama.cpp`); continue; }
      const dd = Math.abs(v - ll.steps[s].logprob.get(id));
      worst = Math.max(worst, dd);
      if (!(dd <= tol)) fail(`'${prompt}' step ${s}: top token ${JSON.stringify(text)}: orch ${v} vs llama.cpp ${ll.steps[s].logprob.get(id)}`);
    }
  }
  console.log(`ok '${prompt}' -> ${JSON.stringify(llText)} (${llTokens.length} tokens)`);
}
console.log(`largest logprob difference: ${worst.toExponential(3)} (tolerance ${tol})`);
await ctx.dispose();
await model.dispose();
process.exit(failed ? 1 : 0);
