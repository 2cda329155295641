#!/usr/bin/env bash
# The GPU proof in one run: every GPU claim of docs/training.md measured on the node it runs on.
#
#   benchmarks/gpu_proof.sh OUTDIR [--smoke] [PART...]
#
# PARTs (default: all, in the order bench doctor tworanks checkpoint failures examples table):
#   bench     benchmarks/gpu_training.py: resnet_ddp.py's step / torchvision reference (224 px, batch 128,
#             bf16, channels_last, interleaved rounds, memory, profile) and MNIST in-memory / DataLoader
#   table     benchmarks/training_table.py --only table (single, DP, DDP over the visible GPUs; MD + PNG)
#   doctor    torchhpc doctor --gpu
#   tworanks  two NCCL ranks on one GPU under `torchhpc run -n 2`: through thd.init() (refused before
#             NCCL: one Error + HINT) and through plain torch (NCCL's own error); then what is left running
#   examples  a pytorch/examples-style DDP script with snapshot/resume (from $EXT_DDP_DIR, a copy of the
#             tutorial's multigpu_torchrun.py + datautils.py, run unmodified) and examples/lightning_ddp.py,
#             each under `torchhpc run -n 1`
#   checkpoint benchmarks/gpu_checkpoint.py: DDP and FSDP2 on CUDA saved (blocking and not) and resumed, bit for bit
#   failures  a real CUDA out-of-memory and real NCCL errors under `torchhpc run -n 1 --background`
#             (and two plain-torch NCCL ranks on one GPU under -n 2),
#             then `torchhpc wait`, `torchhpc diagnose` (the verdict) and `torchhpc logs` (the real text)
#
# Every step has its own time limit, so one hang costs that step only. Writes gpu_training.{json,md},
# profile.txt, training_table.{md,png,json} and summary.txt into OUTDIR; everything else goes to stdout.
# --smoke: tiny sizes, for a dry run of the script itself on a machine without a GPU.
set -u
out=${1:?usage: benchmarks/gpu_proof.sh OUTDIR [--smoke] [PART...]}
shift
smoke=0
if [ "${1:-}" = --smoke ]; then smoke=1; shift; fi
parts=${*:-bench doctor tworanks checkpoint failures examples table}
mkdir -p "$out"
out=$(cd "$out" && pwd)
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo" || exit 1
export PYTHONPATH="$repo/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
TH=("$PY" -m torchhpc)
summary="$out/summary.txt"
: >"$summary"

# step NAME LIMIT CMD...: run CMD under a time limit, record its exit status and seconds.
step() {
    local name=$1 limit=$2 start rc
    shift 2
    echo "=== $name (limit ${limit}s): $*"
    start=$(date +%s)
    timeout -k 10 "$limit" "$@"
    rc=$?
    echo "=== $name: exit $rc after $(($(date +%s) - start)) s"
    echo "$name: exit $rc, $(($(date +%s) - start)) s" >>"$summary"
    return 0
}

left_running() {
    echo "--- processes of these runs left running:"
    pgrep -af 'gpu_failures|multigpu_torchrun|lightning_ddp|torch.distributed.run' || echo "(none)"
    if command -v nvidia-smi >/dev/null; then
        echo "--- GPU compute processes:"
        nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | grep . || echo "(none)"
    fi
}

# failure CASE RANKS LIMIT [RUN-FLAGS...]: one failing job in the background, its verdict and its text.
failure() {
    local case=$1 ranks=$2 limit=$3 submitted handle
    shift 3
    echo "=== failure $case: torchhpc run -n $ranks $* --background benchmarks/gpu_failures.py $case"
    submitted=$(timeout 60 "${TH[@]}" run -n "$ranks" "$@" --background --name "fail-$case" benchmarks/gpu_failures.py "$case" 2>&1)
    echo "$submitted"
    handle=$(grep -o 'local:[0-9a-f]*' <<<"$submitted" | head -1)
    if [ -z "$handle" ]; then
        echo "failure $case: not submitted" >>"$summary"
        return 0
    fi
    step "failure $case wait" "$limit" "${TH[@]}" wait "$handle"
    step "failure $case diagnose" 60 "${TH[@]}" diagnose "$handle"
    step "failure $case logs" 60 "${TH[@]}" logs "$handle"
}

echo "# gpu_proof on $(hostname), $(date -u +%FT%TZ), parts: $parts"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv
"$PY" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "NCCL", torch.cuda.nccl.version() if torch.cuda.is_available() else None, "GPUs", torch.cuda.device_count())'
"$PY" -c 'import torchvision, lightning; print("torchvision", torchvision.__version__, "lightning", lightning.__version__)' || true

for part in $parts; do
    case $part in
    bench)
        if [ $smoke = 1 ]; then sizes=(--device cpu --quick --reference builtin); else sizes=(); fi
        step "bench gpu_training" 180 "$PY" benchmarks/gpu_training.py "${sizes[@]}" \
            --json "$out/gpu_training.json" --markdown "$out/gpu_training.md" --profile "$out/profile.txt"
        ;;
    table)
        if [ $smoke = 1 ]; then sizes=(--quick --table-rounds 1); else sizes=(); fi
        step "table" 300 "$PY" benchmarks/training_table.py --only table --no-cluster "${sizes[@]}" --out "$out"
        ;;
    doctor)
        step "doctor --gpu" 240 "${TH[@]}" doctor --gpu
        ;;
    tworanks)
        step "two ranks, thd.init" 120 "${TH[@]}" run -n 2 benchmarks/gpu_failures.py thd
        left_running
        step "two ranks, plain torch" 180 "${TH[@]}" run -n 2 benchmarks/gpu_failures.py nccl
        left_running
        ;;
    examples)
        work=$(mktemp -d)
        if [ -n "${EXT_DDP_DIR:-}" ] && [ -f "$EXT_DDP_DIR/multigpu_torchrun.py" ]; then
            cp "$EXT_DDP_DIR"/*.py "$work/"
            # The tutorial saves snapshot.pt in its working directory; the second run resumes from it.
            step "pytorch/examples DDP, epochs 0-3" 180 bash -c "cd '$work' && ${TH[*]} run -n 1 multigpu_torchrun.py 4 2"
            ls -l "$work/snapshot.pt" 2>&1
            step "pytorch/examples DDP, resumed to 6" 180 bash -c "cd '$work' && ${TH[*]} run -n 1 multigpu_torchrun.py 6 2"
        else
            echo "examples: no EXT_DDP_DIR with multigpu_torchrun.py; the pytorch/examples script is skipped"
        fi
        if [ $smoke = 1 ]; then sizes=(--max-steps 3 --train-size 512 --test-size 128); else sizes=(--train-size 10000 --test-size 2000); fi
        step "lightning_ddp" 240 "${TH[@]}" run -n 1 examples/lightning_ddp.py --epochs 2 --cache "$work" "${sizes[@]}"
        ;;
    checkpoint)
        step "checkpoint resumed bit for bit" 300 "$PY" benchmarks/gpu_checkpoint.py --root "$out/checkpoint"
        ;;
    failures)
        failure oom 1 240
        failure bad-ordinal 1 120
        failure nccl 1 120 -e NCCL_SOCKET_IFNAME=nosuchif0 -e NCCL_DEBUG=WARN
        failure nccl 2 120  # two plain-torch NCCL ranks on one GPU: NCCL's "Duplicate GPU detected"
        left_running
        ;;
    *)
        echo "unknown part $part (bench table doctor tworanks checkpoint examples failures)"
        ;;
    esac
done
echo "# summary"
cat "$summary"
