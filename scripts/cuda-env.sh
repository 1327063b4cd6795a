# shellcheck shell=bash
# Source this file (`source scripts/cuda-env.sh`) to get a CUDA 13.0 build environment on a
# machine with no CUDA toolkit and no GPU driver, from PyPI wheels alone.
#
# Why CUDA 13.0 exactly: candle-kernels embeds PTX that the *driver* JIT-compiles when a module
# is loaded, and a driver only accepts PTX up to its own CUDA version. The GPU machines run
# driver 580 (CUDA 13.0), so PTX from nvcc 13.1+ would fail there with
# CUDA_ERROR_UNSUPPORTED_PTX_VERSION. The same machines carry the CUDA 13 cuBLAS/cuRAND/NVRTC/
# cudart wheels next to PyTorch (cu130), so a 13.x build needs no libraries carried along:
# libcublas.so.13, libcurand.so.10, libnvrtc.so.13 and libcudart.so.13 are found there.
# cudarc 0.19 supports 13.0 (`cuda-13000`).
#
# What it does (once; later calls only export variables):
#   1. downloads the pinned wheels below into "$SPECRS_CUDA_CACHE/wheels" with pip,
#   2. unpacks their common `nvidia/cu13/` tree into "$SPECRS_CUDA_CACHE/cuda-13.0", which then
#      looks like a toolkit: bin/nvcc, nvvm/, include/ (with include/cccl), lib/ and lib64 -> lib,
#   3. adds the unversioned development names the linker looks for (libcublas.so ->
#      libcublas.so.13, ...), which wheels never ship,
#   4. builds lib64/stubs/libcuda.so, a link-time stand-in for the driver (see below),
#   5. exports CUDA_HOME, CUDA_PATH, PATH, LIBRARY_PATH, CUDA_COMPUTE_CAP=90 (H100/H200),
#      CUDARC_CUDA_VERSION=13000 and NVCC_CCBIN.
#
# The libcuda stub. candle forces cudarc's `dynamic-linking`, so every artifact links `-lcuda`
# and needs a libcuda.so at link time; no PyPI wheel ships NVIDIA's `lib64/stubs/libcuda.so`.
# We compile our own: one C function per driver entry point that cudarc 0.19 declares
# (the `pub unsafe fn cu*` items of cudarc's `src/driver/sys/mod.rs`, a superset of what candle
# calls), each returning CUDA_ERROR_STUB_LIBRARY (34) like NVIDIA's stub. Its SONAME is
# `libcuda.so.1`, so artifacts record a dependency on the real driver's name, and the stub sits
# only on LIBRARY_PATH (link time), never on LD_LIBRARY_PATH: at run time the real driver wins.
#
# Knobs: SPECRS_CUDA_CACHE (default ~/.cache/spec-rs), CUDA_COMPUTE_CAP (default 90), PIP
# (default "python3 -m pip").

