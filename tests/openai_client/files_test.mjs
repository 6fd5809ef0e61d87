// files_test.mjs - the official OpenAI Node client's files API (npm `openai`)
// against `orch serve --state-dir`: upload a fine-tuning JSONL (multipart, as
// the client sends it), list, retrieve, download the bytes, a refused file
// (line number in the error), delete.
// usage: node files_test.mjs BASE_URL NODE_MODULES_DIR GOOD.jsonl BAD.jsonl
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";

const [baseURL, modules, good, bad] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(modules), "noop.js"));
const OpenAI = require("openai").default ?? require("openai").OpenAI;

function assert(cond, msg) {
  if (!cond) {
    console.error("FAIL: " + msg);
    process.exit(1);
  }
}

const client = new OpenAI({ baseURL, apiKey: "sekret", maxRetries: 0, timeout: 20000 });
const bytes = fs.readFileSync(good);

const f = await client.files.create({ file: fs.createReadStream(good), purpose: "fine-tune" });
assert(/^file-[0-9a-f]{24}$/.test(f.id), "id " + JSON.stringify(f));
assert(f.object === "file" && f.bytes === bytes.length && f.purpose === "fine-tune", "object " + JSON.stringify(f));
assert(f.filename === path.basename(good), "filename " + f.filename);

const list = await client.files.list();
assert(list.data.some((x) => x.id === f.id), "list " + JSON.stringify(list.data));
const one = await client.files.retrieve(f.id);
assert(one.id === f.id && one.bytes === bytes.length, "retrieve " + JSON.stringify(one));
const content = Buffer.from(await (await client.files.content(f.id)).arrayBuffer());
assert(content.equals(bytes), "content differs");

let refused = null;
try {
  await client.files.create({ file: fs.createReadStream(bad), purpose: "fine-tune" });
} catch (e) {
  refused = e;
}
assert(refused && refused.status === 400 && /line 3:/.test(refused.message), "bad file: " + (refused && refused.message));

const del = await client.files.delete(f.id);
assert(del.deleted === true && del.id === f.id, "delete " + JSON.stringify(del));
let gone = null;
try {
  await client.files.retrieve(f.id);
} catch (e) {
  gone = e;
}
assert(gone && gone.status === 404, "retrieve after delete: " + (gone && gone.status));
// one more upload that the shell test finds after a restart
const keep = await client.files.create({ file: fs.createReadStream(good), purpose: "fine-tune" });
console.log("kept " + keep.id);
