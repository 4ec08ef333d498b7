#!/bin/sh
# The prerequisites of `make run` and `make test`, checked before they start: one line for each
# that is missing (README, "Two commands"). Exits 1 when one the target cannot run without is
# missing; what only the README's examples use is named and the target goes on.
#
# Usage: scripts/prereqs.sh run|test [go command]
target=$1
go=${2:-go}
missing=0

need() { # need WHAT WHY: a hard prerequisite is missing
  echo "make $target: $1 not found: $2" >&2
  missing=1
}

if ! command -v "$go" >/dev/null 2>&1; then
  need "$go" "install Go 1.26 or later (https://go.dev/dl/)"
else
  # go.mod asks for go 1.26: an older go fetches that toolchain itself (GOTOOLCHAIN=auto), over
  # the network; say so rather than fail later on a download.
  v=$("$go" env GOVERSION 2>/dev/null | sed 's/^go//')
  major=${v%%.*}
  rest=${v#*.}
  minor=${rest%%.*}
  case $major.$minor in
  *[!0-9.]* | .) ;;
  *)
    if [ "$major" -lt 1 ] || { [ "$major" -eq 1 ] && [ "$minor" -lt 26 ]; }; then
      echo "make $target: Go $v found; the module needs 1.26, which Go downloads on first use (needs the network), or install it: https://go.dev/dl/" >&2
    fi
    ;;
  esac
fi

case $target in
run)
  command -v bash >/dev/null 2>&1 || need bash "scripts/run-local.sh runs under bash (3.2 or later)"
  for tool in curl jq; do
    command -v $tool >/dev/null 2>&1 || echo "make run: $tool not found: only the README's examples against the running demo use it" >&2
  done
  ;;
test)
  if ! command -v chromium >/dev/null 2>&1 && ! command -v apt-get >/dev/null 2>&1; then
    need chromium "the live page's test drives headless Chromium: install it and put chromium on PATH (on Debian and Ubuntu make test installs it with apt-get)"
  fi
  ;;
esac
exit $missing
