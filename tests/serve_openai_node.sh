#!/usr/bin/env bash
# serve_openai_node.sh - the official OpenAI Node client (npm openai, pinned in
# tools/setup.sh) completes non-streaming and streaming requests against
# orch serve (mock engine, --api-key). Skips when node or the package is absent.
source "$(dirname "$0")/serve/common.sh"
ROOT=$(cd "$SERVE_DIR/../.." && pwd)
MODULES="$ROOT/data/node/node_modules"
command -v node >/dev/null || { echo "skip: node is not installed"; exit 77; }
[ -f "$MODULES/openai/package.json" ] || { echo "skip: npm openai not installed (run tools/setup.sh)"; exit 77; }
start_server node --api-key sekret
node "$ROOT/tests/openai_client/client_test.mjs" "http://127.0.0.1:$PORT/v1" "$MODULES" || fail "openai node client"
stop_server "$PID" || fail "exit status after SIGTERM"
echo "serve_openai_node: ok"
