#!/usr/bin/env bash
# import_gpt2.sh - `orch import-gpt2` end to end: a tiny GPT-2 in the Hugging
# Face layout ("transformer." prefix, Conv1D [in, out] weights, attn.bias
# buffers, lm_head, a config.json with n_head) is written by this script (perl
# pack, no python), imported, checked (Conv1D transposed, everything else
# copied), then used by generate (mock: exact text; cpu when built) and eval.
# Bad inputs are refused with one line. (Exact values of every tensor and the
# F16/BF16 paths are checked in test_checkpoint.)
set -u
ORCH_BIN=${ORCH_BIN:-build/orch}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
cd "$work" || exit 1
command -v perl >/dev/null || { echo "SKIP: perl not found"; exit 77; }

# Tiny GPT-2: V=256, T=32, C=8, L=2, M=32, 2 heads. Element e of tensor number
# k (declaration order) has the value k + e/1024 (exact in f32).
mkdir hf
perl - hf/model.safetensors <<'EOF'
use strict; use warnings;
my ($V, $T, $C, $L, $M) = (256, 32, 8, 2, 32);
my @t = (["transformer.wte.weight", [$V, $C]], ["transformer.wpe.weight", [$T, $C]]);
for my $l (0 .. $L - 1) {
  my $p = "transformer.h.$l";
  push @t, ["$p.ln_1.weight", [$C]], ["$p.ln_1.bias", [$C]],
    ["$p.attn.c_attn.weight", [$C, 3 * $C]], ["$p.attn.c_attn.bias", [3 * $C]],
    ["$p.attn.c_proj.weight", [$C, $C]], ["$p.attn.c_proj.bias", [$C]],
    ["$p.attn.bias", [1, 1, $T, $T]], ["$p.attn.masked_bias", []],
    ["$p.ln_2.weight", [$C]], ["$p.ln_2.bias", [$C]],
    ["$p.mlp.c_fc.weight", [$C, $M]], ["$p.mlp.c_fc.bias", [$M]],
    ["$p.mlp.c_proj.weight", [$M, $C]], ["$p.mlp.c_proj.bias", [$C]];
}
push @t, ["transformer.ln_f.weight", [$C]], ["transformer.ln_f.bias", [$C]],
  ["lm_head.weight", [$V, $C]];
my ($off, @hdr, $data) = (0);
$data = "";
for my $k (0 .. $#t) {
  my ($name, $shape) = @{$t[$k]};
  my $n = 1; $n *= $_ for @$shape;
  $data .= pack("f<*", map { $k + $_ / 1024 } 0 .. $n - 1);
  push @hdr, sprintf('"%s":{"dtype":"F32","shape":[%s],"data_offsets":[%d,%d]}',
                     $name, join(",", @$shape), $off, $off + 4 * $n);
  $off += 4 * $n;
}
my $h = '{"__metadata__":{"format":"pt"},' . join(",", @hdr) . '}';
$h .= " " x ((8 - length($h) % 8) % 8);
open(my $f, ">:raw", $ARGV[0]) or die; print $f pack("Q<", length $h), $h, $data; close $f;
EOF
[ -s hf/model.safetensors ] || fail "fixture not written"
echo '{"n_head": 2, "n_embd": 8, "layer_norm_epsilon": 1e-05}' >hf/config.json

# 1. Import.
"$ORCH_BIN" import-gpt2 hf/model.safetensors --out ck --config-out ck.json >out.txt 2>err.txt ||
  { cat err.txt; fail "import"; }
grep -q "2 layers, 2 heads, width 8, mlp 32, vocab 256, context 32" out.txt || fail "summary: $(cat out.txt)"
for f in model.safetensors state.json checksums.sha256; do [ -f "ck/$f" ] || fail "ck/$f missing"; done
[ -f ck/optimizer.safetensors ] && fail "import wrote optimizer state"
(cd ck && sha256sum --quiet -c checksums.sha256) || fail "checksums"
grep -Eq '"heads":[[:space:]]*2' ck.json || fail "config-out: $(cat ck.json)"
grep -Eq '"tokenizer":[[:space:]]*"byte"' ck.json || fail "config-out tokenizer"

# --config: train/data/engine come from a base config, the model from the file.
cat >base.json <<'EOF2'
{"model": {"vocab_size": 50257, "context": 1024, "layers": 12, "heads": 12, "width": 768},
 "train": {"micro_batch": 1, "seq_len": 16, "max_steps": 7, "lr": 1e-4},
 "data": {"tokenizer": "byte", "train": "mine/train_*.bin", "val": "mine/val_*.bin"},
 "engine": {"name": "mock"}}
EOF2
"$ORCH_BIN" import-gpt2 hf/model.safetensors --out ck2 --config base.json >/dev/null 2>err.txt ||
  { cat err.txt; fail "import --config"; }
grep -q '"mine/train_\*.bin"' ck2/state.json && grep -Eq '"max_steps":[[:space:]]*7' ck2/state.json &&
  grep -Eq '"width":[[:space:]]*8' ck2/state.json || fail "import --config: $(cat ck2/state.json)"