specrs_cuda_setup() {
    local cache="${SPECRS_CUDA_CACHE:-$HOME/.cache/spec-rs}"
    local home="$cache/cuda-13.0"
    local wheels="$cache/wheels"
    local pip="${PIP:-python3 -m pip}"
    # One consistent CUDA 13.0 line (13.0 update 2 where a component had one). cuRAND keeps its
    # own numbering: 10.4.0 is the CUDA 13.0 release.
    local pins=(
        nvidia-cuda-nvcc==13.0.88
        nvidia-cuda-crt==13.0.88
        nvidia-nvvm==13.0.88
        nvidia-cuda-cccl==13.0.85
        nvidia-cuda-runtime==13.0.96
        nvidia-cuda-nvrtc==13.0.88
        nvidia-cublas==13.0.2.14
        nvidia-curand==10.4.0.35
    )

    if [[ ! -f "$home/.complete" ]]; then
        echo "cuda-env: installing CUDA 13.0 from PyPI wheels into $home" >&2
        mkdir -p "$wheels" || return 1
        # shellcheck disable=SC2086 # $pip is a command line.
        $pip download --quiet --no-deps --only-binary=:all: \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
            --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
            --platform manylinux_2_12_x86_64 --platform manylinux2010_x86_64 \
            --python-version 3.11 --implementation py \
            -d "$wheels" "${pins[@]}" || return 1

        local staging="$cache/staging"
        rm -rf "$staging" "$home" && mkdir -p "$staging" || return 1
        local pin name wheel
        for pin in "${pins[@]}"; do
            name="${pin%%==*}"
            wheel=$(compgen -G "$wheels/${name//-/_}-${pin##*==}-*.whl" | head -n 1) || true
            [[ -n "$wheel" ]] || { echo "cuda-env: no wheel for $pin in $wheels" >&2; return 1; }
            python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' \
                "$wheel" "$staging" || return 1
        done
        mv "$staging/nvidia/cu13" "$home" && rm -rf "$staging" || return 1
        # zipfile drops the executable bits.
        chmod +x "$home"/bin/* "$home"/nvvm/bin/* || return 1
        ln -s lib "$home/lib64" || return 1

        # Development names for the libraries rustc links (-lcublas -lcublasLt -lcurand -lnvrtc,
        # and -lcudart from candle-kernels).
        local lib
        for lib in cublas.so.13 cublasLt.so.13 curand.so.10 nvrtc.so.13 cudart.so.13; do
            ln -s "lib$lib" "$home/lib/lib${lib%.so.*}.so" || return 1
        done

        specrs_cuda_build_libcuda_stub "$home/lib/stubs" || return 1
        touch "$home/.complete"
    fi

    export CUDA_HOME="$home"
    export CUDA_PATH="$home"
    export CUDA_ROOT="$home"
    case ":$PATH:" in *":$home/bin:"*) ;; *) export PATH="$home/bin:$PATH" ;; esac
    export LIBRARY_PATH="$home/lib/stubs:$home/lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
    export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
    export CUDARC_CUDA_VERSION=13000
    export NVCC_CCBIN="${NVCC_CCBIN:-$(command -v g++)}"
}

# Builds `$1/libcuda.so` (SONAME libcuda.so.1) exporting every driver entry point cudarc
# declares. The names come from the cudarc sources cargo fetched for this workspace.
specrs_cuda_build_libcuda_stub() {
    local out="$1"
    local repo
    repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    local sys
    sys=$(cd "$repo" && cargo metadata --format-version 1 --locked --features specrs-models/cuda 2>/dev/null |
        python3 -c '
import json, os, sys
meta = json.load(sys.stdin)
[pkg] = [p for p in meta["packages"] if p["name"] == "cudarc"]
print(os.path.join(os.path.dirname(pkg["manifest_path"]), "src/driver/sys/mod.rs"))')
    [[ -f "$sys" ]] || { echo "cuda-env: cudarc sources not found (run cargo fetch)" >&2; return 1; }

    mkdir -p "$out" || return 1
    {
        echo "/* Link-time stand-in for libcuda.so.1, generated by scripts/cuda-env.sh from"
        echo "   $sys. Never loaded: every entry point returns CUDA_ERROR_STUB_LIBRARY. */"
        grep -oE '^pub unsafe fn cu[A-Za-z0-9_]+' "$sys" | sed 's/^pub unsafe fn //' | sort -u |
            sed 's/.*/int &(void) { return 34; }/'
    } >"$out/libcuda_stub.c" || return 1
    cc -shared -fPIC -O1 -Wl,-soname,libcuda.so.1 -o "$out/libcuda.so" "$out/libcuda_stub.c" ||
        return 1
    echo "cuda-env: built $out/libcuda.so ($(grep -c 'return 34' "$out/libcuda_stub.c") entry points)" >&2
}

specrs_cuda_setup || { echo "cuda-env: setup failed" >&2; return 1 2>/dev/null || exit 1; }
