#!/usr/bin/env bash
# make run: starts the four simulated engines the embedded default config names and `narwhal
# serve` on that config, then `narwhal load` with a workload that makes the controller move an
# engine within about a minute and a half; afterwards Narwhal and the engines keep running (the
# page at http://127.0.0.1:9090/) until Ctrl-C. An engine that exits (killed, say) is reported
# and the rest keep running; Narwhal exiting stops everything.
#
# Usage: scripts/run-local.sh [path/to/narwhal]
#   RESUME=1   continue from the durable state of the last run (default: the config's roles)
#   LOAD=0     no load: Narwhal and the engines only
set -uo pipefail
narwhal=${1:-bin/narwhal}

# id address role: the engines of config/default.yaml (a test keeps the two in step).
engines=(
  "e1 127.0.0.1:8001 prefill"
  "e2 127.0.0.1:8002 prefill"
  "e3 127.0.0.1:8003 decode"
  "e4 127.0.0.1:8004 decode"
)

# The demo workload: a minute of chat-like, decode-heavy traffic, then a minute of long prompts
# that two prefill engines cannot serve within the SLO (a decode engine moves to prefill), then
# decode-heavy again. narwhal sim shows the same run in virtual time:
#   bin/narwhal sim --synthetic phases --phase-s 60 --synthetic-rate 25 --synthetic-duration-s 180 --policy narwhal,static
workload=(--synthetic phases --phase-s 60 --synthetic-rate 25 --synthetic-duration-s 180)

pids=()
stop() {
  trap - INT TERM EXIT
  kill -TERM "${pids[@]}" 2>/dev/null
  wait 2>/dev/null
}
trap 'stop; exit 0' INT TERM
trap stop EXIT

declare -A engine_of # pid -> "id address role"
seed=1
for e in "${engines[@]}"; do
  read -r id addr role <<<"$e"
  "$narwhal" enginesim --listen "$addr" --role "$role" --seed "$seed" &
  pids+=($!)
  engine_of[$!]="$e"
  seed=$((seed + 1))
done

reset=(--reset-state)
if [[ ${RESUME:-0} == 1 ]]; then
  reset=()
fi
"$narwhal" serve "${reset[@]}" &
serve=$!
pids+=($serve)

echo "narwhal: the page on http://127.0.0.1:9090/, the state on http://127.0.0.1:9090/narwhal/state; Ctrl-C stops everything" >&2
load=
if [[ ${LOAD:-1} != 0 ]]; then
  # The gateway on :8080 takes your requests through Narwhal too, while the load runs.
  "$narwhal" load "${workload[@]}" --listen 127.0.0.1:8080 &
  load=$!
  pids+=($load)
fi

# Report each process that ends (wait -n -p: bash 5.1 or later); Narwhal ending ends the run.
while :; do
  wait -n -p done "${pids[@]}"
  status=$?
  case $done in
  "$serve")
    echo "narwhal: narwhal serve exited (status $status); stopping the rest" >&2
    exit "$status"
    ;;
  "$load")
    echo "narwhal: the load is over; Narwhal and the engines keep running (Ctrl-C stops them)" >&2
    ;;
  *)
    read -r id addr role <<<"${engine_of[$done]}"
    echo "narwhal: engine $id ($addr) exited (status $status); the rest keep running. Restart it with:" \
      "$narwhal enginesim --listen $addr --role $role" >&2
    ;;
  esac
  rest=()
  for p in "${pids[@]}"; do
    [[ $p == "$done" ]] || rest+=("$p")
  done
  pids=("${rest[@]}")
done
