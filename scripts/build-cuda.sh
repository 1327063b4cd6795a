#!/usr/bin/env bash
# Builds the CUDA artifacts on a machine without a GPU, into dist/cuda/:
#
#   spec-rs                          the server/CLI binary (`--features cuda`)
#   spec_rs_cuda-*.whl               the abi3 Python wheel, distribution name spec-rs-cuda
#   gpu-check.tar.xz                 what scripts/gpu-check.sh runs on a GPU machine: the CUDA
#                                    test binaries and the benchmark, compressed
#
# CUDA comes from PyPI wheels (scripts/cuda-env.sh: CUDA 13.0, sm_90 for H100/H200). Code is
# built for the portable x86-64-v3 CPU target (.cargo/config.toml) and stripped. The device
# machine takes at most 64 MiB per call, the working tree included: carry
# dist/cuda/gpu-check.tar.xz alone, not dist/cuda (the CLI binary alone is over 100 MiB);
# sizes are printed at the end.
#
# Knobs: CARGO_TARGET_DIR (default /tmp/target-cuda, kept apart from CPU builds because
# candle's kernels are rebuilt whenever the feature set changes), SPECRS_BUILD_WHEEL=0 to skip
# the wheel, SPECRS_BUILD_JOBS (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/cuda-env.sh

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/tmp/target-cuda}"
jobs="${SPECRS_BUILD_JOBS:-2}"
export CUDAFORGE_THREADS="$jobs"
out=dist/cuda
mkdir -p "$out"
cargo_cuda=(nice -n 15 cargo)
common=(--release --locked --features cuda -j "$jobs")

# Three cargo invocations (binaries, test executables, the wheel). Each package selection
# resolves its build dependencies' features on its own, and candle-kernels recompiles its
# CUDA sources for every distinct resolution, so the selections are kept few.
echo "== spec-rs binary and the benchmark"
"${cargo_cuda[@]}" build "${common[@]}" -p specrs-server -p specrs-engine --bin spec-rs --example gpu_bench
install -m 755 "$CARGO_TARGET_DIR/release/spec-rs" "$out/spec-rs"

echo "== GPU check bundle"
# What scripts/gpu-check.sh runs: the specrs-models unit tests, the engine's device_paths and
# block_drafters tests and the benchmark. (The specrs-engine unit tests are built by the same cargo invocation, so
# that its feature resolution matches the binaries', but are CPU tests and stay behind.)
bundle="$CARGO_TARGET_DIR/gpu-check"
rm -rf "$bundle" && mkdir -p "$bundle"
tests=$("${cargo_cuda[@]}" test "${common[@]}" --no-run --message-format=json \
    -p specrs-models -p specrs-engine --lib --test device_paths --test block_drafters |
    python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        print(m["executable"])')
for exe in $tests; do
    name=$(basename "$exe")
    name=${name%-*} # specrs_models-<hash>: keep the crate or test name
    case "$name" in
        specrs_models | device_paths | block_drafters) install -m 755 "$exe" "$bundle/$name" ;;
    esac
done
install -m 755 "$CARGO_TARGET_DIR/release/examples/gpu_bench" "$bundle/gpu_bench"
strip "$bundle"/*
# The binaries share candle's PTX and the shipped draft head: a dictionary larger than one
# binary lets xz store the shared bytes once (29 MB at -9, 23 MB with this dictionary).
tar -C "$bundle" -cf - . | xz -T 1 --lzma2=preset=9e,dict=192MiB >"$out/gpu-check.tar.xz"

if [[ "${SPECRS_BUILD_WHEEL:-1}" != 0 ]]; then
    echo "== wheel"
    # maturin names the distribution after pyproject.toml (spec-rs); the CUDA wheel is renamed
    # to spec-rs-cuda so both can sit on one index, as mistral.rs does with mistralrs-cuda.
    # `--auditwheel skip`: the CUDA libraries and the driver must come from the machine, not
    # be copied into the wheel.
    staging="$CARGO_TARGET_DIR/wheel"
    rm -rf "$staging" && mkdir -p "$staging"
    nice -n 15 maturin build --release --locked --features cuda --strip --auditwheel skip -o "$staging"
    rm -f "$out"/spec_rs_cuda-*.whl
    python3 scripts/rename_wheel.py "$staging"/spec_rs-*.whl spec-rs-cuda "$out"
fi

echo "== artifacts (the device machine carries at most 64 MiB per call)"
for f in "$out"/*; do
    awk -v s="$(stat -c %s "$f")" -v f="$f" 'BEGIN { printf "%10.1f MiB  %s\n", s / 1048576, f }'
done
echo "bundle contents (uncompressed):"
ls -la "$bundle"
