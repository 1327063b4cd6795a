#!/usr/bin/env bash
# The GPU checks, on a machine with an NVIDIA GPU and the artifacts of scripts/build-cuda.sh.
#
# Needs: dist/cuda/gpu-check.tar.xz (carried: dist/ is ignored by git), an NVIDIA driver, the
# CUDA 13 libraries (cuBLAS, cuRAND, NVRTC, cudart: the nvidia-* wheels next to PyTorch, or a
# toolkit), python3 with NumPy (PyTorch makes the model generator fast). No Rust toolchain and
# no network. With the device tool (one command runs at most 10 minutes, so two calls):
#
#   run(command="SPECRS_GPU_PHASES=tests bash scripts/gpu-check.sh",
#       carry=["dist/cuda/gpu-check.tar.xz", "dist/default-model-a"], timeout_s=300)
#   run(command="SPECRS_GPU_PHASES='default-model bench' bash scripts/gpu-check.sh",
#       carry=["dist/default-model-b"], timeout_s=560)
#
# The second call must follow while the machine is warm (it keeps what the first carried).
# The 64 MiB include the working tree: the shipped head's safetensors (19 MiB, compiled into
# the binaries) and docs/bench can be moved aside for the two calls.
#
# Writes everything into one folder ($OUT when set, else ./gpu-results): environment.txt,
# one log per phase, bench.jsonl and summary.txt. Phases, each under its own time limit:
#   1. tests   : the CUDA test subset on device "cuda": device reductions against the host
#                definitions, fixed-shape attention and graph capture/replay, the engine's
#                device paths (lossless greedy for every sequential method, reductions equal
#                to host copies, sampled distribution), the block drafters (DFlash, DFlash2,
#                DSpark: oracle acceptance, losslessness in batches, sampled proposals)
#   2. default-model : the default model (bf16, then f32) with its shipped EAGLE-3 head on the
#                held-out chat prompts, real acceptance: tokens/s at batch 1/32/128, plain
#                and speculative, and whether each speculative row equals the plain row; then
#                bf16 at batch 1/32 again with --device-graph-capture (captured CUDA graphs)
#   3. bench   : a Llama-3-8B-shaped random bf16 model generated here, decode tokens/s at
#                batch 1/32/128, plain and speculative (EAGLE-1 head, synthetic acceptance),
#                against the H200's 4.8 TB/s roofline
# The default model's GGUF (98 MB) is over one call's carry: scripts/stage-default-model.sh
# cuts it into dist/default-model-a (carried with dist/cuda) and dist/default-model-b (carried
# by the next call while the machine is warm); this script joins and checks them.
# Knobs: SPECRS_GPU_PHASES="tests default-model bench", SPECRS_BENCH_ARGS (extra gpu_bench
# flags), SPECRS_BENCH_SHAPE (llama3-8b | tiny), SPEC_RS_MODEL_DIR (holds the default GGUF).
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
    note "FAIL: $bundle missing (build it with scripts/build-cuda.sh and carry it)"
    exit 1
fi
tar -C "$work/bin" -xJf "$bundle"
missing=$(ldd "$work/bin/gpu_bench" | grep "not found" || true)
if [[ -n "$missing" ]]; then
    note "FAIL: unresolved libraries: $missing"
    exit 1
fi

# The default model: joined from the staged parts when SPEC_RS_MODEL_DIR does not name it.
if [[ -z "${SPEC_RS_MODEL_DIR:-}" ]] && compgen -G "dist/default-model-b/*.part-b" >/dev/null &&
    compgen -G "dist/default-model-a/*.part-a" >/dev/null; then
    mkdir -p "$work/models"
    name=$(basename dist/default-model-a/*.part-a .part-a)
    cat "dist/default-model-a/$name.part-a" "dist/default-model-b/$name.part-b" >"$work/models/$name"
    if (cd "$work/models" && sha256sum --quiet -c "$OLDPWD/dist/default-model-a/SHA256SUMS"); then
        export SPEC_RS_MODEL_DIR="$work/models"
    else
        note "FAIL: the joined $name does not match its SHA-256 (restage with scripts/stage-default-model.sh)"
    fi
fi

status=0
phase() { # name, time limit (s), command...
    local name=$1 limit=$2
    shift 2
    local started=$SECONDS
    timeout --kill-after=10 "$limit" "$@" >"$results/$name.log" 2>&1
    local rc=$?
    local verdict=PASS
    if [[ $rc -ne 0 ]]; then
        verdict="FAIL (exit $rc)"
        [[ $rc -eq 124 ]] && verdict="FAIL (exit $rc, timed out)"
        status=1
    fi
    note "$verdict: $name in $((SECONDS - started)) s"
    grep -E "^test result|panicked|FAILED|^\| " "$results/$name.log" | head -40 >>"$summary"
}

export SPECRS_TEST_DEVICE=cuda RUST_BACKTRACE=1
phases="${SPECRS_GPU_PHASES:-tests default-model bench}"

if [[ " $phases " == *" tests "* ]]; then
    phase models-tests 180 "$work/bin/specrs_models" --test-threads 1 reductions graph placement attention kv_cache
    phase engine-device-paths 240 "$work/bin/device_paths" --test-threads 1
    # The block drafters' engine-level tests (the others compare with drafts computed on the
    # host, which are CPU tests).
    phase engine-block-drafters 240 "$work/bin/block_drafters" --test-threads 1 \
        oracle_block_drafters explicit_widths a_confidence_threshold random_block_drafters sampled_block_proposals
fi

if [[ " $phases " == *" default-model "* ]]; then
    if [[ -n "${SPEC_RS_MODEL_DIR:-}" ]] && ls "$SPEC_RS_MODEL_DIR"/*.gguf >/dev/null 2>&1; then
        # HOME for the shipped head's cache directory, kept inside the scratch folder.
        phase default-model 240 env HOME="$work" "$work/bin/gpu_bench" --model smollm2-135m-instruct \
            --shipped-draft --dtype bf16 --device cuda --batches 1,32,128 --gen 128 --prompt-len 96 \
            --bandwidth 4.8e12 --out "$results/default-model.jsonl"
        # The same in f32: greedy speculative rows must equal plain rows where no bf16 near-tie
        # between GEMM shapes can flip an argmax.
        phase default-model-f32 150 env HOME="$work" "$work/bin/gpu_bench" --model smollm2-135m-instruct \
            --shipped-draft --dtype f32 --device cuda --batches 1,32 --gen 128 --prompt-len 96 \
            --bandwidth 4.8e12 --out "$results/default-model-f32.jsonl"
        # The bf16 run again with decode steps replayed from captured CUDA graphs: tokens/s
        # against the run above, and speculative rows against plain rows.
        phase default-model-graphs 150 env HOME="$work" "$work/bin/gpu_bench" --model smollm2-135m-instruct \
            --shipped-draft --dtype bf16 --device cuda --batches 1,32 --gen 128 --prompt-len 96 \
            --bandwidth 4.8e12 --device-graph-capture --out "$results/default-model-graphs.jsonl"
    else
        note "SKIP: default-model (no GGUF: stage it with scripts/stage-default-model.sh, or set SPEC_RS_MODEL_DIR)"
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