# 2. Check values with perl: Conv1D transposed, others copied, names mapped.
perl - ck/model.safetensors <<'EOF' || fail "imported values"
use strict; use warnings;
open(my $f, "<:raw", $ARGV[0]) or die; local $/; my $b = <$f>; close $f;
my $hl = unpack("Q<", substr($b, 0, 8)); my $h = substr($b, 8, $hl); my $d = 8 + $hl;
my %t;
while ($h =~ /"([^"]+)":\{"dtype":"F32","shape":\[([0-9,]*)\],"data_offsets":\[(\d+),(\d+)\]\}/g) {
  $t{$1} = [[split /,/, $2], $3, $4];
}
die "tensor count " . scalar(keys %t) . "\n" unless keys %t == 28;
die "prefix kept\n" if grep { /transformer|lm_head|\.attn\.bias$|masked/ } keys %t;
sub val { my ($n, $i) = @_; unpack("f<", substr($b, $d + $t{$n}[1] + 4 * $i, 4)) }
# HF declaration index k: wte 0, wpe 1, layer l starts at 2 + 14 l.
my %k = ("ln_1.weight", 0, "attn.c_attn.weight", 2, "attn.c_proj.weight", 4,
         "mlp.c_fc.weight", 10, "mlp.c_proj.weight", 12, "mlp.c_fc.bias", 11);
for my $l (0, 1) {
  for my $s (keys %k) {
    my $n = "h.$l.$s"; my $k = 2 + 14 * $l + $k{$s};
    my ($rows, $cols) = @{$t{$n}[0]}; $cols //= 1;
    for my $r (0 .. $rows - 1) { for my $c (0 .. $cols - 1) {
      my $src = $s =~ /weight$/ && $s ne "ln_1.weight" ? $c * $rows + $r : $r * $cols + $c;
      my $want = $k + $src / 1024; my $got = val($n, $r * $cols + $c);
      die "$n [$r,$c] = $got, want $want\n" if $got != $want;
    } }
  }
}
die "c_attn shape\n" unless "@{$t{'h.1.attn.c_attn.weight'}[0]}" eq "24 8";
die "c_fc shape\n" unless "@{$t{'h.0.mlp.c_fc.weight'}[0]}" eq "32 8";
die "wte\n" unless val("wte.weight", 5) == 5 / 1024;
die "ln_f.bias\n" unless val("ln_f.bias", 3) == 31 + 3 / 1024;
EOF

# 3. The imported checkpoint serves: exact greedy text on the mock engine.
out=$("$ORCH_BIN" generate --checkpoint ck --engine mock --prompt ab --max-tokens 4 --temperature 0) ||
  fail "generate (mock)"
[ "$out" = "abntfd" ] || fail "mock text '$out'"
if [ -f "${ORCH_BUILD:-build}/libengine_cpu.so" ] &&
   "$ORCH_BIN" info --engine cpu >/dev/null 2>&1; then
  out=$("$ORCH_BIN" generate --checkpoint ck --engine cpu --prompt ab --max-tokens 5 --seed 1 2>err.txt) ||
    { cat err.txt; fail "generate (cpu)"; }
  [ "${out:0:2}" = "ab" ] || fail "cpu text '$out'"
else
  echo "note: cpu engine not available; skipped the cpu generate check"
fi

# 4. Fine-tuning starts from the imported weights (train --init, mock engine,
#    the config's default data paths data/finetune/*).
for i in $(seq 1 50); do echo "fine-tuning line $i"; done >ft.txt
"$ORCH_BIN" prepare --tokenizer byte --input ft.txt --out data/finetune --val-fraction 0.2 \
  >prep.log 2>&1 || { cat prep.log; fail "prepare"; }
"$ORCH_BIN" train --init ck --engine mock --steps 2 --out ft --set train.seq_len=16 \
  --set train.eval_batches=1 >ft.log 2>&1 || { cat ft.log; fail "train --init from the import"; }
[ -f ft/latest ] || fail "fine-tuning wrote no checkpoint"
"$ORCH_BIN" generate --checkpoint ft --engine mock --prompt ab --max-tokens 4 --temperature 0 \
  >out.txt 2>&1 && [ "$(cat out.txt)" = "abntfd" ] || fail "generate after fine-tuning: $(cat out.txt)"

# 5. Errors: one line, exit 2 for bad input, 1 when --out exists.
expect_err() { # rc pattern args...
  local rc=$1 pat=$2; shift 2
  "$ORCH_BIN" import-gpt2 "$@" >/dev/null 2>err.txt; local got=$?
  [ $got -eq "$rc" ] || fail "import-gpt2 $*: exit $got, want $rc ($(cat err.txt))"
  [ "$(wc -l <err.txt)" -eq 1 ] && grep -q "$pat" err.txt || fail "import-gpt2 $*: $(cat err.txt)"
}
expect_err 1 "already exists" hf/model.safetensors --out ck
expect_err 2 "need MODEL.safetensors and --out" hf/model.safetensors
expect_err 2 "nope.safetensors: no such file or directory" nope.safetensors --out x
head -c 1000 hf/model.safetensors >trunc.safetensors
expect_err 2 "truncated" trunc.safetensors --out x
printf 'garbage!garbage!' >junk.safetensors
expect_err 2 "junk.safetensors" junk.safetensors --out x
expect_err 2 "do not divide" hf/model.safetensors --out x --heads 3
expect_err 2 "tokenizer" hf/model.safetensors --out x --tokenizer nope
[ -e x ] && fail "a failed import left x behind"
"$ORCH_BIN" import-gpt2 --help | grep -q "usage: orch import-gpt2" || fail "--help"
echo "ok"
