//! Tiny checkpoints in the real formats, for tests and examples: random Llama/Qwen2/Qwen3
//! targets, a "bigram" target whose greedy continuation is a fixed permutation of the last
//! token, and drafters built to predict that target perfectly (wiring checks: if any
//! position, offset or hidden-state convention is wrong, acceptance drops).

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Result, Tensor};
use serde_json::{Value, json};

use crate::config::Architecture;

/// Deterministic pseudo-random values in [-scale, scale).
pub fn random_tensor(shape: &[usize], scale: f32, seed: u64) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let v: Vec<f32> = (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect();
    Tensor::from_vec(v, shape, &Device::Cpu)
}

/// Shape of a tiny decoder.
#[derive(Debug, Clone, Copy)]
pub struct TinyShape {
    pub vocab: usize,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
}

impl Default for TinyShape {
    fn default() -> Self {
        Self { vocab: 64, hidden: 64, layers: 3, heads: 4, kv_heads: 2, head_dim: 16, intermediate: 96 }
    }
}

/// A Hugging Face `config.json` for a tiny target of `arch`.
pub fn target_config(arch: Architecture, s: &TinyShape, tie: bool) -> Value {
    json!({
        "architectures": [arch.hf_name()],
        "model_type": match arch { Architecture::Llama => "llama", Architecture::Qwen2 => "qwen2", Architecture::Qwen3 => "qwen3" },
        "hidden_size": s.hidden, "intermediate_size": s.intermediate, "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads, "num_key_value_heads": s.kv_heads, "head_dim": s.head_dim,
        "vocab_size": s.vocab, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 512,
        "tie_word_embeddings": tie, "bos_token_id": 0, "eos_token_id": s.vocab as u64 - 1
    })
}

/// Random weights with Hugging Face names for a tiny target.
pub fn random_target(arch: Architecture, s: &TinyShape, tie: bool, seed: u64) -> Result<HashMap<String, Tensor>> {
    let mut t = HashMap::new();
    let mut k = seed;
    let mut next = || {
        k += 1;
        k
    };
    let (h, q, kv) = (s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim);
    t.insert("model.embed_tokens.weight".into(), random_tensor(&[s.vocab, h], 1.0, next())?);
    t.insert("model.norm.weight".into(), (random_tensor(&[h], 0.2, next())? + 1.0)?);
    if !tie {
        t.insert("lm_head.weight".into(), random_tensor(&[s.vocab, h], 0.3, next())?);
    }
    for i in 0..s.layers {
        let p = format!("model.layers.{i}");
        let lin = |out: usize, inp: usize, seed: u64| random_tensor(&[out, inp], (1.0 / inp as f32).sqrt(), seed);
        t.insert(format!("{p}.input_layernorm.weight"), (random_tensor(&[h], 0.2, next())? + 1.0)?);
        t.insert(format!("{p}.post_attention_layernorm.weight"), (random_tensor(&[h], 0.2, next())? + 1.0)?);
        t.insert(format!("{p}.self_attn.q_proj.weight"), lin(q, h, next())?);
        t.insert(format!("{p}.self_attn.k_proj.weight"), lin(kv, h, next())?);
        t.insert(format!("{p}.self_attn.v_proj.weight"), lin(kv, h, next())?);
        t.insert(format!("{p}.self_attn.o_proj.weight"), lin(h, q, next())?);
        t.insert(format!("{p}.mlp.gate_proj.weight"), lin(s.intermediate, h, next())?);
        t.insert(format!("{p}.mlp.up_proj.weight"), lin(s.intermediate, h, next())?);
        t.insert(format!("{p}.mlp.down_proj.weight"), lin(h, s.intermediate, next())?);
        if arch == Architecture::Qwen2 {
            for (n, d) in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)] {
                t.insert(format!("{p}.self_attn.{n}.bias"), random_tensor(&[d], 0.1, next())?);
            }
        }
        if arch == Architecture::Qwen3 {
            t.insert(format!("{p}.self_attn.q_norm.weight"), (random_tensor(&[s.head_dim], 0.2, next())? + 1.0)?);
            t.insert(format!("{p}.self_attn.k_norm.weight"), (random_tensor(&[s.head_dim], 0.2, next())? + 1.0)?);
        }
    }
    Ok(t)
}

