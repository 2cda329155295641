#!/usr/bin/env bash
# Soak: run a set of tests N times beside a CPU hog and count failures per test.
# A race that fails 1 run in 10 on a quiet machine fails most soaks: CI runs a short one.
#
# Usage: scripts/soak.sh [-n RUNS] [-P PARALLEL] [--hogs K] [-k EXPR] [--logs DIR] [TEST...]
#   -n RUNS       how many times to run the tests (default 10; $SOAK_RUNS)
#   -P PARALLEL   runs at once (default 1; each in its own pytest process and tmp dir)
#   --hogs K      busy loops beside the tests (default 3; $SOAK_HOGS); 0 = no hog
#   -k EXPR       passed to pytest -k
#   --logs DIR    keep every run's output here (default: a new directory under /tmp)
#   TEST...       pytest paths or node ids (default: the nothing-lost unit tests, the local-run
#                 tests and the 2-node Slurm pi job per launcher, which needs a dev cluster)
# Prints "FAILS/RUNS  TEST" for every test that failed at least once; exit 1 if any did.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] && export PATH="$PWD/.venv/bin:$PATH"

runs=${SOAK_RUNS:-10} parallel=1 hogs=${SOAK_HOGS:-3} kexpr="" logs="" tests=()
usage() { sed -n '2,13s/^# \{0,1\}//p' "$0"; }
bad() { printf 'Error: %s\nHINT: scripts/soak.sh -h\n' "$1" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    -n) runs=${2:-}; shift 2 ;;
    -P) parallel=${2:-}; shift 2 ;;
    --hogs) hogs=${2:-}; shift 2 ;;
    -k) kexpr=${2:-}; shift 2 ;;
    --logs) logs=${2:-}; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; tests+=("$@"); break ;;
    -*) bad "unknown option $1" ;;
    *) tests+=("$1"); shift ;;
  esac
done
for v in "$runs" "$parallel" "$hogs"; do
  [[ $v =~ ^[0-9]+$ ]] || bad "-n, -P and --hogs take a whole number (got '$v')"
done
if [ "$runs" -lt 1 ] || [ "$parallel" -lt 1 ]; then bad "-n and -P must be at least 1"; fi
if [ "${#tests[@]}" -eq 0 ]; then
  tests=(tests/unit/test_stop.py tests/integration/test_local_run.py
         tests/integration/test_slurm_jobs.py::test_pi_two_nodes_each_launcher)
fi
logs=${logs:-$(mktemp -d /tmp/torchhpc-soak.XXXXXX)}
mkdir -p "$logs"

hog_pids=()
stop_hogs() { [ "${#hog_pids[@]}" -eq 0 ] || kill "${hog_pids[@]}" 2>/dev/null || true; }
trap stop_hogs EXIT
trap 'exit 130' INT TERM
for ((i = 0; i < hogs; i++)); do
  ( while :; do :; done ) &
  hog_pids+=("$!")
done

one_run() {  # one pytest process, its own tmp dir; exit status and output stay in $logs/run-N.*
  local n=$1 dir="$logs/run-$1"
  mkdir -p "$dir"
  local args=(-q -p no:cacheprovider -rfE --basetemp "$dir/tmp")
  [ -n "$kexpr" ] && args+=(-k "$kexpr")
  set +e
  python -m pytest "${args[@]}" "${tests[@]}" >"$dir/out.txt" 2>&1
  echo $? >"$dir/rc"
  set -e
}

printf 'soak: %s run(s) of %s, %s at a time, beside %s busy loop(s); logs in %s\n' \
  "$runs" "${tests[*]}" "$parallel" "$hogs" "$logs" >&2
start=$SECONDS
for ((n = 1; n <= runs; n += parallel)); do
  pids=()
  for ((m = n; m < n + parallel && m <= runs; m++)); do
    one_run "$m" &
    pids+=("$!")
  done
  wait "${pids[@]}" || true
  for ((m = n; m < n + parallel && m <= runs; m++)); do
    printf 'soak: run %s/%s exit %s (%ss)\n' "$m" "$runs" "$(cat "$logs/run-$m/rc")" "$((SECONDS - start))" >&2
  done
done

failed_runs=0
: >"$logs/failures.txt"
for ((n = 1; n <= runs; n++)); do
  rc=$(cat "$logs/run-$n/rc")
  # pytest exit 5 = nothing collected: a wrong -k or path is an error, not a pass.
  [ "$rc" = 5 ] && { tail -5 "$logs/run-$n/out.txt" >&2; bad "no test selected by ${tests[*]} ${kexpr:+-k $kexpr}"; }
  [ "$rc" = 0 ] && continue
  failed_runs=$((failed_runs + 1))
  # -rfE summary lines: "FAILED node-id - message" / "ERROR node-id - message"
  if ! grep -E '^(FAILED|ERROR) ' "$logs/run-$n/out.txt" | awk '{print $2}' | sort -u >>"$logs/failures.txt"; then
    echo "(run exited $rc without a FAILED line)" >>"$logs/failures.txt"
  fi
done

printf '\nsoak: %s/%s run(s) failed in %ss\n' "$failed_runs" "$runs" "$((SECONDS - start))"
if [ "$failed_runs" -gt 0 ]; then
  printf '%7s  %s\n' "FAILS" "TEST"
  sort "$logs/failures.txt" | uniq -c | sort -rn | while read -r count id; do
    printf '%3s/%-3s  %s\n' "$count" "$runs" "$id"
  done
  printf 'outputs: %s/run-N/out.txt\n' "$logs"
  exit 1
fi
