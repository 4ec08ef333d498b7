#!/usr/bin/env bash
# Starts the four simulated engines the embedded default config names, then `narwhal serve` on
# that config, and stops them all on Ctrl-C (or when any of them exits).
# Usage: scripts/run-local.sh [path/to/narwhal]
set -uo pipefail
narwhal=${1:-bin/narwhal}

# id address role: the engines of config/default.yaml (a test keeps the two in step).
engines=(
  "e1 127.0.0.1:8001 prefill"
  "e2 127.0.0.1:8002 prefill"
  "e3 127.0.0.1:8003 decode"
  "e4 127.0.0.1:8004 decode"
)

pids=()
stop() {
  trap - INT TERM EXIT
  kill -TERM "${pids[@]}" 2>/dev/null
  wait "${pids[@]}" 2>/dev/null
}
trap 'stop; exit 0' INT TERM
trap stop EXIT

seed=1
for e in "${engines[@]}"; do
  read -r id addr role <<<"$e"
  "$narwhal" enginesim --listen "$addr" --role "$role" --seed "$seed" &
  pids+=($!)
  seed=$((seed + 1))
done
"$narwhal" serve &
pids+=($!)

echo "narwhal: admin on http://127.0.0.1:9090 (try: curl -s 127.0.0.1:9090/narwhal/state); Ctrl-C stops everything" >&2
# Any process that exits (a port in use, say) stops the others.
wait -n "${pids[@]}"
status=$?
echo "narwhal: a process exited (status $status); stopping the rest" >&2
exit "$status"