/// The successor of each token in the bigram target: a single cycle through the vocabulary
/// that never lands on the last id (the EOS of the tiny tokenizer).
pub fn bigram_successor(vocab: usize) -> Vec<u32> {
    let cycle = vocab - 1;
    let step = (1..cycle).rev().find(|s| gcd(*s, cycle) == 1 && *s > 1).unwrap_or(1);
    let mut next: Vec<u32> = (0..cycle).map(|i| ((i + step) % cycle) as u32).collect();
    next.push(0);
    next
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

fn eye(rows: usize, cols: usize) -> Result<Tensor> {
    let mut v = vec![0f32; rows * cols];
    for i in 0..rows.min(cols) {
        v[i * cols + i] = 1.0;
    }
    Tensor::from_vec(v, (rows, cols), &Device::Cpu)
}

/// A Llama target whose layers add nothing (zero `o_proj` and `down_proj`) and whose embedding
/// rows are one-hot: its greedy next token after `x` is `bigram_successor(vocab)[x]`.
/// Requires `vocab <= hidden`.
pub fn bigram_target(arch: Architecture, s: &TinyShape) -> Result<HashMap<String, Tensor>> {
    assert!(s.vocab <= s.hidden, "one-hot embeddings need vocab <= hidden");
    let mut t = random_target(arch, s, false, 7)?;
    t.insert("model.embed_tokens.weight".into(), eye(s.vocab, s.hidden)?);
    t.insert("model.norm.weight".into(), Tensor::ones(s.hidden, DType::F32, &Device::Cpu)?);
    // lm_head row next[i] reads e_i: logits after x peak at next[x].
    let next = bigram_successor(s.vocab);
    let mut head = vec![0f32; s.vocab * s.hidden];
    for (i, &n) in next.iter().enumerate() {
        head[n as usize * s.hidden + i] = 1.0;
    }
    t.insert("lm_head.weight".into(), Tensor::from_vec(head, (s.vocab, s.hidden), &Device::Cpu)?);
    for i in 0..s.layers {
        let p = format!("model.layers.{i}");
        t.insert(
            format!("{p}.self_attn.o_proj.weight"),
            Tensor::zeros((s.hidden, s.heads * s.head_dim), DType::F32, &Device::Cpu)?,
        );
        t.insert(
            format!("{p}.mlp.down_proj.weight"),
            Tensor::zeros((s.hidden, s.intermediate), DType::F32, &Device::Cpu)?,
        );
    }
    Ok(t)
}

/// Writes `config.json`, `model.safetensors` and a word-level `tokenizer.json` (token `i`
/// spelled `t{i}`, the last id is EOS) into `dir`.
pub fn write_checkpoint(dir: &Path, config: &Value, tensors: &HashMap<String, Tensor>) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(config).expect("json"))?;
    candle_core::safetensors::save(tensors, dir.join("model.safetensors"))?;
    if let Some(vocab) = config.get("vocab_size").and_then(Value::as_u64) {
        write_tokenizer(dir, vocab as usize)?;
    }
    Ok(())
}

