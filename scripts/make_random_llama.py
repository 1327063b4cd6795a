#!/usr/bin/env python3
"""Writes a Llama-format checkpoint with random weights, and an EAGLE-1 draft head for it.

The GPU benchmark needs a model of realistic size (decode speed is set by the bytes of
weights read per token), but 16 GB of weights cannot travel to the GPU machine. This script
makes one there in about a minute: random bf16 tensors drawn on the GPU with PyTorch (or with
NumPy where there is no PyTorch, slower), written as sharded safetensors with a
`config.json` and a word-level `tokenizer.json`. It needs nothing but NumPy otherwise: the
safetensors files are written directly (8-byte header length, JSON header, raw data).

Shapes: `llama3-8b` (Llama-3-8B: 32 layers, hidden 4096, GQA 32/8, vocab 128256) or `tiny`
(a smoke-test model). Weight values follow Hugging Face's initialisation (normal, std 0.02;
norms at 1), which keeps activations finite through every layer; the tokens a random model
emits mean nothing, which is why the benchmark uses synthetic acceptance.

Usage: make_random_llama.py OUT_DIR [--shape llama3-8b] [--eagle1 DRAFT_DIR] [--device cuda]
"""

import argparse
import json
import os

import numpy as np

try:
    import torch
except ImportError:  # NumPy fallback (CPU-only machines, tests)
    torch = None

SHAPES = {
    "llama3-8b": dict(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=128256,
        rope_theta=500000.0,
    ),
    "tiny": dict(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        vocab_size=1024,
        rope_theta=10000.0,
    ),
}

SHARD_BYTES = 4 << 30


def config_for(shape, layers=None):
    s = dict(SHAPES[shape])
    if layers is not None:
        s["num_hidden_layers"] = layers
    s.update(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        rms_norm_eps=1e-5,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=s["vocab_size"] - 1,
        torch_dtype="bfloat16",
    )
    return s


def write_tokenizer(out, vocab):
    words = {f"t{i}": i for i in range(vocab - 1)}
    words["</s>"] = vocab - 1
    tok = {
        "version": "1.0",
        "added_tokens": [
            {
                "id": vocab - 1,
                "content": "</s>",
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": None,
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": False},
        "model": {"type": "WordLevel", "vocab": words, "unk_token": "t0"},
    }
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump(tok, f)
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "</s>"}, f)


def save_safetensors(path, tensors):
    """Writes `{name: (uint16 array of bf16 bits, shape)}` as a bf16 safetensors file."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, (bits, shape) in tensors.items():
        n = bits.size * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        for bits, _ in tensors.values():
            f.write(np.ascontiguousarray(bits).tobytes())


class ShardWriter:
    """Accumulates tensors and writes `model-XXXXX.safetensors` shards plus the index."""

    def __init__(self, out):
        self.out, self.pending, self.size, self.index, self.shard = out, {}, 0, {}, 0

    def add(self, name, tensor):
        self.pending[name] = tensor
        self.size += tensor[0].size * 2
        if self.size >= SHARD_BYTES:
            self.flush()

    def flush(self):
        if not self.pending:
            return
        self.shard += 1
        file = f"model-{self.shard:05d}.safetensors"
        save_safetensors(os.path.join(self.out, file), self.pending)
        self.index.update({name: file for name in self.pending})
        self.pending, self.size = {}, 0

    def finish(self):
        self.flush()
        with open(os.path.join(self.out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": self.index}, f)


class Random:
    """Normal(0, 0.02) bf16 tensors as `(uint16 bits, shape)`: drawn by PyTorch on `device`,
    or by NumPy (rounded to bf16 by truncating the f32 bits, which only shifts the values by
    under one bf16 ulp)."""

    def __init__(self, device, seed):
        self.device = device
        if torch is not None:
            self.gen = torch.Generator(device=device).manual_seed(seed)
        else:
            self.rng = np.random.default_rng(seed)

    def normal(self, *shape):
        if torch is not None:
            t = torch.empty(*shape, dtype=torch.bfloat16, device=self.device)
            t = t.normal_(0.0, 0.02, generator=self.gen)
            return t.view(torch.int16).cpu().numpy().view(np.uint16), shape
        x = self.rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
        return (x.view(np.uint32) >> 16).astype(np.uint16), shape

    @staticmethod
    def ones(n):
        return np.full(n, 0x3F80, dtype=np.uint16), (n,)  # bf16 1.0


def layer_tensors(rand, prefix, c):
    h, q = c["hidden_size"], c["num_attention_heads"] * c["head_dim"]
    kv, inter = c["num_key_value_heads"] * c["head_dim"], c["intermediate_size"]
    yield f"{prefix}.input_layernorm.weight", rand.ones(h)
    yield f"{prefix}.post_attention_layernorm.weight", rand.ones(h)
    yield f"{prefix}.self_attn.q_proj.weight", rand.normal(q, h)
    yield f"{prefix}.self_attn.k_proj.weight", rand.normal(kv, h)
    yield f"{prefix}.self_attn.v_proj.weight", rand.normal(kv, h)
    yield f"{prefix}.self_attn.o_proj.weight", rand.normal(h, q)
    yield f"{prefix}.mlp.gate_proj.weight", rand.normal(inter, h)
    yield f"{prefix}.mlp.up_proj.weight", rand.normal(inter, h)
    yield f"{prefix}.mlp.down_proj.weight", rand.normal(h, inter)


def write_target(out, shape, device, seed):
    os.makedirs(out, exist_ok=True)
    c = config_for(shape)
    rand = Random(device, seed)
    w = ShardWriter(out)
    v, h = c["vocab_size"], c["hidden_size"]
    w.add("model.embed_tokens.weight", rand.normal(v, h))
    for i in range(c["num_hidden_layers"]):
        for name, t in layer_tensors(rand, f"model.layers.{i}", c):
            w.add(name, t)
    w.add("model.norm.weight", rand.ones(h))
    w.add("lm_head.weight", rand.normal(v, h))
    w.finish()
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(c, f, indent=1)
    write_tokenizer(out, v)


def write_eagle1(out, shape, device, seed):
    """EAGLE-1 (yuhuili format): `fc [H, 2H]` and one Llama layer without an input norm;
    embeddings and lm_head come from the target. Drafting costs one decoder layer plus the
    target's lm_head per draft."""
    os.makedirs(out, exist_ok=True)
    c = config_for(shape, layers=1)
    c["bias"] = False
    rand = Random(device, seed)
    h = c["hidden_size"]
    tensors = {"fc.weight": rand.normal(h, 2 * h)}
    for name, t in layer_tensors(rand, "layers.0", c):
        if not name.endswith("input_layernorm.weight"):
            tensors[name] = t
    save_safetensors(os.path.join(out, "model.safetensors"), tensors)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(c, f, indent=1)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--shape", choices=sorted(SHAPES), default="llama3-8b")
    p.add_argument("--eagle1", help="also write an EAGLE-1 draft head here")
    p.add_argument("--device", default="cuda" if torch is not None and torch.cuda.is_available() else "cpu")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    write_target(a.out, a.shape, a.device, a.seed)
    if a.eagle1:
        write_eagle1(a.eagle1, a.shape, a.device, a.seed + 1)
    print(f"wrote {a.shape} target to {a.out}" + (f" and EAGLE-1 head to {a.eagle1}" if a.eagle1 else ""))


if __name__ == "__main__":
    main()
