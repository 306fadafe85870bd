#!/bin/sh
# The heartbeat benchmark of two checkouts of this repository, in turn, so
# that both meet the same load on a shared machine:
#
#   bench/heartbeat-alternate.sh OLD_DIR NEW_DIR [PAIRS]
#
# Each directory is a checkout with its dependencies installed (npm ci). Runs
# `npm run bench` with BENCH_ONLY=heartbeat in OLD_DIR's bench, then in
# NEW_DIR's, PAIRS times (default 2), and prints before each run the time and
# the load average, then the run's table rows (shepherd and the floor).
# BENCH_HEARTBEAT_WORKERS (default 2), BENCH_HEARTBEAT_RATES (default 5000)
# and BENCH_AGENTS (default 1000) are passed on. Each run also writes its
# results into its own checkout's bench/results, as `npm run bench` does.
set -eu

if [ $# -lt 2 ]; then
  echo "usage: $0 OLD_DIR NEW_DIR [PAIRS]" >&2
  exit 2
fi
old=$1
new=$2
pairs=${3:-2}
for dir in "$old" "$new"; do
  if [ ! -f "$dir/bench/package.json" ]; then
    echo "$0: $dir has no bench/package.json: not a checkout of this repository" >&2
    exit 2
  fi
done

run() {
  echo "== $1: $(git -C "$1" rev-parse --short HEAD), $(date -u +%H:%M:%S) UTC, load average $(cut -d' ' -f1-3 /proc/loadavg)"
  (cd "$1/bench" &&
    BENCH_ONLY=heartbeat \
      BENCH_HEARTBEAT_WORKERS=${BENCH_HEARTBEAT_WORKERS:-2} \
      BENCH_HEARTBEAT_RATES=${BENCH_HEARTBEAT_RATES:-5000} \
      BENCH_AGENTS=${BENCH_AGENTS:-1000} \
      npm run --silent bench 2>&1) | grep -E '^\| [0-9]' || {
    echo "$0: the run in $1 printed no table" >&2
    exit 1
  }
}

i=1
while [ "$i" -le "$pairs" ]; do
  run "$old"
  run "$new"
  i=$((i + 1))
done
echo "== done $(date -u +%H:%M:%S) UTC, load average $(cut -d' ' -f1-3 /proc/loadavg)"
