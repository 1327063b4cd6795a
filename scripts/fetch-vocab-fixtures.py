#!/usr/bin/env python3
"""Fetches the tokenizer fixtures the GGUF tokenizer tests compare against.

llama.cpp keeps, for each tokenizer family it reads, a GGUF file holding only the vocabulary
(`ggml-vocab-<name>.gguf`) with test texts (`.inp`) and the token ids Hugging Face's tokenizer
gives them (`.out`). The llama-cpp-python source release on PyPI carries them; this script takes
that release (pinned and checked by its SHA-256), extracts the fixtures the tests use and
nothing else, and is a no-op once they are in place.

    python3 scripts/fetch-vocab-fixtures.py [DIR]

DIR defaults to $SPECRS_VOCAB_FIXTURES, else ~/.cache/spec-rs/vocab-fixtures.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

RELEASE = "llama_cpp_python-0.3.36.tar.gz"
# Files on PyPI are content-addressed, so the URL and digest pin the release.
URL = (
    "https://files.pythonhosted.org/packages/ec/e9/"
    "e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/" + RELEASE
)
SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
# The vocabularies with test texts whose tokenizer model spec-rs builds from GGUF metadata.
VOCABS = (
    "llama-spm",
    "phi-3",
    "gpt-2",
    "llama-bpe",
    "qwen2",
    "starcoder",
    "refact",
    "command-r",
    "deepseek-coder",
    "deepseek-llm",
    "falcon",
    "mpt",
    "qwen35",
)


def fixture_dir(argv: list[str]) -> Path:
    if len(argv) > 1:
        return Path(argv[1])
    env = os.environ.get("SPECRS_VOCAB_FIXTURES")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "spec-rs" / "vocab-fixtures"


def wanted(name: str) -> str | None:
    """The fixture file a release member is, or None."""
    base = name.rsplit("/", 1)[-1]
    if "/vendor/llama.cpp/models/" not in name:
        return None
    for vocab in VOCABS:
        for suffix in (".gguf", ".gguf.inp", ".gguf.out"):
            if base == f"ggml-vocab-{vocab}{suffix}":
                return base
    return None


def main(argv: list[str]) -> int:
    out = fixture_dir(argv)
    expected = {f"ggml-vocab-{v}{s}" for v in VOCABS for s in (".gguf", ".gguf.inp", ".gguf.out")}
    if out.is_dir() and expected <= {p.name for p in out.iterdir()}:
        print(f"vocab fixtures already in {out}")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / RELEASE
        digest = hashlib.sha256()
        with urllib.request.urlopen(URL, timeout=300) as r, archive.open("wb") as f:
            while chunk := r.read(1 << 20):
                digest.update(chunk)
                f.write(chunk)
        if digest.hexdigest() != SHA256:
            print(
                f"{RELEASE}: SHA-256 {digest.hexdigest()} is not the pinned {SHA256}",
                file=sys.stderr,
            )
            return 1
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                base = wanted(member.name)
                if base is None or not member.isfile():
                    continue
                source = tar.extractfile(member)
                assert source is not None
                (out / base).write_bytes(source.read())
    missing = sorted(expected - {p.name for p in out.iterdir()})
    if missing:
        print(f"{RELEASE} lacks {', '.join(missing)}", file=sys.stderr)
        return 1
    print(f"vocab fixtures written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
