#!/usr/bin/env bash
# gguf_cli.sh - `orch export gguf` and `orch import gguf` from the command
# line: --help, usage errors, a byte-tokenizer checkpoint refused, the f32
# round trip export -> import bit for bit (and generate printing the same
# tokens as the original), f16/q8_0 files importing, and malformed or foreign
# GGUF files (made by tests/gguf/gguf_edit.py) refused with one line naming
# the problem and exit status 2. LLaMA (section 5): checkpoints imported
# from Hugging Face directories made of the torch reference fixtures
# (tests/hf/hf_tool.py mkllama, the vocabulary padded to GPT-2's) export as
# general.architecture llama with its keys, attn_q/attn_k rows in
# llama.cpp's RoPE order (checked here against the converter's reshape, in
# numpy-free Python), round-trip f32 bit for bit (f16/q8_0 import), and
# refuse unsupported rope scaling by name. Needs the GPT-2 vocabulary and python3
# (skip otherwise); uses the cpu engine when built, else mock.
set -u
ORCH_BIN=${ORCH_BIN:-build/orch}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
EDIT="$ROOT/tests/gguf/gguf_edit.py"
export EDIT PYTHONDONTWRITEBYTECODE=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
cd "$work" || exit 1
# shellcheck source=tests/lib/format_cli.sh
source "$ROOT/tests/lib/format_cli.sh"

# 1. Help and usage errors.
for c in "export --help" "export gguf --help" "import --help" "import gguf -h"; do
  # shellcheck disable=SC2086
  "$ORCH_BIN" $c >help.txt 2>&1 || fail "orch $c exit status"
  grep -q "^usage: orch ${c%% *} gguf" help.txt || fail "orch $c: $(head -2 help.txt)"
  grep -q -- "--out" help.txt || fail "orch $c lists no --out"
done
"$ORCH_BIN" --help | grep -q "^  export " || fail "orch --help lists no export"
expect_err 2 "export: expected a format" "$ORCH_BIN" export
expect_err 2 "unknown format 'onnx'" "$ORCH_BIN" export onnx run --out x
expect_err 2 "import: expected a format" "$ORCH_BIN" import
expect_err 2 "need CKPT and --out" "$ORCH_BIN" export gguf
expect_err 2 "need FILE.gguf and --out DIR" "$ORCH_BIN" import gguf x.gguf
expect_err 2 "unknown argument '--bogus'" "$ORCH_BIN" export gguf run --out x --bogus

# 2. Checkpoints: one with the byte tokenizer, one with gpt2.
for i in $(seq 1 200); do echo "In the beginning God created the heaven and the earth $((i % 9))."; done >corpus.txt
for tok in byte gpt2; do
  "$ORCH_BIN" prepare --tokenizer $tok --input corpus.txt --out data_$tok --val-fraction 0.1 >prep.log 2>&1 ||
    { cat prep.log; fail "prepare $tok"; }
  V=256; [ $tok = gpt2 ] && V=50304 # 47 padding rows past GPT-2's 50257 tokens
  cat >cfg_$tok.json <<JSON
{"model": {"arch": "gpt2", "vocab_size": $V, "context": 32, "layers": 2, "heads": 2, "width": 32},
 "train": {"micro_batch": 4, "seq_len": 16, "max_steps": 60, "lr": 1e-2, "eval_every": 0, "eval_batches": 1},
 "data": {"tokenizer": "$tok", "train": "data_$tok/train_*.bin", "val": "data_$tok/val_*.bin"},
 "engine": {"name": "$ENGINE", "threads": 1}}
JSON
  "$ORCH_BIN" train --config cfg_$tok.json --out run_$tok >train.log 2>&1 || { tail -5 train.log; fail "train $tok"; }
done
expect_err 2 "the 'byte' tokenizer has no GGUF equivalent" "$ORCH_BIN" export gguf run_byte --out b.gguf
[ -e b.gguf ] && fail "a refused export left b.gguf"
expect_err 2 "--type: 'q4_k' is not f32, f16 or q8_0" "$ORCH_BIN" export gguf run_gpt2 --out x.gguf --type q4_k
expect_err 2 "nowhere: no such checkpoint" "$ORCH_BIN" export gguf nowhere --out x.gguf

