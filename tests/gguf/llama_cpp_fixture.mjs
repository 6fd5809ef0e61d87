// llama_cpp_fixture.mjs - loads a GGUF (an orch llama checkpoint exported by
// `orch export gguf`) in llama.cpp (npm node-llama-cpp, prebuilt CPU
// library), evaluates a torch reference fixture's token rows from position
// 0 and compares llama.cpp's logits at every position with the fixture's
// (tools/torch_reference.py, float64): this checks the attn_q/attn_k RoPE row
// permutation, the rope keys (freq_base, linear scaling, llama3's
// rope_freqs.weight), GQA and the tied / untied head as llama.cpp reads them.
//
// usage: node llama_cpp_fixture.mjs MODULES FILE.gguf EXPECT.json TOL
//   EXPECT.json  {"tokens": [[ids...], ...], "logits": [[[V floats] per
//                position] per row]} (hf_tool.py fixture-json)
//   TOL          largest |logit(llama.cpp) - logit(fixture)| allowed
// Prints the largest difference; exit status 0 when within TOL, else 1.
import { readFileSync } from "node:fs";
const [modules, gguf, expectPath, tolArg] = process.argv.slice(2);
const tol = Number(tolArg);
const want = JSON.parse(readFileSync(expectPath, "utf8"));
const { getLlama, LlamaLogLevel } = await import(modules + "/node-llama-cpp/dist/index.js");
const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error,
                               progressLogs: false });
const model = await llama.loadModel({ modelPath: gguf });
// f32 KV cache and no flash attention: the f32 math of the reference.
const ctx = await model.createContext({ contextSize: 64, sequences: want.tokens.length, threads: 1, flashAttention: false,
  experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32" });
let worst = 0, where = "";
for (const [r, row] of want.tokens.entries()) {
  const seq = ctx.getSequence();
  const input = row.map((t) => [t, { generateNext: { logits: true } }]);
  const res = await seq.controlledEvaluate(input);
  for (let p = 0; p < row.length; p++) {
    const logits = res[p].next.logits;
    const w = want.logits[r][p];
    for (let v = 0; v < w.length; v++) {
      const d = Math.abs((logits.get(v) ?? NaN) - w[v]);
      if (!(d <= worst)) { worst = d; where = `row ${r} position ${p} token ${v}`; }
    }
  }
  seq.dispose();
}
console.log(`llama.cpp logits vs the fixture: largest difference ${worst.toExponential(3)} at ${where} (tolerance ${tol})`);
await ctx.dispose();
await model.dispose();
process.exit(worst <= tol ? 0 : 1);
