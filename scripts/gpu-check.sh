#!/usr/bin/env bash
# The GPU checks, on a machine with an NVIDIA GPU and the artifacts of scripts/build-cuda.sh.
#
# Needs: dist/cuda/gpu-check.tar.xz (carried: dist/ is ignored by git), an NVIDIA driver, the
# CUDA 13 libraries (cuBLAS, cuRAND, NVRTC, cudart: the nvidia-* wheels next to PyTorch, or a
# toolkit), python3 with NumPy (PyTorch makes the model generator fast). No Rust toolchain and
# no network. With the device tool (one command runs at most 10 minutes, so two calls):
#
#   run(command="SPECRS_GPU_PHASES=tests bash scripts/gpu-check.sh", carry=["dist/cuda"], timeout_s=480)
#   run(command="SPECRS_GPU_PHASES=bench bash scripts/gpu-check.sh", carry=["dist/cuda"], timeout_s=580)
#
# Writes everything into one folder ($OUT when set, else ./gpu-results): environment.txt,
# one log per phase, bench.jsonl and summary.txt. Phases, each under its own time limit:
#   1. tests   : the CUDA test subset on device "cuda": device reductions against the host
#                definitions, fixed-shape attention and graph capture/replay, the engine's
#                device paths (lossless greedy for every sequential method, reductions equal
#                to host copies, sampled distribution), the default model when its file is here
#   2. bench   : a Llama-3-8B-shaped random bf16 model generated here, decode tokens/s at
#                batch 1/32/128, plain and speculative (EAGLE-1 head, synthetic acceptance),
#                against the H200's 4.8 TB/s roofline
# Knobs: SPECRS_GPU_PHASES="tests bench", SPECRS_BENCH_ARGS (extra gpu_bench flags),
# SPECRS_BENCH_SHAPE (llama3-8b | tiny), SPEC_RS_MODEL_DIR (holds the default GGUF).
set -uo pipefail
cd "$(dirname "$0")/.."
results="${OUT:-$PWD/gpu-results}"
mkdir -p "$results"
work=/tmp/specrs-gpu
rm -rf "$work" && mkdir -p "$work/bin"
summary="$results/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }

# --- environment ---------------------------------------------------------------------------
cuda_libs=$(python3 - <<'EOF' 2>/dev/null
import glob, os, site
roots = site.getsitepackages() + [site.getusersitepackages()]
for r in roots:
    for d in glob.glob(os.path.join(r, "nvidia", "cu13", "lib")) + glob.glob(os.path.join(r, "nvidia", "*", "lib")):
        if glob.glob(os.path.join(d, "libcublas.so.13")) or glob.glob(os.path.join(d, "libnvrtc.so.13")) \
                or glob.glob(os.path.join(d, "libcurand.so.10")) or glob.glob(os.path.join(d, "libcudart.so.13")):
            print(d)
EOF
)
for d in $cuda_libs /usr/local/cuda/lib64 /usr/local/nvidia/lib64; do
    [[ -d "$d" ]] && LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
export LD_LIBRARY_PATH
{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    python3 --version 2>&1
} >"$results/environment.txt"
cat "$results/environment.txt" >>"$summary"

bundle=dist/cuda/gpu-check.tar.xz
if [[ ! -f "$bundle" ]]; then
    note "FAIL: $bundle missing (build it with scripts/build-cuda.sh and carry dist/cuda)"
    exit 1
fi
tar -C "$work/bin" -xJf "$bundle"
missing=$(ldd "$work/bin/gpu_bench" | grep "not found" || true)
if [[ -n "$missing" ]]; then
    note "FAIL: unresolved libraries: $missing"
    exit 1
fi

status=0
phase() { # name, time limit (s), command...
    local name=$1 limit=$2
    shift 2
    local started=$SECONDS
    timeout --kill-after=10 "$limit" "$@" >"$results/$name.log" 2>&1
    local rc=$?
    local verdict=PASS
    [[ $rc -ne 0 ]] && verdict="FAIL (exit $rc$([[ $rc -eq 124 ]] && echo ', timed out'))" && status=1
    note "$verdict: $name in $((SECONDS - started)) s"
    grep -E "^test result|panicked|FAILED|^\| " "$results/$name.log" | head -40 >>"$summary"
}

export SPECRS_TEST_DEVICE=cuda RUST_BACKTRACE=1
phases="${SPECRS_GPU_PHASES:-tests bench}"

if [[ " $phases " == *" tests "* ]]; then
    phase models-tests 180 "$work/bin/specrs_models" --test-threads 1 reductions graph placement attention kv_cache
    phase engine-device-paths 240 "$work/bin/device_paths" --test-threads 1
    if [[ -n "${SPEC_RS_MODEL_DIR:-}" ]] && ls "$SPEC_RS_MODEL_DIR"/*.gguf >/dev/null 2>&1; then
        phase engine-default-model 180 "$work/bin/engine_default_model" --test-threads 1
    else
        note "SKIP: default-model tests (its 98 MB GGUF exceeds one call's 64 MiB carry; set SPEC_RS_MODEL_DIR)"
    fi
fi

if [[ " $phases " == *" bench "* ]]; then
    shape="${SPECRS_BENCH_SHAPE:-llama3-8b}"
    phase make-model 180 python3 scripts/make_random_llama.py "$work/target" --shape "$shape" --eagle1 "$work/eagle1"
    # shellcheck disable=SC2086 # extra flags are split on purpose.
    phase bench 360 "$work/bin/gpu_bench" --model "$work/target" --draft "$work/eagle1" --device cuda \
        --batches 1,32,128 --k 4 --acceptance 0.7 --prompt-len 128 --gen 64 --bandwidth 4.8e12 \
        --out "$results/bench.jsonl" ${SPECRS_BENCH_ARGS:-}
    rm -rf "$work/target" "$work/eagle1"
fi

note "overall: $([[ $status -eq 0 ]] && echo PASS || echo FAIL)"
exit $status