# 3. Round trip: f32 is bit-exact, and generate prints the same text.
for t in f32 f16 q8_0; do
  "$ORCH_BIN" export gguf run_gpt2 --out m_$t.gguf --type $t >exp.log 2>&1 || { cat exp.log; fail "export $t"; }
  grep -q "2 layers, 28 tensors" exp.log || fail "export summary: $(cat exp.log)"
  "$ORCH_BIN" import gguf m_$t.gguf --out imp_$t >imp.log 2>&1 || { cat imp.log; fail "import $t"; }
  grep -q "imported GGUF gpt2: 2 layers, 2 heads, width 32, mlp 128, vocab 50304, context 32" imp.log ||
    fail "import summary: $(cat imp.log)"
  (cd imp_$t && sha256sum --quiet -c checksums.sha256) || fail "imp_$t checksums"
done
grep -q "9 Q8_0" imp.log || fail "q8_0 tensors: $(cat imp.log)"
python3 - run_gpt2/latest imp_f32 <<'PY' || fail "f32 round trip is not bit-exact"
import json, struct, sys, os
run = os.path.dirname(sys.argv[1])
ck = os.path.join(run, open(sys.argv[1]).read().strip())
def load(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8:8 + n]), b[8 + n:]
h1, d1 = load(ck + "/model.safetensors"); h2, d2 = load(sys.argv[2] + "/model.safetensors")
assert h2["__metadata__"] == {"format": "orch", "layout": "orch-gpt2", "layout_version": "1"}, h2["__metadata__"]
k1 = sorted(k for k in h1 if k != "__metadata__"); k2 = sorted(k for k in h2 if k != "__metadata__")
assert k1 == k2, (k1, k2)
for k in k1:
    a, b = h1[k]["data_offsets"], h2[k]["data_offsets"]
    assert h1[k]["shape"] == h2[k]["shape"] and d1[a[0]:a[1]] == d2[b[0]:b[1]], k
PY
for p in "In the beginning" "God created" "the earth"; do
  a=$("$ORCH_BIN" generate --checkpoint run_gpt2 --prompt "$p" --max-tokens 12 --temperature 0 2>&1) || fail "generate original"
  b=$("$ORCH_BIN" generate --checkpoint imp_f32 --engine $ENGINE --prompt "$p" --max-tokens 12 --temperature 0 2>&1) ||
    fail "generate imported: $b"
  [ "$a" = "$b" ] || fail "'$p': original '$a', imported '$b'"
done
expect_err 1 "already exists" "$ORCH_BIN" import gguf m_f32.gguf --out imp_f32

python3 - m_f32.gguf <<'PY' || fail "padding tokens"
import os, sys
sys.path.insert(0, os.path.dirname(os.environ["EDIT"]))
from gguf_edit import load
kvs, _ = load(sys.argv[1])
kv = {k: v for k, _, v in kvs}
toks, types = kv["tokenizer.ggml.tokens"][1], kv["tokenizer.ggml.token_type"][1]
assert len(toks) == 50304 and toks[50256] == b"<|endoftext|>" and toks[50257] == b"[PAD50257]", toks[50256:50258]
assert types[0] == 1 and types[50256] == 3 and types[50303] == 5
assert toks[220] == "\u0120".encode() and kv["tokenizer.ggml.merges"][1][0] == "\u0120 t".encode()
assert kv["general.architecture"] == b"gpt2" and kv["gpt2.block_count"] == 2 and kv["general.alignment"] == 32
PY

