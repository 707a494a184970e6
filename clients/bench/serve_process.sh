# Sourced by the benchmark scripts: one `attnres serve` at a time on $http_port / $grpc_port,
# its log appended to $out/server.log, stopped on exit.
#   start_server BINARY [ARGS...]   a fresh server, waits for /health (30 s at most)
#   stop_server
#   wait_for_health NAME LOG TRIES  for a server started otherwise (llama-server)
server=
stop_server() {
  [ -n "$server" ] || return 0
  kill "$server" 2>/dev/null
  wait "$server" 2>/dev/null || true
  server=
}
start_server() {
  local binary=$1
  shift
  stop_server
  "$binary" serve --port "$http_port" --grpc-port "$grpc_port" "$@" >>"$out/server.log" 2>&1 &
  server=$!
  wait_for_health "$binary serve" "$out/server.log" 150
}
# wait_for_health NAME LOG TRIES: polls /health on $http_port every 0.2 s; exits the script
# naming LOG when the server is not up after TRIES polls.
wait_for_health() {
  for _ in $(seq "$3"); do
    curl -sf "http://127.0.0.1:$http_port/health" >/dev/null && return 0
    sleep 0.2
  done
  echo "$1 did not come up; see $2" >&2
  exit 1
}
trap stop_server EXIT
