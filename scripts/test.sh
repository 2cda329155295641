#!/usr/bin/env bash
# The whole test suite, as CI runs it, on a fresh Debian/Ubuntu machine (as root or with sudo):
# installs system packages and the dev extras, lints, brings up the real 4-node Slurm dev cluster
# (network namespaces on this machine), builds the local container test image, runs pytest, and
# takes the cluster down again. Cluster and container tests are mandatory when CI=true.
# Usage: sudo ./scripts/test.sh [pytest args]
#        ./scripts/test.sh --quick [pytest args]   lint, unit tests and goldens: no packages, no cluster,
#                                                  a few minutes; the check to run on every change
# TORCHHPC_TEST_TIMES=FILE records each test's wall and CPU time: python scripts/test_times.py FILE
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"

step() { printf '\n=== %s (%ss)\n' "$*" "$SECONDS" >&2; }
# torchhpc's bytecode, written once: where PYTHONDONTWRITEBYTECODE is set (some CI images set it), every
# CLI call, rank boot and job helper the suite starts would compile torchhpc from source again (~0.05 s of
# CPU each, thousands of them). compileall writes it anyway; imports only read it.
compile_src() { python -m compileall -q -j 0 src >/dev/null; }
# pytest's assertion rewriting, cached the same way: with PYTHONDONTWRITEBYTECODE set, each of the five workers
# rewrote every test module's asserts again (10 CPU-s of collection each; 4 from the cache). One collection that
# may write fills tests/**/__pycache__; the workers only read it.
rewrite_tests() { env -u PYTHONDONTWRITEBYTECODE python -m pytest --collect-only -q -p no:cacheprovider "$@" >/dev/null; }
# ruff and mypy on one core; beside them, on the other, the rewrite of the tests under the paths given (none: all)
lint() {
  rewrite_tests "$@" & local pid=$!
  ruff check src tests examples benchmarks
  mypy
  wait "$pid" || { echo "Error: collecting the tests failed: python -m pytest --collect-only $* shows why" >&2; exit 1; }
}

if [ "${1:-}" = "--quick" ]; then
  shift
  [ -x .venv/bin/python ] || { step "python environment"; ./scripts/setup.sh dev,lightning,compat; }
  step "lint"
  lint tests/unit
  compile_src
  step "unit tests and goldens (no cluster; -m 'not slow': the soaks and matrices run in the full suite)"
  python -m pytest -q -n 2 -m "not slow" -p no:cacheprovider tests/unit "$@"
  step "done"
  exit 0
fi

step "system packages"
PKGS=(slurmctld slurmd slurm-client slurm-wlm-basic-plugins munge slurmdbd mariadb-server openmpi-bin libopenmpi-dev
      dnsmasq-base iperf3 shellcheck iproute2 procps openssh-server openssh-client socat git acl zsh
      podman charliecloud-runtime debootstrap)  # the last three: the container test image's (.ci/build-test-image.sh)
missing=()
for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ "${#missing[@]}" -gt 0 ]; then
  $SUDO apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The container test image (minutes on a new machine, cached after) starts now: its root filesystem
# (debootstrap) beside the Python environment, then it links that environment's packages in, while the lint,
# the dev cluster and the soaks run; pytest waits for it. Its log is printed if it fails.
IMAGE_LOG=""
if [ -x .ci/build-test-image.sh ]; then
  step "container test image (in the background)"
  IMAGE_LOG=$(mktemp)
  VENV_READY=$(mktemp -u)
  TORCHHPC_TEST_VENV_READY=$VENV_READY .ci/build-test-image.sh >"$IMAGE_LOG" 2>&1 &
  IMAGE_PID=$!
  trap 'kill "$IMAGE_PID" 2>/dev/null || true' EXIT  # a failed step does not leave it running
fi

step "python environment"
./scripts/setup.sh dev,lightning,compat
[ -z "$IMAGE_LOG" ] || touch "$VENV_READY"

# The lint beside the dev cluster's start (its daemons mostly wait on each other: 5 s of an idle core).
step "lint (the test modules' rewritten asserts cached beside it, on the other core) and the dev cluster"
lint & LINT_PID=$!
torchhpc devcluster down >/dev/null 2>&1 || true
# --login: a real sshd as the login node; thpcremote is the second user the --remote tests log in as.
# --cpus-per-node 12: the compatibility matrix's cells (2 nodes each) and the tests beside them start their jobs at
# once (with 4 a node they queued behind each other for minutes).
torchhpc devcluster up --nodes 4 --cpus-per-node 12 --accounting --login --login-user thpcremote
trap 'torchhpc devcluster down || true; [ -z "$IMAGE_LOG" ] || kill "$IMAGE_PID" 2>/dev/null || true' EXIT
wait "$LINT_PID"

# The two soaks side by side: the requeue test runs inside the Hugging Face soak, beside its 3 busy loops and its
# ranks (more load than its own 3 loops gave it; 12 s of set-up saved). The HF soak: once per launcher, all four
# at once (2x was a second wave of 50 s; the matrix's own hf_trainer cells run again in pytest).
step "soaks: the Hugging Face Trainer cell once per launcher beside 3 busy loops (issue 29: no rank aborts at exit), and the batch script's requeue test 20x beside them (a race fails here every time, not 1 in 10)"
HF_LOG=$(mktemp)
python benchmarks/soak_compat.py -n 1 -P 4 --hogs 3 --cells hf_trainer --launchers local,torchrun,srun,mpirun >"$HF_LOG" 2>&1 &
HF_PID=$!
sleep 1  # its busy loops start first
./scripts/soak.sh -n 20 -P 4 --hogs 0 -k warning_creates_the_stop_file_and_requeues tests/unit/test_stop.py
wait "$HF_PID" || { cat "$HF_LOG" >&2; echo "Error: the Hugging Face soak failed (its log above)" >&2; exit 1; }
cat "$HF_LOG" >&2
rm -f "$HF_LOG"

# pytest waits for the image. Started beside it instead (runs 15 and 16, docs/testing.md), pytest took 30.6-31.6
# minutes against 26.3-28.1, and the cores stood 10-24 % idle for minutes early on: the build shares the CPU with
# five workers, and the container tests wait on its lock holding their slots.
if [ -n "$IMAGE_LOG" ]; then
  step "container test image (waiting for it)"
  wait "$IMAGE_PID" || { cat "$IMAGE_LOG" >&2; echo "Error: .ci/build-test-image.sh failed (its log above)" >&2; exit 1; }
  rm -f "$IMAGE_LOG" "$VENV_READY"
fi

# Side by side by default (TORCHHPC_TEST_WORKERS=0: one test at a time, about 55 minutes here): five workers
# (tests/parallel.py, tests/schedule.py). The tests that change the cluster run as one exclusive chain behind a
# lock; at most TORCHHPC_TEST_SLOTS (default: the cores + 1) rank-starting tests at once, beside the tests
# that mostly wait (measured, tests/durations.json) and the unit tests; groups handed out by their expected
# seconds. docs/testing.md has the runs, and where their time goes.
step "pytest"
compile_src
# Every rank's OpenMP threads sleep when idle instead of spinning first (libgomp's default): side by side
# the 2 cores run 10-12 processes, and a spinning thread only takes CPU from the ranks of the tests beside.
# The soaks above keep the default: their races were measured with it.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
python -m pytest -ra -n "${TORCHHPC_TEST_WORKERS:-5}" --dist loadgroup --no-loadscope-reorder "$@"
step "done"