# 4. Malformed and foreign files: exit 2, one line naming the problem.
: >empty.gguf
expect_err 2 "not a GGUF file" "$ORCH_BIN" import gguf empty.gguf --out o1
head -c 5000 m_f32.gguf >cut.gguf
expect_err 2 "cut.gguf: truncated" "$ORCH_BIN" import gguf cut.gguf --out o1
e() { python3 "$EDIT" m_f32.gguf bad.gguf "$@" || fail "gguf_edit $*"; }
e set-str general.architecture falcon
expect_err 2 "architecture 'falcon' is not supported (orch imports: gpt2, llama)" "$ORCH_BIN" import gguf bad.gguf --out o1
e del gpt2.block_count
expect_err 2 "gpt2.block_count: missing" "$ORCH_BIN" import gguf bad.gguf --out o1
e set-str tokenizer.ggml.model llama
expect_err 2 "tokenizer.ggml.model is 'llama', not GPT-2's BPE" "$ORCH_BIN" import gguf bad.gguf --out o1
e token 5 xyz
expect_err 2 "tokenizer.ggml.tokens[5] differs from GPT-2's" "$ORCH_BIN" import gguf bad.gguf --out o1
e del tokenizer.ggml.merges
expect_err 2 "tokenizer.ggml.merges: missing" "$ORCH_BIN" import gguf bad.gguf --out o1
e type blk.0.attn_qkv.weight 2
expect_err 2 "tensor 'blk.0.attn_qkv.weight' has type Q4_0, which orch does not import" "$ORCH_BIN" import gguf bad.gguf --out o1
e add-tensor foo.weight output_norm.weight
expect_err 2 "unexpected tensor 'foo.weight'" "$ORCH_BIN" import gguf bad.gguf --out o1
e add-tensor output.weight token_embd.weight bump
expect_err 2 "output.weight differs from token_embd.weight (an untied head" "$ORCH_BIN" import gguf bad.gguf --out o1
e add-tensor output.weight token_embd.weight
"$ORCH_BIN" import gguf bad.gguf --out tied >/dev/null 2>err.txt || { cat err.txt; fail "a tied output.weight is refused"; }
[ -e o1 ] && fail "a refused import left o1"

# 5. LLaMA.
F="$ROOT/tests/fixtures"
TOOL="$ROOT/tests/hf/hf_tool.py"
# kv1: GQA (1 kv head of 4), tied head; its llama3 rope scaling dropped
# here (the scaled fixtures are checked below where the config knows
# model.rope_scaling).
python3 "$TOOL" mkllama "$F/cpu_llama_tiny_kv1.safetensors" l2 vocab=50257 >/dev/null || fail "mkllama"
python3 -c 'import json; p="l2/config.json"; j=json.load(open(p)); j["rope_scaling"]=None; json.dump(j,open(p,"w"))'
"$ORCH_BIN" import hf l2 --out ck_l2 --tokenizer gpt2 >imp.log 2>&1 || { cat imp.log; fail "import llama"; }
for t in f32 f16 q8_0; do
  "$ORCH_BIN" export gguf ck_l2 --out l2_$t.gguf --type $t >exp.log 2>&1 || { cat exp.log; fail "export llama $t"; }
  grep -q "2 layers, 20 tensors" exp.log || fail "llama export summary: $(cat exp.log)"
  "$ORCH_BIN" import gguf l2_$t.gguf --out l2imp_$t >imp.log 2>&1 || { cat imp.log; fail "import llama $t"; }
  grep -q "imported GGUF llama: 2 layers, 4 heads (1 kv, tied head), width 32, mlp 48, vocab 50257, context 16" imp.log ||
    fail "llama import summary: $(cat imp.log)"
