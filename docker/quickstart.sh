#!/usr/bin/env bash
# A newcomer's first command: install the build dependencies, build, and serve the built-in
# demo model (or --model DIR) on http://127.0.0.1:8000 and gRPC 127.0.0.1:50051, with the web
# playground at http://127.0.0.1:8000/. Any arguments go to `attnres serve`.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
"$repo/docker/install-deps.sh"
"$repo/docker/build.sh"
# The address the server will listen on, as `attnres serve` reads it (flag, then environment).
host=${ATTNRES_HOST:-127.0.0.1}
port=${ATTNRES_PORT:-8000}
ui=1
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    --host) host=${args[i + 1]:-$host} ;;
    --host=*) host=${args[i]#--host=} ;;
    --port) port=${args[i + 1]:-$port} ;;
    --port=*) port=${args[i]#--port=} ;;
    --no-ui) ui=0 ;;
  esac
done
[ "$host" = "0.0.0.0" ] && host=127.0.0.1
if [ "$ui" = 1 ]; then
  echo "quickstart: once the server says ready, open http://$host:$port/ in a browser to chat" \
    "with the model and watch its depth attention (Ctrl+C stops the server)"
fi
exec "${ATTNRES_BUILD_DIR:-$repo/build}/server/cli/attnres" serve "$@"