/// A word-level tokenizer over `t0 .. t{vocab-1}`, the last token being `</s>` (EOS).
pub fn write_tokenizer(dir: &Path, vocab: usize) -> Result<()> {
    let mut words = serde_json::Map::new();
    for i in 0..vocab - 1 {
        words.insert(format!("t{i}"), json!(i));
    }
    words.insert("</s>".into(), json!(vocab - 1));
    let tok = json!({
        "version": "1.0",
        "added_tokens": [{"id": vocab - 1, "content": "</s>", "single_word": false, "lstrip": false,
                          "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null,
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": false},
        "model": {"type": "WordLevel", "vocab": words, "unk_token": "t0"}
    });
    std::fs::write(dir.join("tokenizer.json"), serde_json::to_string(&tok).expect("json"))?;
    std::fs::write(dir.join("tokenizer_config.json"), r#"{"eos_token": "</s>"}"#)?;
    Ok(())
}

/// MLP weights that map a (normed, one-hot) token `j` to a large `e_{next[j]}`:
/// `gate[u] = 10·e_u`, `up[u] = e_u`, `down[:, u] = e_{next[u]} / 10`. Needs `intermediate >= vocab`.
fn successor_mlp(prefix: &str, s: &TinyShape, t: &mut HashMap<String, Tensor>) -> Result<()> {
    let next = bigram_successor(s.vocab);
    let (h, i) = (s.hidden, s.intermediate);
    assert!(i >= s.vocab);
    let mut gate = vec![0f32; i * h];
    let mut up = vec![0f32; i * h];
    let mut down = vec![0f32; h * i];
    for u in 0..s.vocab {
        gate[u * h + u] = 10.0;
        up[u * h + u] = 1.0;
        down[next[u] as usize * i + u] = 0.1;
    }
    t.insert(format!("{prefix}.mlp.gate_proj.weight"), Tensor::from_vec(gate, (i, h), &Device::Cpu)?);
    t.insert(format!("{prefix}.mlp.up_proj.weight"), Tensor::from_vec(up, (i, h), &Device::Cpu)?);
    t.insert(format!("{prefix}.mlp.down_proj.weight"), Tensor::from_vec(down, (h, i), &Device::Cpu)?);
    Ok(())
}

/// EAGLE-1 (yuhuili format) head that predicts the bigram target perfectly: `fc = [I | 0]`
/// keeps the embedding of `x_{t+1}`, the layer adds nothing, and the target's head maps it to
/// `next[x_{t+1}]`.
pub fn eagle1_oracle(s: &TinyShape) -> Result<(Value, HashMap<String, Tensor>)> {
    let h = s.hidden;
    let mut t = HashMap::new();
    t.insert("fc.weight".into(), Tensor::cat(&[eye(h, h)?, Tensor::zeros((h, h), DType::F32, &Device::Cpu)?], 1)?);
    let p = "layers.0";
    for (n, out, inp) in [
        ("q_proj", s.heads * s.head_dim, h),
        ("k_proj", s.kv_heads * s.head_dim, h),
        ("v_proj", s.kv_heads * s.head_dim, h),
    ] {
        t.insert(format!("{p}.self_attn.{n}.weight"), random_tensor(&[out, inp], 0.1, 3)?);
    }
    t.insert(
        format!("{p}.self_attn.o_proj.weight"),
        Tensor::zeros((h, s.heads * s.head_dim), DType::F32, &Device::Cpu)?,
    );
    t.insert(format!("{p}.post_attention_layernorm.weight"), Tensor::ones(h, DType::F32, &Device::Cpu)?);
    t.insert(format!("{p}.mlp.gate_proj.weight"), random_tensor(&[s.intermediate, h], 0.1, 4)?);
    t.insert(format!("{p}.mlp.up_proj.weight"), random_tensor(&[s.intermediate, h], 0.1, 5)?);
    t.insert(format!("{p}.mlp.down_proj.weight"), Tensor::zeros((h, s.intermediate), DType::F32, &Device::Cpu)?);
    let mut cfg = target_config(Architecture::Llama, s, false);
    cfg["num_hidden_layers"] = json!(1);
    cfg["bias"] = json!(false);
    Ok((cfg, t))
}

/// EAGLE-3 head in the speculators format that predicts the bigram target perfectly.
///
/// `fc = 0`, so step 0 starts from a zero hidden state. Queries and keys are constant, and
/// the draft's RoPE (`rope_theta = 0.01`, frequencies spread over [1, 100] rad) makes a
/// position attend almost only to itself; values carry the embedding half of the attention
/// input, so the attention output is `8·e_{x_{t+1}}`, and the successor MLP adds a large
/// `e_{next[x_{t+1}]}`. `norm_before_residual` keeps chained residuals bounded.
pub fn eagle3_oracle(s: &TinyShape, taps: [usize; 3]) -> Result<(Value, HashMap<String, Tensor>)> {
    let h = s.hidden;
    let d = h; // one head spanning the hidden size
    let mut t = HashMap::new();
    t.insert("fc.weight".into(), Tensor::zeros((h, 3 * h), DType::F32, &Device::Cpu)?);
    let p = "layers.0";
    let ones = || Tensor::ones(h, DType::F32, &Device::Cpu);
    t.insert(format!("{p}.input_layernorm.weight"), ones()?);
    t.insert(format!("{p}.hidden_norm.weight"), ones()?);
    t.insert(format!("{p}.post_attention_layernorm.weight"), ones()?);
    // q = k = a constant unit-norm vector for every one-hot embedding; the hidden half is ignored.
    let c = (1.0 / d as f32).sqrt();
    let mut qk = vec![0f32; d * 2 * h];
    for row in 0..d {
        for col in 0..s.vocab {
            qk[row * 2 * h + col] = c * 2.0;
        }
    }
    t.insert(format!("{p}.self_attn.q_proj.weight"), Tensor::from_vec(qk.clone(), (d, 2 * h), &Device::Cpu)?);
    t.insert(format!("{p}.self_attn.k_proj.weight"), Tensor::from_vec(qk, (d, 2 * h), &Device::Cpu)?);
    t.insert(
        format!("{p}.self_attn.v_proj.weight"),
        Tensor::cat(&[eye(d, h)?, Tensor::zeros((d, h), DType::F32, &Device::Cpu)?], 1)?,
    );
    t.insert(format!("{p}.self_attn.o_proj.weight"), eye(h, d)?);
    successor_mlp(p, s, &mut t)?;
    t.insert("norm.weight".into(), ones()?);
    t.insert("lm_head.weight".into(), eye(s.vocab, h)?);
    let cfg = json!({
        "architectures": ["Eagle3DraftModel"],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.1.0",
        "draft_vocab_size": s.vocab,
        "norm_before_residual": true,
        "target_hidden_size": null,
        "eagle_aux_hidden_state_layer_ids": taps,
        "transformer_layer_config": {
            "model_type": "llama", "hidden_size": h, "num_hidden_layers": 1, "num_attention_heads": 1,
            "num_key_value_heads": 1, "head_dim": d, "intermediate_size": s.intermediate,
            "rms_norm_eps": 1e-5, "rope_theta": 0.01, "vocab_size": s.vocab, "max_position_embeddings": 512
        },
        "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}]}
    });
    Ok((cfg, t))
}

/// MiMo-style MTP heads inside the target checkpoint (`model.mtp_layers.0.*`, hidden state
/// first in `input_proj`) that predict the bigram target perfectly.
pub fn mimo_mtp_oracle(s: &TinyShape) -> Result<HashMap<String, Tensor>> {
    let (_, speculators) = mtp_oracle(s)?;
    let h = s.hidden;
    let mut t = HashMap::new();
    for (name, tensor) in speculators {
        t.insert(format!("model.{name}"), tensor);
    }
    let p = "model.mtp_layers.0";
    t.insert(
        format!("{p}.input_proj.weight"),
        Tensor::cat(&[Tensor::zeros((h, h), DType::F32, &Device::Cpu)?, eye(h, h)?], 1)?,
    );
    for (n, d) in
        [("q_proj", s.heads * s.head_dim), ("k_proj", s.kv_heads * s.head_dim), ("v_proj", s.kv_heads * s.head_dim)]
    {
        t.insert(format!("{p}.self_attn.{n}.bias"), Tensor::zeros(d, DType::F32, &Device::Cpu)?);
    }
    Ok(t)
}

/// MTP head (speculators `mtp` format, `mtp_layers.0.*`) that predicts the bigram target
/// perfectly: `input_proj` keeps the embedding half, the layer adds nothing.
pub fn mtp_oracle(s: &TinyShape) -> Result<(Value, HashMap<String, Tensor>)> {
    let h = s.hidden;
    let mut t = HashMap::new();
    let p = "mtp_layers.0";
    let ones = || Tensor::ones(h, DType::F32, &Device::Cpu);
    for n in ["hidden_layernorm", "token_layernorm", "final_layernorm", "input_layernorm", "post_attention_layernorm"] {
        t.insert(format!("{p}.{n}.weight"), ones()?);
    }
    // Embedding first in the speculators format.
    t.insert(
        format!("{p}.input_proj.weight"),
        Tensor::cat(&[eye(h, h)?, Tensor::zeros((h, h), DType::F32, &Device::Cpu)?], 1)?,
    );
    for (n, out) in
        [("q_proj", s.heads * s.head_dim), ("k_proj", s.kv_heads * s.head_dim), ("v_proj", s.kv_heads * s.head_dim)]
    {
        t.insert(format!("{p}.self_attn.{n}.weight"), random_tensor(&[out, h], 0.1, 11)?);
    }
    t.insert(
        format!("{p}.self_attn.o_proj.weight"),
        Tensor::zeros((h, s.heads * s.head_dim), DType::F32, &Device::Cpu)?,
    );
    t.insert(format!("{p}.mlp.gate_proj.weight"), random_tensor(&[s.intermediate, h], 0.1, 12)?);
    t.insert(format!("{p}.mlp.up_proj.weight"), random_tensor(&[s.intermediate, h], 0.1, 13)?);
    t.insert(format!("{p}.mlp.down_proj.weight"), Tensor::zeros((h, s.intermediate), DType::F32, &Device::Cpu)?);
    let mut layer = target_config(Architecture::Llama, s, false);
    layer["num_hidden_layers"] = json!(1);
    let cfg = json!({
        "architectures": ["MTPDraftModel"],
        "speculators_model_type": "mtp",
        "num_speculative_steps": 3,
        "transformer_layer_config": layer,
        "speculators_config": {"algorithm": "mtp", "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}]}
    });
    Ok((cfg, t))
}