done
python3 - ck_l2 l2_f32.gguf l2imp_f32 <<'PY' || fail "llama GGUF layout / round trip"
import json, os, struct, sys
from array import array
sys.path.insert(0, os.path.dirname(os.environ["EDIT"]))
from gguf_edit import load
def st(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); d = b[8 + n:]
    return {k: (v["shape"], d[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in h.items() if k != "__metadata__"}, h["__metadata__"]
ck, _ = st(sys.argv[1] + "/model.safetensors")
kvs, tensors = load(sys.argv[2])
kv = {k: v for k, _, v in kvs}
want = {"general.architecture": b"llama", "llama.block_count": 2, "llama.context_length": 16,
        "llama.embedding_length": 32, "llama.feed_forward_length": 48,
        "llama.attention.head_count": 4, "llama.attention.head_count_kv": 1,
        "llama.rope.dimension_count": 8, "tokenizer.ggml.model": b"gpt2"}
for k, v in want.items():
    assert kv.get(k) == v, (k, kv.get(k))
assert abs(kv["llama.rope.freq_base"] - 10000) < 1e-3 and abs(kv["llama.attention.layer_norm_rms_epsilon"] - 1e-5) < 1e-9
assert "llama.rope.scaling.type" not in kv
t = {x[0]: x for x in tensors}
names = set(t)
exp = {"token_embd.weight", "output_norm.weight"} | {
    f"blk.{i}.{s}.weight" for i in range(2) for s in
    ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")}
assert names == exp, names ^ exp
def rows(b, C):
    a = array("f"); a.frombytes(b); return [a[i:i + C] for i in range(0, len(a), C)]
def data(name):  # gguf_edit tensors: (name, ne, type, bytes)
    return t[name][3]
for i in range(2):
    for g, o, heads in (("attn_q", "self_attn.q_proj", 4), ("attn_k", "self_attn.k_proj", 1)):
        shape, b = ck[f"model.layers.{i}.{o}.weight"]
        hf = rows(b, shape[1]); gg = rows(data(f"blk.{i}.{g}.weight"), shape[1])
        D = shape[0] // heads
        # the converter: w.reshape(heads, 2, D/2, C).swapaxes(1, 2).reshape(w.shape)
        perm = [h * D + s * (D // 2) + j for h in range(heads) for j in range(D // 2) for s in range(2)]
        assert [list(gg[r]) for r in range(shape[0])] == [list(hf[perm[r]]) for r in range(shape[0])], (i, g)
        assert gg != hf
    assert data(f"blk.{i}.attn_v.weight") == ck[f"model.layers.{i}.self_attn.v_proj.weight"][1]
back, meta = st(sys.argv[3] + "/model.safetensors")
assert meta["layout"] == "orch-llama", meta
assert back.keys() == ck.keys() and all(back[k] == ck[k] for k in ck), "round trip not bit-exact"
PY
e2() { python3 "$EDIT" l2_f32.gguf bad.gguf "$@" || fail "gguf_edit $*"; }
e2 set-str llama.rope.scaling.type yarn
expect_err 2 "llama.rope.scaling.type 'yarn' is not supported" "$ORCH_BIN" import gguf bad.gguf --out o2
e2 add-tensor rope_freqs.weight output_norm.weight
expect_err 2 "rope_freqs.weight (llama3 RoPE scaling) is supported only with orch.rope.scaling.* keys" "$ORCH_BIN" import gguf bad.gguf --out o2
e2 set-str orch.rope.scaling.type yarn
expect_err 2 "orch.rope.scaling.type 'yarn' is not llama3" "$ORCH_BIN" import gguf bad.gguf --out o2
e2 type blk.1.attn_k.weight 2
expect_err 2 "tensor 'blk.1.attn_k.weight' has type Q4_0" "$ORCH_BIN" import gguf bad.gguf --out o2
[ -e o2 ] && fail "a refused llama import left o2"
# An hf-tokenizer checkpoint: imported with the small ByteLevel
# tokenizer.json of hf_tool.py mkllama tokjson (copied into it).
python3 "$TOOL" mkllama "$F/cpu_llama_tiny_kv4.safetensors" lt vocab=256 tokjson >/dev/null
"$ORCH_BIN" import hf lt --out ck_lt >imp.log 2>&1 || { cat imp.log; fail "import lt"; }
grep -q "vocab 256, .*tokenizer hf" imp.log || fail "import lt: $(cat imp.log)"
"$ORCH_BIN" export gguf ck_lt --out lt.gguf >exp.log 2>&1 || { cat exp.log; fail "export hf-tokenizer llama"; }
python3 - lt.gguf <<'PY' || fail "hf tokenizer metadata"
import os, sys
sys.path.insert(0, os.path.dirname(os.environ["EDIT"]))
from gguf_edit import load
kvs, _ = load(sys.argv[1])
kv = {k: v for k, _, v in kvs}
assert kv["tokenizer.ggml.model"] == b"gpt2" and kv["tokenizer.ggml.pre"] == b"gpt-2", kv["tokenizer.ggml.model"]
toks, types = kv["tokenizer.ggml.tokens"][1], kv["tokenizer.ggml.token_type"][1]
assert len(toks) == 256 and toks[0] == b"A" and toks[90] == b"AB" and toks[96] == b"<|end|>", toks[:3]
assert types[0] == 1 and types[96] == 3 and toks[100] == b"[PAD100]" and types[100] == 5, types[90:101]
assert kv["tokenizer.ggml.merges"][1] == [b"A B", b"C D"], kv["tokenizer.ggml.merges"]
assert kv["tokenizer.ggml.eos_token_id"] == 96 and kv["tokenizer.ggml.add_bos_token"] is False
PY
# ... and back: import gguf makes the tokenizer.json, whose export gives the
# same tokenizer keys; the weights round-trip bit for bit.
"$ORCH_BIN" import gguf lt.gguf --out ltimp >imp.log 2>&1 || { cat imp.log; fail "import hf-tokenizer gguf"; }
grep -q "tokenizer hf" imp.log || fail "gguf hf tokenizer import: $(cat imp.log)"
python3 "$TOOL" same ck_lt/model.safetensors ltimp/model.safetensors >/dev/null || fail "lt round trip"
[ -f ltimp/tokenizer.json ] && [ -f ltimp/tokenizer_config.json ] || fail "no tokenizer files in ltimp"
"$ORCH_BIN" export gguf ltimp --out lt2.gguf >/dev/null 2>&1 || fail "export the re-imported hf tokenizer"
python3 - lt.gguf lt2.gguf <<'PY' || fail "tokenizer keys differ after gguf -> tokenizer.json -> gguf"
import os, sys
sys.path.insert(0, os.path.dirname(os.environ["EDIT"]))
from gguf_edit import load
a, b = ({k: v for k, _, v in load(p)[0] if k.startswith("tokenizer.")} for p in sys.argv[1:])
assert a == b, sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
PY
e3() { python3 "$EDIT" lt.gguf bad.gguf "$@" || fail "gguf_edit $*"; }
e3 set-str tokenizer.ggml.pre falcon
expect_err 2 "tokenizer.ggml.pre 'falcon' is not one orch turns into a pre-tokenizer" "$ORCH_BIN" import gguf bad.gguf --out o3
e3 set-str tokenizer.ggml.model bert
expect_err 2 "tokenizer.ggml.model is not gpt2 or llama" "$ORCH_BIN" import gguf bad.gguf --out o3
e3 del tokenizer.ggml.merges
expect_err 2 "tokenizer.ggml.tokens / token_type / merges missing" "$ORCH_BIN" import gguf bad.gguf --out o3
[ -e o3 ] && fail "a refused import left o3"
tok_edit() { # tok_edit PYTHON_STATEMENT_ON_j: ck_lt's tokenizer.json changed into ck_bt
  rm -rf ck_bt && cp -r ck_lt ck_bt
  python3 -c 'import json,sys; p="ck_bt/tokenizer.json"; j=json.load(open(p)); exec(sys.argv[1]); json.dump(j,open(p,"w"))' "$1"
}
tok_edit 'j["model"]["type"]="Unigram"'
expect_err 2 "model.type 'Unigram' has no GGUF tokenizer orch writes" "$ORCH_BIN" export gguf ck_bt --out x.gguf
tok_edit 'j["pre_tokenizer"]={"type": "Whitespace"}'
expect_err 2 "neither ByteLevel pre-tokenization nor Metaspace with model.byte_fallback true" "$ORCH_BIN" export gguf ck_bt --out x.gguf
tok_edit 'j["pre_tokenizer"]={"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "x"}}, {"type": "ByteLevel", "use_regex": False}]}'
expect_err 2 "pre_tokenizer: a ByteLevel pre-tokenization without a llama.cpp name orch knows" "$ORCH_BIN" export gguf ck_bt --out x.gguf
tok_edit 'j["added_tokens"][0]["id"]=300'
expect_err 2 "301 tokens do not fit the model's vocabulary of 256" "$ORCH_BIN" export gguf ck_bt --out x.gguf
tok_edit 'j["model"]["merges"][1]="CD"'
expect_err 2 "model.merges[1] is not \"a b\" or [a, b]" "$ORCH_BIN" export gguf ck_bt --out x.gguf
rm ck_bt/tokenizer.json
expect_err 2 "ck_bt/tokenizer.json" "$ORCH_BIN" export gguf ck_bt --out x.gguf
[ -e x.gguf ] && fail "a refused export left x.gguf"

python3 "$TOOL" mkllama "$F/cpu_llama_tiny_kv2.safetensors" l2s vocab=50257 >/dev/null
if "$ORCH_BIN" import hf l2s --out ck_l2s --tokenizer gpt2 >imp.log 2>&1; then
  for kv in 2 1 4; do
    [ $kv = 2 ] || { python3 "$TOOL" mkllama "$F/cpu_llama_tiny_kv$kv.safetensors" l${kv}s vocab=50257 >/dev/null &&
      "$ORCH_BIN" import hf l${kv}s --out ck_l${kv}s --tokenizer gpt2 >/dev/null 2>&1 || fail "import kv$kv"; }
    "$ORCH_BIN" export gguf ck_l${kv}s --out s$kv.gguf >/dev/null 2>&1 || fail "export kv$kv"
    "$ORCH_BIN" import gguf s$kv.gguf --out simp$kv >/dev/null 2>&1 || fail "import gguf kv$kv"
    python3 "$TOOL" same ck_l${kv}s/model.safetensors simp$kv/model.safetensors >/dev/null || fail "kv$kv round trip"
    python3 - ck_l${kv}s simp$kv <<'PY' || fail "kv$kv config after the round trip"
import json, sys
a, b = (json.load(open(d + "/state.json"))["config"]["model"] for d in sys.argv[1:])
assert a == b, (a, b)
PY
  done
  python3 - s1.gguf s2.gguf s4.gguf <<'PY' || fail "rope scaling keys"
import os, sys
sys.path.insert(0, os.path.dirname(os.environ["EDIT"]))
from gguf_edit import load
from array import array
import math
kv1, t1 = load(sys.argv[1]); kv2, t2 = load(sys.argv[2]); kv4, t4 = load(sys.argv[3])
k1 = {k: v for k, _, v in kv1}; k2 = {k: v for k, _, v in kv2}; k4 = {k: v for k, _, v in kv4}
assert k2["llama.rope.scaling.type"] == b"linear" and k2["llama.rope.scaling.factor"] == 2.0
assert "llama.rope.scaling.type" not in k1 and k1["orch.rope.scaling.type"] == b"llama3"
rf = [x for x in t1 if x[0] == "rope_freqs.weight"][0]
f = array("f"); f.frombytes(rf[3])
# transformers' llama3 rule, factor 8, low 1, high 4, original 64, D = 8
want = []
for i in range(4):
    inv = 1 / 10000 ** (2 * i / 8); wl = 2 * math.pi / inv
    s = inv if wl < 64 / 4 else inv / 8 if wl > 64 else (1 - (64 / wl - 1) / 3) * inv / 8 + (64 / wl - 1) / 3 * inv
    want.append(inv / s)
assert all(abs(a - b) < 1e-6 * b for a, b in zip(f, want)), (list(f), want)
assert not any(x[0] == "output.weight" for x in t1) and not any(x[0] == "output.weight" for x in t4)
assert any(x[0] == "output.weight" for x in t2)
PY
else
  grep -q "unknown key" imp.log || { cat imp.log; fail "scaled llama import"; }
  echo "skip (part): this build's config has no model.rope_scaling / tie_embeddings; scaled and untied llama GGUF not checked"
fi
echo "gguf_cli: ok"
