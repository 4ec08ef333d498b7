#!/usr/bin/env bash
# make run: starts the four simulated engines the embedded default config names and `narwhal
# serve` on that config, then `narwhal load` with a workload that makes the controller move an
# engine within about a minute and a half; afterwards Narwhal and the engines keep running (the
# page at http://127.0.0.1:9090/) until Ctrl-C. An engine that exits (killed, say) is reported
# and the rest keep running; Narwhal exiting stops everything.
#
# Portable bash (3.2, macOS's, and later): no associative arrays, no `wait -n`.
#
# Usage: scripts/run-local.sh [path/to/narwhal]
#   RESUME=1   continue from the durable state of the last run (default: the config's roles)
#   LOAD=0     no load: Narwhal and the engines only
set -o pipefail # not -u: bash 3.2 calls an empty array unbound
narwhal=${1:-bin/narwhal}
admin=127.0.0.1:9090

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

say() { echo "narwhal: $*" >&2; }

for tool in curl jq; do
  command -v "$tool" >/dev/null || say "$tool not found: the README's examples against the running demo use it (Debian: apt-get install $tool; macOS: brew install $tool)"
done

# pids[k] is the process of what[k]: "engine ID ADDRESS ROLE", "serve" or "load".
pids=()
what=()
start() { # start WHAT COMMAND...: runs the command in the background as WHAT
  local w=$1
  shift
  "$@" &
  pids+=($!)
  what+=("$w")
}

stopping=0
stop() {
  trap - INT TERM EXIT
  stopping=1
  if [[ ${#pids[@]} -gt 0 ]]; then
    kill -TERM "${pids[@]}" 2>/dev/null
    wait "${pids[@]}" 2>/dev/null
  fi
}
trap 'stop; say "stopped"; exit 0' INT TERM
trap stop EXIT

seed=1
for e in "${engines[@]}"; do
  read -r id addr role <<<"$e"
  start "engine $e" "$narwhal" enginesim --listen "$addr" --role "$role" --seed "$seed"
  seed=$((seed + 1))
done

reset=(--reset-state)
if [[ ${RESUME:-0} == 1 ]]; then
  reset=()
fi
start serve "$narwhal" serve "${reset[@]}"

say "the page on http://$admin/, the state on http://$admin/narwhal/state; Ctrl-C stops everything"
if [[ ${LOAD:-1} != 0 ]]; then
  # The gateway on :8080 takes your requests through Narwhal too, while the load runs.
  start load "$narwhal" load "${workload[@]}" --listen 127.0.0.1:8080
fi

# roleOf ID: the engine's role now, from /narwhal/state (it may have moved since the start);
# empty when curl or jq is missing or Narwhal does not answer.
roleOf() {
  command -v curl >/dev/null && command -v jq >/dev/null || return 0
  curl -s --max-time 2 "http://$admin/narwhal/state" | jq -r --arg id "$1" '.engines[] | select(.id == $id) | .role' 2>/dev/null
}

# ended K STATUS: what[K] exited with STATUS.
ended() {
  local status=$2 id addr role now
  case ${what[$1]} in
  serve)
    say "narwhal serve exited (status $status); stopping the rest"
    exit "$status"
    ;;
  load)
    say "the load is over; Narwhal and the engines keep running (Ctrl-C stops them)"
    ;;
  engine*)
    read -r _ id addr role <<<"${what[$1]}"
    now=$(roleOf "$id")
    say "engine $id ($addr) exited (status $status); the rest keep running. Restart it (${now:-$role} now) with:" \
      "$narwhal enginesim --listen $addr --role ${now:-$role}"
    ;;
  esac
}

# Report each process that ends, polling once a second (portable: no `wait -n`). A Ctrl-C runs
# the INT trap before the next poll, so the processes it stops are not reported one by one.
while [[ ${#pids[@]} -gt 0 ]]; do
  sleep 1
  [[ $stopping == 1 ]] && break
  k=0
  while [[ $k -lt ${#pids[@]} ]]; do
    if kill -0 "${pids[$k]}" 2>/dev/null; then
      k=$((k + 1))
      continue
    fi
    wait "${pids[$k]}"
    ended "$k" $?
    pids=("${pids[@]:0:$k}" "${pids[@]:$((k + 1))}")
    what=("${what[@]:0:$k}" "${what[@]:$((k + 1))}")
  done
done
