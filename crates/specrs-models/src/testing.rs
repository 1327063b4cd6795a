//! Tiny checkpoints in the real formats, for tests and examples: random Llama/Qwen2/Qwen3
//! targets, a "bigram" target whose greedy continuation is a fixed permutation of the last
//! token, and drafters built to predict that target perfectly (wiring checks: if any
//! position, offset or hidden-state convention is wrong, acceptance drops).

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Result, Tensor};
use serde_json::{Value, json};

use crate::batch::{BatchRow, ForwardBatch};
use crate::config::Architecture;

/// Largest absolute elementwise difference between two tensors of one shape, in f32.
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> Result<f32> {
    (a.to_dtype(DType::F32)? - b.to_dtype(DType::F32)?)?.abs()?.max_all()?.to_scalar::<f32>()
}

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
        "model_type": arch.model_type(),
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
        if matches!(arch, Architecture::Qwen2 | Architecture::SeedOss) {
            for (n, d) in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)] {
                t.insert(format!("{p}.self_attn.{n}.bias"), random_tensor(&[d], 0.1, next())?);
            }
        }
        if arch == Architecture::SeedOss {
            t.insert(format!("{p}.self_attn.o_proj.bias"), random_tensor(&[h], 0.1, next())?);
        }
        if arch == Architecture::Qwen3 {
            t.insert(format!("{p}.self_attn.q_norm.weight"), (random_tensor(&[s.head_dim], 0.2, next())? + 1.0)?);
            t.insert(format!("{p}.self_attn.k_norm.weight"), (random_tensor(&[s.head_dim], 0.2, next())? + 1.0)?);
        }
    }
    Ok(t)
}

/// One sequence on a contiguous block table (`block_size` keys a block): `tokens` fed after
/// `cached` keys, logits at the flat indices `logits_at`.
pub fn single_sequence_batch(tokens: &[u32], cached: usize, block_size: usize, logits_at: Vec<u32>) -> ForwardBatch {
    let ctx = cached + tokens.len();
    let blocks = ctx.div_ceil(block_size);
    ForwardBatch {
        input_ids: tokens.to_vec(),
        positions: (cached as u32..ctx as u32).collect(),
        rows: vec![BatchRow {
            query_start: 0,
            query_len: tokens.len(),
            context_len: ctx,
            block_table_start: 0,
            block_table_len: blocks,
        }],
        slot_mapping: (cached as u32..ctx as u32).collect(),
        block_tables: (0..blocks as u32).collect(),
        block_size,
        logits_indices: logits_at,
        ..Default::default()
    }
}

/// A Llama checkpoint's tensors stored as Phi-3 stores them: q/k/v rows stacked into
/// `qkv_proj`, gate and up rows into `gate_up_proj`. With Phi-3's config and no LongRoPE,
/// partial rotary or window, the result computes exactly what the Llama checkpoint does.
pub fn fused_as_phi3(mut tensors: HashMap<String, Tensor>, s: &TinyShape) -> Result<HashMap<String, Tensor>> {
    for i in 0..s.layers {
        let p = format!("model.layers.{i}");
        let mut take = |name: &str| tensors.remove(&format!("{p}.{name}")).expect("a Llama layer tensor");
        let qkv = Tensor::cat(
            &[take("self_attn.q_proj.weight"), take("self_attn.k_proj.weight"), take("self_attn.v_proj.weight")],
            0,
        )?;
        let gate_up = Tensor::cat(&[take("mlp.gate_proj.weight"), take("mlp.up_proj.weight")], 0)?;
        tensors.insert(format!("{p}.self_attn.qkv_proj.weight"), qkv);
        tensors.insert(format!("{p}.mlp.gate_up_proj.weight"), gate_up);
    }
    Ok(tensors)
}

/// Random OLMo 2 weights: Llama's without `input_layernorm`, `post_attention_layernorm` now over
/// the attention's output, plus `post_feedforward_layernorm` and q/k norms across all heads
/// (`[heads · head_dim]`, `[kv_heads · head_dim]`).
pub fn random_olmo2(s: &TinyShape, seed: u64) -> Result<HashMap<String, Tensor>> {
    let mut t = random_target(Architecture::Llama, s, false, seed)?;
    let mut k = seed * 1_000;
    let mut norm = |width: usize| {
        k += 1;
        random_tensor(&[width], 0.2, k)? + 1.0
    };
    for i in 0..s.layers {
        let p = format!("model.layers.{i}");
        t.remove(&format!("{p}.input_layernorm.weight"));
        t.insert(format!("{p}.post_feedforward_layernorm.weight"), norm(s.hidden)?);
        t.insert(format!("{p}.self_attn.q_norm.weight"), norm(s.heads * s.head_dim)?);
        t.insert(format!("{p}.self_attn.k_norm.weight"), norm(s.kv_heads * s.head_dim)?);
    }
    Ok(t)
}

/// A tiny GLM-4-0414 config (RoPE over half of each head, q/k/v biases).
pub fn glm4_config(s: &TinyShape) -> Value {
    let mut c = target_config(Architecture::Glm4, s, false);
    c["partial_rotary_factor"] = json!(0.5);
    c["attention_bias"] = json!(true);
    c
}

/// Random GLM-4-0414 weights as its checkpoints name them: Qwen2's (q/k/v biases) with
/// `gate_up_proj` fused, and four norms a layer (`input_layernorm`, `post_self_attn_layernorm`,
/// `post_attention_layernorm` before the MLP, `post_mlp_layernorm`).
pub fn random_glm4(s: &TinyShape, seed: u64) -> Result<HashMap<String, Tensor>> {
    let mut t = random_target(Architecture::Qwen2, s, false, seed)?;
    let mut k = seed * 1_000;
    for i in 0..s.layers {
        let p = format!("model.layers.{i}");
        let gate_up = Tensor::cat(
            &[
                t.remove(&format!("{p}.mlp.gate_proj.weight")).expect("gate"),
                t.remove(&format!("{p}.mlp.up_proj.weight")).expect("up"),
            ],
            0,
        )?;
        t.insert(format!("{p}.mlp.gate_up_proj.weight"), gate_up);
        for n in ["post_self_attn_layernorm", "post_mlp_layernorm"] {
            k += 1;
            t.insert(format!("{p}.{n}.weight"), (random_tensor(&[s.hidden], 0.2, k)? + 1.0)?);
        }
    }
    Ok(t)
}

/// A Llama checkpoint's tensors stored as InternLM2 stores them: renamed, and q/k/v fused into
/// `attention.wqkv` with each key-value head's query heads, key and value side by side.
pub fn as_internlm2(tensors: HashMap<String, Tensor>, s: &TinyShape) -> Result<HashMap<String, Tensor>> {
    let groups = s.heads / s.kv_heads;
    let mut out = HashMap::new();
    for (name, t) in tensors {
        let renamed = match name.as_str() {
            "model.embed_tokens.weight" => "model.tok_embeddings.weight".to_string(),
            "lm_head.weight" => "output.weight".to_string(),
            _ => name
                .replace(".self_attn.o_proj.", ".attention.wo.")
                .replace(".input_layernorm.", ".attention_norm.")
                .replace(".post_attention_layernorm.", ".ffn_norm.")
                .replace(".mlp.gate_proj.", ".feed_forward.w1.")
                .replace(".mlp.up_proj.", ".feed_forward.w3.")
                .replace(".mlp.down_proj.", ".feed_forward.w2."),
        };
        out.insert(renamed, t);
    }
    for i in 0..s.layers {
        let p = format!("model.layers.{i}");
        let mut take = |n: &str| out.remove(&format!("{p}.self_attn.{n}_proj.weight")).expect("a Llama projection");
        let (q, k, v) = (take("q"), take("k"), take("v"));
        let head = |t: &Tensor, h: usize| t.narrow(0, h * s.head_dim, s.head_dim);
        let mut blocks = Vec::new();
        for h in 0..s.kv_heads {
            for j in 0..groups {
                blocks.push(head(&q, h * groups + j)?);
            }
            blocks.push(head(&k, h)?);
            blocks.push(head(&v, h)?);
        }
        out.insert(format!("{p}.attention.wqkv.weight"), Tensor::cat(&blocks, 0)?);
    }
    Ok(out)
}

/// A tiny Gemma 3 `config.json`: `layer_types` as given, a `window`-key sliding window, local
/// RoPE at base 500 (the global one at 10,000), `query_pre_attn_scalar` 12 (not the head dim).
pub fn gemma3_config(s: &TinyShape, sliding: &[bool], window: usize) -> Value {
    let mut c = target_config(Architecture::Gemma3, s, true);
    let types: Vec<&str> = sliding.iter().map(|&w| if w { "sliding_attention" } else { "full_attention" }).collect();
    c["layer_types"] = json!(types);
    c["sliding_window"] = json!(window);
    c["rope_local_base_freq"] = json!(500.0);
    c["query_pre_attn_scalar"] = json!(12);
    c["hidden_activation"] = json!("gelu_pytorch_tanh");
    c["attn_logit_softcapping"] = Value::Null;
    c["final_logit_softcapping"] = Value::Null;
    c
}

/// A tiny Gemma 2 config: `sliding` layers within `window`, one RoPE, both soft caps set.
pub fn gemma2_config(s: &TinyShape, sliding: &[bool], window: usize, caps: (f64, f64)) -> Value {
    let mut c = target_config(Architecture::Gemma2, s, true);
    let types: Vec<&str> = sliding.iter().map(|&w| if w { "sliding_attention" } else { "full_attention" }).collect();
    c["layer_types"] = json!(types);
    c["sliding_window"] = json!(window);
    c["query_pre_attn_scalar"] = json!(12);
    c["hidden_activation"] = json!("gelu_pytorch_tanh");
    c["attn_logit_softcapping"] = json!(caps.0);
    c["final_logit_softcapping"] = json!(caps.1);
    c
}

/// A Gemma (1) `config.json` for a tiny target: tied, and the first configs' `hidden_act:
/// gelu` with no `hidden_activation` (transformers runs the tanh GELU regardless).
pub fn gemma_config(s: &TinyShape) -> Value {
    let mut c = target_config(Architecture::Gemma, s, true);
    c["hidden_act"] = json!("gelu");
    c["hidden_activation"] = json!(null);
    c
}

/// Random Gemma (1) weights: Llama's pre-norm layer (`post_attention_layernorm` before the
/// MLP) with tied embeddings and every norm weight near 0, as Gemma stores `scale - 1`.
pub fn random_gemma(s: &TinyShape, seed: u64) -> Result<HashMap<String, Tensor>> {
    let mut t = random_gemma3(s, seed)?;
    t.retain(|name, _| {
        !["q_norm.weight", "k_norm.weight", "pre_feedforward_layernorm.weight", "post_feedforward_layernorm.weight"]
            .iter()
            .any(|suffix| name.ends_with(suffix))
    });
    Ok(t)
}

/// Random Gemma 2 weights: Gemma 3's without the q/k norms.
pub fn random_gemma2(s: &TinyShape, seed: u64) -> Result<HashMap<String, Tensor>> {
    let mut t = random_gemma3(s, seed)?;
    t.retain(|name, _| !name.ends_with("q_norm.weight") && !name.ends_with("k_norm.weight"));
    Ok(t)
}

/// Random Gemma 3 weights: Qwen3's (q/k norms) with tied embeddings, plus the two norms around
/// the MLP; every norm weight near 0, as Gemma stores `scale - 1`.
pub fn random_gemma3(s: &TinyShape, seed: u64) -> Result<HashMap<String, Tensor>> {
    let mut t = random_target(Architecture::Qwen3, s, true, seed)?;
    let mut k = seed * 1_000;
    for i in 0..s.layers {
        for n in ["pre_feedforward_layernorm", "post_feedforward_layernorm"] {
            k += 1;
            t.insert(format!("model.layers.{i}.{n}.weight"), random_tensor(&[s.hidden], 0.2, k)?);
        }
    }
    for (name, w) in t.iter_mut() {
        if name.ends_with("norm.weight") {
            *w = (w.clone() - 1.0)?;
        }
    }
    Ok(t)
}

/// A tiny gpt-oss config: `experts` experts as wide as `intermediate`, `top_k` per token, the
/// `sliding` layers within `window`, SwiGLU clamped at `limit`, plain RoPE.
pub fn gpt_oss_config(
    s: &TinyShape,
    experts: usize,
    top_k: usize,
    sliding: &[bool],
    window: usize,
    limit: f64,
) -> Value {
    let mut c = target_config(Architecture::GptOss, s, false);
    let types: Vec<&str> = sliding.iter().map(|&w| if w { "sliding_attention" } else { "full_attention" }).collect();
    c["layer_types"] = json!(types);
    c["sliding_window"] = json!(window);
    c["num_local_experts"] = json!(experts);
    (c["num_experts_per_tok"], c["experts_per_token"]) = (json!(top_k), json!(top_k));
    c["swiglu_limit"] = json!(limit);
    c["attention_bias"] = json!(true);
    c
}

/// Random gpt-oss weights, twice: experts stored as transformers keeps them dequantized
/// (`experts.gate_up_proj [E, H, 2I]`, `down_proj [E, I, H]`), and the same experts as the
/// released checkpoints store them, MXFP4 `_blocks` and `_scales` (random bytes, scales
/// `2^-7..2^-3`); everything else shared. Widths must be multiples of 32.
pub fn random_gpt_oss(
    s: &TinyShape,
    experts: usize,
    seed: u64,
) -> Result<(HashMap<String, Tensor>, HashMap<String, Tensor>)> {
    let mut t = random_target(Architecture::Qwen2, s, false, seed)?;
    t.retain(|name, _| !name.contains(".mlp."));
    let mut k = seed * 1_000;
    let mut next = || {
        k += 1;
        k
    };
    let (h, i) = (s.hidden, s.intermediate);
    let mut bytes = seed.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1;
    let mut random_bytes = |n: usize, range: std::ops::Range<u8>| -> Vec<u8> {
        (0..n)
            .map(|_| {
                bytes ^= bytes << 13;
                bytes ^= bytes >> 7;
                bytes ^= bytes << 17;
                range.start + ((bytes >> 33) % u64::from(range.end - range.start)) as u8
            })
            .collect()
    };
    let mut mxfp4 = t.clone();
    for l in 0..s.layers {
        let p = format!("model.layers.{l}");
        let shared = [
            (format!("{p}.self_attn.o_proj.bias"), random_tensor(&[h], 0.1, next())?),
            (format!("{p}.self_attn.sinks"), random_tensor(&[s.heads], 2.0, next())?),
            (format!("{p}.mlp.router.weight"), random_tensor(&[experts, h], 0.5, next())?),
            (format!("{p}.mlp.router.bias"), random_tensor(&[experts], 0.5, next())?),
            (format!("{p}.mlp.experts.gate_up_proj_bias"), random_tensor(&[experts, 2 * i], 0.1, next())?),
            (format!("{p}.mlp.experts.down_proj_bias"), random_tensor(&[experts, h], 0.1, next())?),
        ];
        for (name, tensor) in shared {
            t.insert(name.clone(), tensor.clone());
            mxfp4.insert(name, tensor);
        }
        for (proj, out, inp) in [("gate_up_proj", 2 * i, h), ("down_proj", h, i)] {
            let groups = inp / 32;
            let blocks = random_bytes(experts * out * groups * 16, 0..255);
            let scales = random_bytes(experts * out * groups, 120..124);
            let values = crate::weights::mxfp4::dequantize(&blocks, &scales).expect("16 bytes per scale");
            // [E, out, in] -> transformers' [E, in, out].
            let dense = Tensor::from_vec(values, (experts, out, inp), &Device::Cpu)?.transpose(1, 2)?.contiguous()?;
            t.insert(format!("{p}.mlp.experts.{proj}"), dense);
            let name = format!("{p}.mlp.experts.{proj}");
            mxfp4.insert(format!("{name}_blocks"), Tensor::from_vec(blocks, (experts, out, groups, 16), &Device::Cpu)?);
            mxfp4.insert(format!("{name}_scales"), Tensor::from_vec(scales, (experts, out, groups), &Device::Cpu)?);
        }
    }
    Ok((t, mxfp4))
}

/// Experts of a tiny mixture-of-experts target.
#[derive(Debug, Clone)]
pub struct TinyMoe {
    pub experts: usize,
    pub top_k: usize,
    pub expert_intermediate: usize,
    /// Qwen2-MoE's shared expert width.
    pub shared_intermediate: Option<usize>,
    pub norm_topk_prob: bool,
    /// Layers that keep a dense MLP (`mlp_only_layers`; GLM-4.5 keeps the leading ones, so
    /// there they must be `0..k`).
    pub dense_layers: Vec<usize>,
    /// GLM-4.5's router: `n_group`, `topk_group` and `routed_scaling_factor`.
    pub groups: (usize, usize, f64),
}

impl TinyMoe {
    /// `experts` routed experts, `top_k` per token, 32 wide, renormalised, in every layer,
    /// with no shared expert and one router group: what a test changes from starts here.
    pub fn routed(experts: usize, top_k: usize) -> Self {
        Self {
            experts,
            top_k,
            expert_intermediate: 32,
            shared_intermediate: None,
            norm_topk_prob: true,
            dense_layers: vec![],
            groups: (1, 1, 1.0),
        }
    }
}

/// A Qwen2-MoE / Qwen3-MoE / GLM-4.5 `config.json` for a tiny target.
pub fn moe_target_config(arch: Architecture, s: &TinyShape, m: &TinyMoe) -> Value {
    let mut c = target_config(arch, s, false);
    if arch == Architecture::Mixtral {
        assert!(m.dense_layers.is_empty() && m.shared_intermediate.is_none(), "Mixtral is sparse throughout");
        c["num_local_experts"] = json!(m.experts);
        c["num_experts_per_tok"] = json!(m.top_k);
        c["intermediate_size"] = json!(m.expert_intermediate);
        return c;
    }
    c["num_experts_per_tok"] = json!(m.top_k);
    c["moe_intermediate_size"] = json!(m.expert_intermediate);
    c["norm_topk_prob"] = json!(m.norm_topk_prob);
    if matches!(arch, Architecture::Glm4Moe | Architecture::Dots1 | Architecture::DeepseekV2 | Architecture::DeepseekV3)
    {
        // GLM-4.5's names, as DeepSeek and dots.llm1 write them.
        assert!(m.dense_layers.iter().enumerate().all(|(i, &l)| i == l), "GLM keeps leading dense layers");
        c["n_routed_experts"] = json!(m.experts);
        c["n_shared_experts"] = json!(m.shared_intermediate.unwrap_or(0) / m.expert_intermediate);
        c["first_k_dense_replace"] = json!(m.dense_layers.len());
        (c["n_group"], c["topk_group"], c["routed_scaling_factor"]) =
            (json!(m.groups.0), json!(m.groups.1), json!(m.groups.2));
        if arch == Architecture::Glm4Moe {
            c["partial_rotary_factor"] = json!(0.5);
            c["attention_bias"] = json!(true);
        }
        return c;
    }
    c["num_experts"] = json!(m.experts);
    c["decoder_sparse_step"] = json!(1);
    c["mlp_only_layers"] = json!(m.dense_layers);
    if let Some(w) = m.shared_intermediate {
        c["shared_expert_intermediate_size"] = json!(w);
    }
    c
}

/// Random weights with the shared layer's names for a tiny mixture (write Mixtral's with
/// [`as_mixtral`]): the attention of Llama (Mixtral), Qwen2 and GLM-4.5 (bias) or Qwen3 (q/k
/// norm), and in each sparse layer a router (GLM-4.5's with its
/// choice bias), `experts` SwiGLU experts and, with `shared_intermediate`, Qwen2-MoE's gated
/// shared expert or GLM-4.5's ungated one.
pub fn random_moe_target(arch: Architecture, s: &TinyShape, m: &TinyMoe, seed: u64) -> Result<HashMap<String, Tensor>> {
    let base = match arch {
        Architecture::Mixtral | Architecture::GraniteMoe => Architecture::Llama,
        _ if arch.has_qk_norm() || arch.is_hunyuan() => Architecture::Qwen3,
        _ => Architecture::Qwen2,
    };
    let mut t = random_target(base, s, false, seed)?;
    let mut k = seed * 1_000;
    let mut next = || {
        k += 1;
        k
    };
    let h = s.hidden;
    let lin = |out: usize, inp: usize, seed: u64| random_tensor(&[out, inp], (1.0 / inp as f32).sqrt(), seed);
    for i in (0..s.layers).filter(|i| !m.dense_layers.contains(i)) {
        let p = format!("model.layers.{i}.mlp");
        for proj in ["gate_proj", "up_proj", "down_proj"] {
            t.remove(&format!("{p}.{proj}.weight"));
        }
        // A sharp router, so that the top-k choice matters.
        t.insert(format!("{p}.gate.weight"), random_tensor(&[m.experts, h], 1.0, next())?);
        // DeepSeek-style mixtures add their shared expert ungated; V3's and GLM-4.5's routers
        // carry a choice bias.
        let glm = matches!(
            arch,
            Architecture::Glm4Moe
                | Architecture::Dots1
                | Architecture::DeepseekV2
                | Architecture::DeepseekV3
                | Architecture::GraniteMoe
                | Architecture::HunYuanMoe
        );
        if matches!(arch, Architecture::Glm4Moe | Architecture::Dots1 | Architecture::DeepseekV3) {
            t.insert(format!("{p}.gate.e_score_correction_bias"), random_tensor(&[m.experts], 0.3, next())?);
        }
        let mut expert = |prefix: String, width: usize| -> Result<()> {
            t.insert(format!("{prefix}.gate_proj.weight"), lin(width, h, next())?);
            t.insert(format!("{prefix}.up_proj.weight"), lin(width, h, next())?);
            t.insert(format!("{prefix}.down_proj.weight"), lin(h, width, next())?);
            Ok(())
        };
        for e in 0..m.experts {
            expert(format!("{p}.experts.{e}"), m.expert_intermediate)?;
        }
        match m.shared_intermediate {
            Some(w) if glm => expert(format!("{p}.shared_experts"), w)?,
            Some(w) => {
                expert(format!("{p}.shared_expert"), w)?;
                t.insert(format!("{p}.shared_expert_gate.weight"), lin(1, h, next())?);
            }
            None => {}
        }
    }
    Ok(t)
}

/// A Granite MoE `config.json` for a tiny target: every layer sparse, Granite's multipliers
/// (`multipliers`: embedding, residual, attention, logits divisor), and with
/// `m.shared_intermediate` GraniteMoeShared's shared MLP.
pub fn granite_moe_config(s: &TinyShape, m: &TinyMoe, multipliers: [f64; 4]) -> Value {
    let shared = m.shared_intermediate.is_some();
    let arch = if shared { "GraniteMoeSharedForCausalLM" } else { "GraniteMoeForCausalLM" };
    let mut c = target_config(Architecture::GraniteMoe, s, false);
    c["architectures"] = json!([arch]);
    c["num_local_experts"] = json!(m.experts);
    c["num_experts_per_tok"] = json!(m.top_k);
    c["intermediate_size"] = json!(m.expert_intermediate);
    if let Some(w) = m.shared_intermediate {
        c["shared_intermediate_size"] = json!(w);
    }
    let [embedding, residual, attention, logits] = multipliers;
    (c["embedding_multiplier"], c["residual_multiplier"], c["attention_multiplier"], c["logits_scaling"]) =
        (json!(embedding), json!(residual), json!(attention), json!(logits));
    c
}

/// A mixture's tensors (from [`random_moe_target`] of `GraniteMoe`) in Granite MoE's layout:
/// `block_sparse_moe.router.layer`, experts stacked into `input_linear [E, 2I, H]` (gate rows,
/// then up) and `output_linear [E, H, I]`, the shared expert as `shared_mlp`'s fused pair.
pub fn as_granite_moe(tensors: HashMap<String, Tensor>, s: &TinyShape, m: &TinyMoe) -> Result<HashMap<String, Tensor>> {
    let mut t = tensors;
    for i in 0..s.layers {
        let (hf, own) = (format!("model.layers.{i}.mlp"), format!("model.layers.{i}.block_sparse_moe"));
        let mut take = |name: String| t.remove(&name).expect("a mixture tensor");
        let router = take(format!("{hf}.gate.weight"));
        let (mut gate_up, mut down) = (Vec::new(), Vec::new());
        for e in 0..m.experts {
            let p = format!("{hf}.experts.{e}");
            let (g, u) = (take(format!("{p}.gate_proj.weight")), take(format!("{p}.up_proj.weight")));
            gate_up.push(Tensor::cat(&[g, u], 0)?);
            down.push(take(format!("{p}.down_proj.weight")));
        }
        let shared = m.shared_intermediate.map(|_| {
            let p = format!("{hf}.shared_experts");
            (
                take(format!("{p}.gate_proj.weight")),
                take(format!("{p}.up_proj.weight")),
                take(format!("{p}.down_proj.weight")),
            )
        });
        t.insert(format!("{own}.router.layer.weight"), router);
        t.insert(format!("{own}.input_linear.weight"), Tensor::stack(&gate_up, 0)?);
        t.insert(format!("{own}.output_linear.weight"), Tensor::stack(&down, 0)?);
        if let Some((g, u, d)) = shared {
            t.insert(format!("model.layers.{i}.shared_mlp.input_linear.weight"), Tensor::cat(&[g, u], 0)?);
            t.insert(format!("model.layers.{i}.shared_mlp.output_linear.weight"), d);
        }
    }
    Ok(t)
}

/// An OLMoE `config.json` for a tiny target: `m.experts` experts `m.expert_intermediate` wide
/// in every layer.
pub fn olmoe_config(s: &TinyShape, m: &TinyMoe) -> Value {
    let mut c = target_config(Architecture::Olmoe, s, false);
    c["num_experts"] = json!(m.experts);
    c["num_experts_per_tok"] = json!(m.top_k);
    c["intermediate_size"] = json!(m.expert_intermediate);
    c["norm_topk_prob"] = json!(m.norm_topk_prob);
    c["clip_qkv"] = Value::Null;
    c
}

/// Random weights for a tiny OLMoE: [`random_moe_target`]'s sparse layers (every layer) with
/// OLMo's whole-width q/k norms.
pub fn random_olmoe(s: &TinyShape, m: &TinyMoe, seed: u64) -> Result<HashMap<String, Tensor>> {
    let mut t = random_moe_target(Architecture::Qwen3Moe, s, m, seed)?;
    for i in 0..s.layers {
        let p = format!("model.layers.{i}.self_attn");
        let seed = seed * 10 + i as u64;
        t.insert(format!("{p}.q_norm.weight"), (random_tensor(&[s.heads * s.head_dim], 0.2, seed)? + 1.0)?);
        t.insert(format!("{p}.k_norm.weight"), (random_tensor(&[s.kv_heads * s.head_dim], 0.2, seed + 5)? + 1.0)?);
    }
    Ok(t)
}

/// An ERNIE 4.5 MoE `config.json` for a tiny target: `m`'s experts after its leading dense
/// layers (`moe_layer_start_index`), its shared width as whole experts, no biases.
pub fn ernie4_5_moe_config(s: &TinyShape, m: &TinyMoe) -> Value {
    assert!(m.dense_layers.iter().enumerate().all(|(i, &l)| i == l), "ERNIE keeps leading dense layers");
    let mut c = target_config(Architecture::Ernie4_5Moe, s, true);
    c["use_bias"] = json!(false);
    c["moe_num_experts"] = json!(m.experts);
    c["moe_k"] = json!(m.top_k);
    c["moe_intermediate_size"] = json!(m.expert_intermediate);
    c["moe_num_shared_experts"] = json!(m.shared_intermediate.unwrap_or(0) / m.expert_intermediate);
    c["moe_layer_start_index"] = json!(m.dense_layers.len());
    c["moe_layer_end_index"] = json!(-1);
    c["moe_layer_interval"] = json!(1);
    c["moe_gate_act"] = json!("softmax");
    c["moe_norm_min"] = json!(1e-12);
    c
}

/// Random weights for a tiny ERNIE 4.5 MoE under the shared layer's names (write them with
/// [`as_ernie4_5_moe`]): Llama's attention without biases, tied embeddings, and in each sparse
/// layer a router with its correction bias, the experts and the ungated shared expert.
pub fn random_ernie4_5_moe(s: &TinyShape, m: &TinyMoe, seed: u64) -> Result<HashMap<String, Tensor>> {
    let mut t = random_moe_target(Architecture::DeepseekV3, s, m, seed)?;
    t.retain(|name, _| !name.ends_with("_proj.bias") && name != "lm_head.weight");
    Ok(t)
}

/// A mixture's tensors as ERNIE 4.5 MoE stores them: each correction bias `[1, experts]` in
/// `mlp.moe_statics`.
pub fn as_ernie4_5_moe(tensors: HashMap<String, Tensor>) -> Result<HashMap<String, Tensor>> {
    tensors
        .into_iter()
        .map(|(name, t)| match name.strip_suffix(".gate.e_score_correction_bias") {
            Some(mlp) => Ok((format!("{mlp}.moe_statics.e_score_correction_bias"), t.unsqueeze(0)?)),
            None => Ok((name, t)),
        })
        .collect()
}

/// A MiniMax-M2 `config.json` for a tiny target: `m`'s experts (every layer sparse), RoPE over
/// `rotary` dims of each head, whole-width q/k norms, sigmoid routing with its bias.
pub fn minimax_m2_config(s: &TinyShape, m: &TinyMoe, rotary: usize) -> Value {
    let mut c = target_config(Architecture::MiniMaxM2, s, false);
    c["intermediate_size"] = json!(m.expert_intermediate);
    c["num_local_experts"] = json!(m.experts);
    c["num_experts_per_tok"] = json!(m.top_k);
    c["rotary_dim"] = json!(rotary);
    c["use_qk_norm"] = json!(true);
    c["qk_norm_type"] = json!("per_layer");
    c["scoring_func"] = json!("sigmoid");
    c["use_routing_bias"] = json!(true);
    c["shared_intermediate_size"] = json!(0);
    c["attn_type_list"] = json!(vec![1; s.layers]);
    c["use_mtp"] = json!(false);
    c
}

/// Random weights for a tiny MiniMax-M2 under the shared layer's names (write them with
/// [`as_minimax_m2`]): OLMoE's whole-width q/k norms and experts, and each router's correction
/// bias.
pub fn random_minimax_m2(s: &TinyShape, m: &TinyMoe, seed: u64) -> Result<HashMap<String, Tensor>> {
    let mut t = random_olmoe(s, m, seed)?;
    for i in 0..s.layers {
        let bias = random_tensor(&[m.experts], 0.5, seed + 100 + i as u64)?;
        t.insert(format!("model.layers.{i}.mlp.gate.e_score_correction_bias"), bias);
    }
    Ok(t)
}

/// A mixture's tensors as MiniMax-M2 names them: Mixtral's router and experts, the correction
/// bias beside the router.
pub fn as_minimax_m2(tensors: HashMap<String, Tensor>) -> HashMap<String, Tensor> {
    as_mixtral(tensors)
        .into_iter()
        .map(|(name, t)| {
            let bias = ".block_sparse_moe.gate.e_score_correction_bias";
            (name.replace(bias, ".block_sparse_moe.e_score_correction_bias"), t)
        })
        .collect()
}

/// A Cohere / Cohere 2 `config.json` for a tiny target (tied embeddings, `logit_scale` 0.25,
/// Command R+'s per-head q/k norms when `qk_norm`).
pub fn cohere_config(arch: Architecture, s: &TinyShape, qk_norm: bool) -> Value {
    let mut c = target_config(arch, s, true);
    c["layer_norm_eps"] = json!(1e-5);
    c["logit_scale"] = json!(0.25);
    if qk_norm {
        c["use_qk_norm"] = json!(true);
    }
    c
}

/// Random weights for a tiny Cohere: Llama's without `post_attention_layernorm` (one norm feeds
/// attention and MLP), and with `qk_norm` a `[heads, head_dim]` weight for each of q and k.
pub fn random_cohere(s: &TinyShape, qk_norm: bool, seed: u64) -> Result<HashMap<String, Tensor>> {
    let mut t = random_target(Architecture::Llama, s, true, seed)?;
    for i in 0..s.layers {
        let p = format!("model.layers.{i}");
        t.remove(&format!("{p}.post_attention_layernorm.weight"));
        if qk_norm {
            let seed = seed * 100 + i as u64;
            t.insert(
                format!("{p}.self_attn.q_norm.weight"),
                (random_tensor(&[s.heads, s.head_dim], 0.3, seed)? + 1.0)?,
            );
            t.insert(
                format!("{p}.self_attn.k_norm.weight"),
                (random_tensor(&[s.kv_heads, s.head_dim], 0.3, seed + 50)? + 1.0)?,
            );
        }
    }
    Ok(t)
}

/// Latent-attention dims of a tiny DeepSeek-V3 (`MlaConfig`).
#[derive(Debug, Clone, Copy)]
pub struct TinyMla {
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
}

/// A DeepSeek-V3 (or `arch` V2, `group_limited_greedy`) `config.json` for a tiny target:
/// GLM-4.5's experts (as DeepSeek names them) and latent attention (`shape.kv_heads` and
/// `shape.head_dim` unused).
pub fn deepseek_config(arch: Architecture, s: &TinyShape, mla: &TinyMla, m: &TinyMoe) -> Value {
    let mut c = moe_target_config(arch, s, m);
    if arch == Architecture::DeepseekV2 {
        c["topk_method"] = json!("group_limited_greedy");
    }
    c["q_lora_rank"] = json!(mla.q_lora_rank);
    c["kv_lora_rank"] = json!(mla.kv_lora_rank);
    c["qk_nope_head_dim"] = json!(mla.qk_nope_head_dim);
    c["qk_rope_head_dim"] = json!(mla.qk_rope_head_dim);
    c["v_head_dim"] = json!(mla.v_head_dim);
    c["attention_bias"] = json!(false);
    c
}

/// Random weights for a tiny DeepSeek-V3 (or `arch` V2, no correction bias):
/// [`random_moe_target`]'s norms and experts, and latent
/// attention (`q_a_proj`, `q_a_layernorm`, `q_b_proj` or one `q_proj`; `kv_a_proj_with_mqa`,
/// `kv_a_layernorm`, `kv_b_proj`; `o_proj` over the heads' values).
pub fn random_deepseek(
    arch: Architecture,
    s: &TinyShape,
    mla: &TinyMla,
    m: &TinyMoe,
    seed: u64,
) -> Result<HashMap<String, Tensor>> {
    let mut t = random_moe_target(arch, s, m, seed)?;
    let mut k = seed * 7_000;
    let mut next = || {
        k += 1;
        k
    };
    let (h, nh) = (s.hidden, s.heads);
    let head = mla.qk_nope_head_dim + mla.qk_rope_head_dim;
    let lin = |out: usize, inp: usize, seed: u64| random_tensor(&[out, inp], (1.0 / inp as f32).sqrt(), seed);
    for i in 0..s.layers {
        let p = format!("model.layers.{i}.self_attn");
        t.retain(|name, _| !name.starts_with(&format!("{p}.")));
        let mut put = |name: &str, tensor: Tensor| t.insert(format!("{p}.{name}"), tensor);
        match mla.q_lora_rank {
            Some(rank) => {
                put("q_a_proj.weight", lin(rank, h, next())?);
                put("q_a_layernorm.weight", (random_tensor(&[rank], 0.2, next())? + 1.0)?);
                put("q_b_proj.weight", lin(nh * head, rank, next())?);
            }
            None => {
                put("q_proj.weight", lin(nh * head, h, next())?);
            }
        }
        put("kv_a_proj_with_mqa.weight", lin(mla.kv_lora_rank + mla.qk_rope_head_dim, h, next())?);
        put("kv_a_layernorm.weight", (random_tensor(&[mla.kv_lora_rank], 0.2, next())? + 1.0)?);
        put("kv_b_proj.weight", lin(nh * (mla.qk_nope_head_dim + mla.v_head_dim), mla.kv_lora_rank, next())?);
        put("o_proj.weight", lin(h, nh * mla.v_head_dim, next())?);
    }
    Ok(t)
}

/// A mixture's tensors under Mixtral's names: `block_sparse_moe.gate`, experts' `w1` (gate),
/// `w3` (up), `w2` (down).
pub fn as_mixtral(tensors: HashMap<String, Tensor>) -> HashMap<String, Tensor> {
    tensors
        .into_iter()
        .map(|(name, t)| {
            let name = name
                .replace(".mlp.gate.", ".block_sparse_moe.gate.")
                .replace(".mlp.experts.", ".block_sparse_moe.experts.")
                .replace(".gate_proj.", ".w1.")
                .replace(".up_proj.", ".w3.")
                .replace(".down_proj.", ".w2.");
            (name, t)
        })
        .collect()
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
    // Image-text configs keep the vocabulary in their text config; ChatGLM's is padded.
    let vocab = config
        .get("vocab_size")
        .or_else(|| config.get("padded_vocab_size"))
        .or_else(|| config.pointer("/text_config/vocab_size"));
    if let Some(vocab) = vocab.and_then(Value::as_u64) {
        write_tokenizer(dir, vocab as usize)?;
    }
    Ok(())
}

/// A word-level tokenizer over `t0 .. t{vocab-1}`, the last token being `</s>` (EOS).
pub fn write_tokenizer(dir: &Path, vocab: usize) -> Result<()> {
    write_word_tokenizer(dir, (0..vocab - 1).map(|i| format!("t{i}")))
}

/// A word-level tokenizer whose token `i` is `words[i]`, then `</s>` (EOS) as the last id.
pub fn write_word_tokenizer(dir: &Path, words: impl IntoIterator<Item = String>) -> Result<()> {
    let words: Vec<String> = words.into_iter().collect();
    let mut ids = serde_json::Map::new();
    for (i, word) in words.iter().enumerate() {
        ids.insert(word.clone(), json!(i));
    }
    let eos = words.len();
    ids.insert("</s>".into(), json!(eos));
    let tok = json!({
        "version": "1.0",
        "added_tokens": [{"id": eos, "content": "</s>", "single_word": false, "lstrip": false,
                          "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null,
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": false},
        "model": {"type": "WordLevel", "vocab": ids, "unk_token": words.first().map_or("</s>", String::as_str)}
    });
    std::fs::write(dir.join("tokenizer.json"), serde_json::to_string(&tok).expect("json"))?;
    std::fs::write(dir.join("tokenizer_config.json"), r#"{"eos_token": "</s>"}"#)?;
    Ok(())
}

/// A reasoning model's tokenizer for the tiny targets: the words of [`write_tokenizer`], but
/// `<think>` at id `open` and `</think>` at id `close`, both also whole tokens in text (added,
/// not special), as a reasoning model's tokenizer has them.
pub fn write_thinking_tokenizer(dir: &Path, vocab: usize, open: u32, close: u32) -> Result<()> {
    let word = |i: u32| match i {
        _ if i == open => "<think>".to_string(),
        _ if i == close => "</think>".to_string(),
        _ => format!("t{i}"),
    };
    write_word_tokenizer(dir, (0..vocab as u32 - 1).map(word))?;
    let path = dir.join("tokenizer.json");
    let mut tokenizer: Value = serde_json::from_str(&std::fs::read_to_string(&path)?).expect("json");
    for (id, content) in [(open, "<think>"), (close, "</think>")] {
        tokenizer["added_tokens"].as_array_mut().expect("a list").push(json!({
            "id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false,
            "normalized": false, "special": false
        }));
    }
    std::fs::write(&path, tokenizer.to_string())?;
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

/// `tensors` (a checkpoint's weights) with every tensor replaced by a random one of its shape
/// (`scale`, seeds from `seed` in name order): small scales give a drafter flat
/// distributions, large ones drafts the target mostly rejects.
pub fn randomized(mut tensors: HashMap<String, Tensor>, scale: f32, seed: u64) -> Result<HashMap<String, Tensor>> {
    let mut names: Vec<String> = tensors.keys().cloned().collect();
    names.sort();
    for (i, name) in names.iter().enumerate() {
        let dims = tensors[name].dims().to_vec();
        tensors.insert(name.clone(), random_tensor(&dims, scale, seed + i as u64)?);
    }
    Ok(tensors)
}

/// A random Llama target with a small output head (scale 0.03): flat next-token
/// distributions, so rejection sampling against it depends on the draft's `q` (near one-hot
/// `p` and `q` give the same verdicts whatever `q` is).
pub fn soft_target(s: &TinyShape, seed: u64) -> Result<HashMap<String, Tensor>> {
    let mut t = random_target(Architecture::Llama, s, false, seed)?;
    t.insert("lm_head.weight".into(), random_tensor(&[s.vocab, s.hidden], 0.03, seed + 72)?);
    Ok(t)
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

/// GLM-4.5's layout of an MTP head inside the target checkpoint (DeepSeek-V3's:
/// `model.layers.{layer}.*` with `enorm`, `hnorm`, `eh_proj` over [embedding, hidden] and
/// `shared_head.norm`), renamed from a speculators `mtp_layers.0` head's tensors, with zero
/// q/k/v biases for GLM's biased attention.
pub fn glm_mtp_layout(
    s: &TinyShape,
    speculators: HashMap<String, Tensor>,
    layer: usize,
) -> Result<HashMap<String, Tensor>> {
    let p = format!("model.layers.{layer}");
    let mut t = HashMap::new();
    for (name, tensor) in speculators {
        let tail = name.strip_prefix("mtp_layers.0.").expect("a speculators MTP tensor");
        let tail = match tail {
            "hidden_layernorm.weight" => "hnorm.weight",
            "token_layernorm.weight" => "enorm.weight",
            "input_proj.weight" => "eh_proj.weight",
            "final_layernorm.weight" => "shared_head.norm.weight",
            other => other,
        };
        t.insert(format!("{p}.{tail}"), tensor);
    }
    for (n, d) in
        [("q_proj", s.heads * s.head_dim), ("k_proj", s.kv_heads * s.head_dim), ("v_proj", s.kv_heads * s.head_dim)]
    {
        t.entry(format!("{p}.self_attn.{n}.bias")).or_insert(Tensor::zeros(d, DType::F32, &Device::Cpu)?);
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

// ---------------------------------------------------------------------------------------------
// Block drafters (DFlash, DFlash2, DSpark).

/// Shape of a tiny block drafter over a target of `TinyShape`. Block drafters' mask token is
/// the vocabulary's last id (the tiny tokenizer's EOS, which the bigram target never emits).
#[derive(Debug, Clone, Copy)]
pub struct BlockShape {
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
}

impl Default for BlockShape {
    fn default() -> Self {
        Self { layers: 2, heads: 4, kv_heads: 2, head_dim: 16, block_size: 5 }
    }
}

/// The Qwen3-style layer keys of a draft config.
fn block_layer_json(s: &TinyShape, b: &BlockShape, rope_theta: f64) -> Value {
    json!({
        "model_type": "qwen3", "hidden_size": s.hidden, "intermediate_size": s.intermediate,
        "num_hidden_layers": b.layers, "num_attention_heads": b.heads, "num_key_value_heads": b.kv_heads,
        "head_dim": b.head_dim, "vocab_size": s.vocab, "rms_norm_eps": 1e-6, "rope_theta": rope_theta,
        "max_position_embeddings": 512, "tie_word_embeddings": false
    })
}

/// Random DFlash body tensors: `fc` over `n_taps` target taps, norms and Qwen3 layers with
/// q/k norms.
fn random_block_body(s: &TinyShape, b: &BlockShape, n_taps: usize, seed: u64) -> Result<HashMap<String, Tensor>> {
    let mut t = HashMap::new();
    let mut k = seed;
    let mut next = || {
        k += 1;
        k
    };
    let h = s.hidden;
    let (q, kv) = (b.heads * b.head_dim, b.kv_heads * b.head_dim);
    let lin = |out: usize, inp: usize, seed: u64| random_tensor(&[out, inp], (1.0 / inp as f32).sqrt(), seed);
    let norm = |n: usize, seed: u64| random_tensor(&[n], 0.2, seed).and_then(|x| x + 1.0);
    t.insert("fc.weight".into(), lin(h, n_taps * h, next())?);
    t.insert("hidden_norm.weight".into(), norm(h, next())?);
    t.insert("norm.weight".into(), norm(h, next())?);
    for i in 0..b.layers {
        let p = format!("layers.{i}");
        t.insert(format!("{p}.input_layernorm.weight"), norm(h, next())?);
        t.insert(format!("{p}.post_attention_layernorm.weight"), norm(h, next())?);
        t.insert(format!("{p}.self_attn.q_proj.weight"), lin(q, h, next())?);
        t.insert(format!("{p}.self_attn.k_proj.weight"), lin(kv, h, next())?);
        t.insert(format!("{p}.self_attn.v_proj.weight"), lin(kv, h, next())?);
        t.insert(format!("{p}.self_attn.o_proj.weight"), lin(h, q, next())?);
        t.insert(format!("{p}.self_attn.q_norm.weight"), norm(b.head_dim, next())?);
        t.insert(format!("{p}.self_attn.k_norm.weight"), norm(b.head_dim, next())?);
        t.insert(format!("{p}.mlp.gate_proj.weight"), lin(s.intermediate, h, next())?);
        t.insert(format!("{p}.mlp.up_proj.weight"), lin(s.intermediate, h, next())?);
        t.insert(format!("{p}.mlp.down_proj.weight"), lin(h, s.intermediate, next())?);
    }
    Ok(t)
}

/// A reduced draft vocabulary of the first `draft_vocab` even target ids: `d2t[i] = i`
/// (target id `i + d2t[i] = 2i`), stored as i64.
fn even_d2t(draft_vocab: usize) -> Result<Tensor> {
    Tensor::from_vec((0..draft_vocab as i64).collect::<Vec<_>>(), draft_vocab, &Device::Cpu)
}

/// Random z-lab DFlash draft (`DFlashDraftModel`): `target_layer_ids` are output-of-layer ids.
pub fn dflash_zlab(
    s: &TinyShape,
    b: &BlockShape,
    target_layer_ids: &[i64],
    seed: u64,
) -> Result<(Value, HashMap<String, Tensor>)> {
    let mut cfg = block_layer_json(s, b, 1_000_000.0);
    cfg["architectures"] = json!(["DFlashDraftModel"]);
    cfg["auto_map"] = json!({"AutoModel": "dflash.DFlashDraftModel"});
    cfg["num_target_layers"] = json!(s.layers);
    cfg["block_size"] = json!(b.block_size);
    cfg["dflash_config"] = json!({"mask_token_id": s.vocab - 1, "target_layer_ids": target_layer_ids});
    Ok((cfg, random_block_body(s, b, target_layer_ids.len(), seed)?))
}

/// The `embed_tokens` and `lm_head` a speculators or DeepSpec checkpoint carries: copies of the
/// target's (`target` holds its tensors), or a trained `lm_head [Vd, H]` plus `d2t` when the
/// draft vocabulary is reduced.
fn head_tensors(
    s: &TinyShape,
    target: &HashMap<String, Tensor>,
    draft_vocab: usize,
    t: &mut HashMap<String, Tensor>,
    seed: u64,
) -> Result<()> {
    let embed = target["model.embed_tokens.weight"].clone();
    let lm_head = if draft_vocab < s.vocab {
        t.insert("d2t".into(), even_d2t(draft_vocab)?);
        random_tensor(&[draft_vocab, s.hidden], 0.3, seed)?
    } else {
        target.get("lm_head.weight").cloned().unwrap_or_else(|| embed.clone())
    };
    t.insert("lm_head.weight".into(), lm_head);
    t.insert("embed_tokens.weight".into(), embed);
    Ok(())
}

/// Random speculators DFlash draft (`DFlashSpeculator`): `aux_hidden_state_layer_ids` are
/// `hidden_states` indices; a `draft_vocab` below the target's adds `lm_head [Vd, H]` and `d2t`.
/// `target` holds the target's tensors (the checkpoint carries copies of its embedding).
pub fn dflash_speculators(
    s: &TinyShape,
    b: &BlockShape,
    aux_ids: &[i64],
    draft_vocab: usize,
    target: &HashMap<String, Tensor>,
    seed: u64,
) -> Result<(Value, HashMap<String, Tensor>)> {
    let mut t = random_block_body(s, b, aux_ids.len(), seed)?;
    head_tensors(s, target, draft_vocab, &mut t, seed + 1000)?;
    let cfg = json!({
        "architectures": ["DFlashSpeculator"],
        "speculators_model_type": "dflash",
        "speculators_version": "0.3.0",
        "block_size": b.block_size,
        "mask_token_id": s.vocab - 1,
        "aux_hidden_state_layer_ids": aux_ids,
        "draft_vocab_size": draft_vocab,
        "target_hidden_size": null,
        "sample_from_anchor": false,
        "sliding_window_non_causal": false,
        "transformer_layer_config": block_layer_json(s, b, 1_000_000.0),
        "speculators_config": {"algorithm": "dflash", "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": b.block_size - 1}]}
    });
    Ok((cfg, t))
}

/// DFlash2 convolution and selector sizes of the tiny drafters.
pub const TINY_DFLASH2: (usize, usize, usize, usize) = (3, 16, 8, 4); // taps, group, rank, top-k

/// Random DFlash2 draft (`DFlash2DraftModel`): the z-lab body plus per-layer convolutions and
/// the candidate selector.
pub fn dflash2_zlab(
    s: &TinyShape,
    b: &BlockShape,
    target_layer_ids: &[i64],
    seed: u64,
) -> Result<(Value, HashMap<String, Tensor>)> {
    let (taps, group, rank, top_k) = TINY_DFLASH2;
    let (mut cfg, mut t) = dflash_zlab(s, b, target_layer_ids, seed)?;
    cfg["architectures"] = json!(["DFlash2DraftModel"]);
    let dc = cfg["dflash_config"].as_object_mut().expect("object");
    for (k, v) in [
        ("conv_kernel_size", json!(taps)),
        ("conv_group_size", json!(group)),
        ("selector_rank", json!(rank)),
        ("selector_top_k", json!(top_k)),
        ("input_embedding_scale", json!(1.5)),
        ("output_multiplier", json!(0.8)),
        ("final_logit_softcapping", json!(4.0)),
        ("block_size", json!(b.block_size)),
    ] {
        dc.insert(k.into(), v);
    }
    let h = s.hidden;
    let groups = h / group;
    for i in 0..b.layers {
        for conv in ["attention_conv", "mlp_conv"] {
            let p = format!("layers.{i}.{conv}");
            t.insert(format!("{p}.base_kernel"), random_tensor(&[2, taps, h], 0.5, seed + 2000 + i as u64)?);
            t.insert(
                format!("{p}.kernel_projection.weight"),
                random_tensor(&[2 * taps * groups, h], 0.1, seed + 3000 + i as u64)?,
            );
        }
    }
    t.insert("candidate_selector.predecessor_codebook".into(), random_tensor(&[s.vocab, rank], 1.0, seed + 4000)?);
    t.insert("candidate_selector.successor_codebook".into(), random_tensor(&[s.vocab, rank], 1.0, seed + 4001)?);
    t.insert("candidate_selector.hidden_projection.weight".into(), random_tensor(&[rank, h], 0.5, seed + 4002)?);
    Ok((cfg, t))
}

/// Random DeepSpec DSpark draft (`Qwen3DSparkModel`): output-of-layer `target_layer_ids`, a
/// vanilla Markov head of `markov_rank`, and the target-copied `embed_tokens`/`lm_head`
/// (`target` names the target's tensors the copies are taken from).
pub fn dspark_deepspec(
    s: &TinyShape,
    b: &BlockShape,
    target_layer_ids: &[i64],
    markov_rank: usize,
    target: &HashMap<String, Tensor>,
    seed: u64,
) -> Result<(Value, HashMap<String, Tensor>)> {
    let mut t = random_block_body(s, b, target_layer_ids.len(), seed)?;
    head_tensors(s, target, s.vocab, &mut t, seed)?;
    t.insert("markov_head.markov_w1.weight".into(), random_tensor(&[s.vocab, markov_rank], 1.0, seed + 5000)?);
    t.insert("markov_head.markov_w2.weight".into(), random_tensor(&[s.vocab, markov_rank], 2.0, seed + 5001)?);
    let mut cfg = block_layer_json(s, b, 1_000_000.0);
    cfg["architectures"] = json!(["Qwen3DSparkModel"]);
    for (k, v) in [
        ("num_target_layers", json!(s.layers)),
        ("block_size", json!(b.block_size)),
        ("target_layer_ids", json!(target_layer_ids)),
        ("mask_token_id", json!(s.vocab - 1)),
        ("num_anchors", json!(512)),
        ("markov_rank", json!(markov_rank)),
        ("markov_head_type", json!("vanilla")),
        ("enable_confidence_head", json!(false)),
        ("confidence_head_with_markov", json!(false)),
        ("layer_types", json!(vec!["full_attention"; b.layers])),
    ] {
        cfg[k] = v;
    }
    Ok((cfg, t))
}

/// Random speculators DSpark draft (`DSparkSpeculator`), with a reduced draft vocabulary when
/// `draft_vocab` is below the target's (`target` holds the target's tensors).
pub fn dspark_speculators(
    s: &TinyShape,
    b: &BlockShape,
    aux_ids: &[i64],
    draft_vocab: usize,
    markov_rank: usize,
    target: &HashMap<String, Tensor>,
    seed: u64,
) -> Result<(Value, HashMap<String, Tensor>)> {
    let mut t = random_block_body(s, b, aux_ids.len(), seed)?;
    head_tensors(s, target, draft_vocab, &mut t, seed + 6000)?;
    t.insert("markov_head.markov_w1.weight".into(), random_tensor(&[s.vocab, markov_rank], 1.0, seed + 6001)?);
    t.insert("markov_head.markov_w2.weight".into(), random_tensor(&[draft_vocab, markov_rank], 2.0, seed + 6002)?);
    let cfg = json!({
        "architectures": ["DSparkSpeculator"],
        "speculators_model_type": "dspark",
        "speculators_version": "0.3.0",
        "block_size": b.block_size,
        "mask_token_id": s.vocab - 1,
        "aux_hidden_state_layer_ids": aux_ids,
        "draft_vocab_size": draft_vocab,
        "sample_from_anchor": true,
        "markov_rank": markov_rank,
        "markov_head_type": "vanilla",
        "enable_confidence_head": false,
        "transformer_layer_config": block_layer_json(s, b, 1_000_000.0),
        "speculators_config": {"algorithm": "dspark", "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": b.block_size}]}
    });
    Ok((cfg, t))
}

/// One-layer block-drafter body that predicts the bigram target perfectly, for a block of
/// `block_size` slots whose slot `j` must hold the token `next^(j − shift)(anchor)` so that
/// the target's head turns it into the right draft (`shift` 1 for DFlash, 0 for DSpark).
///
/// Head `h` (`h = 1 .. block_size − 1`) finds the key exactly `h` positions back, which for
/// slot `h` is the anchor; its value carries the anchor token and `o_proj` applies the
/// successor `h − shift` times. Queries and keys are constant, so RoPE alone places the
/// attention: `rope_theta = 0.01` spreads the frequencies over [1, 86] rad, and each key is
/// the query rotated per frequency pair so that one half of the pairs peaks at offset `−h`
/// and the other half (weaker) at offset `+1`. A slot with no key `h` back (`h > j`) then
/// attends to the next slot instead — a mask slot whose value is zero — rather than spreading
/// over keys that would leak the anchor through the wrong power of the successor. Context keys
/// and values are zero (`fc = 0`). The residual keeps the slot's own embedding, weaker than
/// the copied token, so the anchor slot of a DSpark block drafts `next(anchor)` unaided.
/// Needs `vocab <= 64 = hidden`, the mask token the last id (the EOS, never drafted).
fn oracle_block_body(s: &TinyShape, block_size: usize, shift: usize) -> Result<(Value, HashMap<String, Tensor>)> {
    let (h, d) = (s.hidden, 64usize);
    assert!(s.vocab <= d && h == d, "the block oracle needs vocab <= hidden = 64");
    let heads = block_size - 1;
    let next = bigram_successor(s.vocab);
    let half = d / 2;
    let theta = |i: usize| 0.01f64.powf(-2.0 * i as f64 / d as f64);
    // Pair i = dims (i, i + d/2): even pairs (amplitude² 2) peak at offset −h, odd ones at +1.
    let amplitude = |i: usize| if i.is_multiple_of(2) { 2f64.sqrt() } else { 1.0 };
    let mut t = HashMap::new();
    let zeros = |shape: &[usize]| Tensor::zeros(shape, DType::F32, &Device::Cpu);
    let ones = |n: usize| Tensor::ones(n, DType::F32, &Device::Cpu);
    t.insert("fc.weight".into(), zeros(&[h, h])?);
    t.insert("hidden_norm.weight".into(), ones(h)?);
    t.insert("norm.weight".into(), ones(h)?);
    let p = "layers.0";
    t.insert(format!("{p}.input_layernorm.weight"), ones(h)?);
    t.insert(format!("{p}.post_attention_layernorm.weight"), ones(h)?);
    t.insert(format!("{p}.self_attn.q_norm.weight"), (ones(d)? * 4.0)?);
    t.insert(format!("{p}.self_attn.k_norm.weight"), (ones(d)? * 3.0)?);
    let (mut q, mut k, mut v, mut o) =
        (vec![0f32; heads * d * h], vec![0f32; heads * d * h], vec![0f32; heads * d * h], vec![0f32; h * heads * d]);
    for head in 0..heads {
        let offset = head + 1;
        for i in 0..half {
            let phi = if i.is_multiple_of(2) { offset as f64 * theta(i) } else { -theta(i) };
            let a = amplitude(i);
            let (qx, kx, ky) = (a, a * phi.cos(), a * phi.sin());
            // Every token column maps to the same query and key.
            for col in 0..s.vocab {
                q[(head * d + i) * h + col] = qx as f32;
                k[(head * d + i) * h + col] = kx as f32;
                k[(head * d + i + half) * h + col] = ky as f32;
            }
        }
        // Value: the (normed, √H-scaled) one-hot token, scaled to 4; the mask token carries none.
        for tok in 0..s.vocab - 1 {
            v[(head * d + tok) * h + tok] = 4.0 / (h as f32).sqrt();
            let mut out = tok;
            for _ in shift..offset {
                out = next[out] as usize;
            }
            o[out * heads * d + head * d + tok] = 1.0;
        }
    }
    let cpu = &Device::Cpu;
    t.insert(format!("{p}.self_attn.q_proj.weight"), Tensor::from_vec(q, (heads * d, h), cpu)?);
    t.insert(format!("{p}.self_attn.k_proj.weight"), Tensor::from_vec(k, (heads * d, h), cpu)?);
    t.insert(format!("{p}.self_attn.v_proj.weight"), Tensor::from_vec(v, (heads * d, h), cpu)?);
    t.insert(format!("{p}.self_attn.o_proj.weight"), Tensor::from_vec(o, (h, heads * d), cpu)?);
    t.insert(format!("{p}.mlp.gate_proj.weight"), random_tensor(&[s.intermediate, h], 0.1, 21)?);
    t.insert(format!("{p}.mlp.up_proj.weight"), random_tensor(&[s.intermediate, h], 0.1, 22)?);
    t.insert(format!("{p}.mlp.down_proj.weight"), zeros(&[h, s.intermediate])?);
    let b = BlockShape { layers: 1, heads, kv_heads: heads, head_dim: d, block_size };
    let mut cfg = block_layer_json(s, &b, 0.01);
    cfg["num_target_layers"] = json!(s.layers);
    cfg["block_size"] = json!(block_size);
    Ok((cfg, t))
}

/// z-lab DFlash draft that predicts the bigram target perfectly (see [`oracle_block_body`]).
pub fn dflash_oracle(s: &TinyShape, block_size: usize) -> Result<(Value, HashMap<String, Tensor>)> {
    let (mut cfg, t) = oracle_block_body(s, block_size, 1)?;
    cfg["architectures"] = json!(["DFlashDraftModel"]);
    cfg["dflash_config"] = json!({"mask_token_id": s.vocab - 1, "target_layer_ids": [s.layers as i64 - 2]});
    Ok((cfg, t))
}

/// DFlash2 draft that predicts the bigram target perfectly: the DFlash oracle with identity
/// convolutions (tap 0 of both sides 1, no dynamic part) and a selector whose pairwise term
/// is zero, so the walk follows the `lm_head` argmax.
pub fn dflash2_oracle(s: &TinyShape, block_size: usize) -> Result<(Value, HashMap<String, Tensor>)> {
    let (taps, group, rank, top_k) = TINY_DFLASH2;
    let (mut cfg, mut t) = dflash_oracle(s, block_size)?;
    cfg["architectures"] = json!(["DFlash2DraftModel"]);
    let dc = cfg["dflash_config"].as_object_mut().expect("object");
    dc.insert("conv_kernel_size".into(), json!(taps));
    dc.insert("conv_group_size".into(), json!(group));
    dc.insert("selector_rank".into(), json!(rank));
    dc.insert("selector_top_k".into(), json!(top_k));
    let h = s.hidden;
    let mut base = vec![0f32; 2 * taps * h];
    for side in 0..2 {
        base[side * taps * h..side * taps * h + h].fill(1.0);
    }
    for conv in ["attention_conv", "mlp_conv"] {
        t.insert(format!("layers.0.{conv}.base_kernel"), Tensor::from_vec(base.clone(), (2, taps, h), &Device::Cpu)?);
        t.insert(
            format!("layers.0.{conv}.kernel_projection.weight"),
            Tensor::zeros((2 * taps * (h / group), h), DType::F32, &Device::Cpu)?,
        );
    }
    for name in ["predecessor_codebook", "successor_codebook"] {
        t.insert(format!("candidate_selector.{name}"), Tensor::zeros((s.vocab, rank), DType::F32, &Device::Cpu)?);
    }
    t.insert("candidate_selector.hidden_projection.weight".into(), Tensor::zeros((rank, h), DType::F32, &Device::Cpu)?);
    Ok((cfg, t))
}

/// DeepSpec DSpark draft that predicts the bigram target perfectly: every slot drafts
/// (`sample_from_anchor`), slot `k` holding `next^k(anchor)`; the Markov head adds nothing.
pub fn dspark_oracle(s: &TinyShape, block_size: usize) -> Result<(Value, HashMap<String, Tensor>)> {
    let (mut cfg, mut t) = oracle_block_body(s, block_size, 0)?;
    cfg["architectures"] = json!(["Qwen3DSparkModel"]);
    cfg["target_layer_ids"] = json!([-1]);
    cfg["mask_token_id"] = json!(s.vocab - 1);
    cfg["num_anchors"] = json!(512);
    cfg["markov_rank"] = json!(8);
    cfg["markov_head_type"] = json!("vanilla");
    cfg["enable_confidence_head"] = json!(false);
    for name in ["markov_w1", "markov_w2"] {
        t.insert(format!("markov_head.{name}.weight"), Tensor::zeros((s.vocab, 8), DType::F32, &Device::Cpu)?);
    }
    Ok((cfg, t))
}

/// A HunYuan MoE (Hunyuan-A13B) `config.json` for a tiny target: `m`'s experts in every layer
/// (per-layer lists, as released), its shared MLP `m.shared_intermediate` wide, per-head q/k
/// norms after RoPE, and NTK-alpha `alpha`.
pub fn hunyuan_moe_config(s: &TinyShape, m: &TinyMoe, alpha: f64) -> Value {
    let mut c = target_config(Architecture::HunYuanMoe, s, true);
    let layers = |v: usize| json!(vec![v; s.layers]);
    c["num_experts"] = json!(m.experts);
    c["moe_topk"] = layers(m.top_k);
    c["moe_intermediate_size"] = layers(m.expert_intermediate);
    c["intermediate_size"] = json!(m.shared_intermediate.expect("Hunyuan-A13B has a shared MLP"));
    c["num_shared_expert"] = layers(1);
    c["use_mixed_mlp_moe"] = json!(true);
    c["use_qk_norm"] = json!(true);
    c["use_cla"] = json!(false);
    c["moe_layer_num_skipped"] = json!(0);
    c["rope_scaling"] = json!({"alpha": alpha, "factor": 1.0, "type": "dynamic", "beta_fast": 32, "beta_slow": 1});
    c
}

/// A mixture's tensors under the shared layer's names as Hunyuan names them: the q/k norms
/// `query_layernorm` / `key_layernorm`, the router `mlp.gate.wg`, the shared MLP `mlp.shared_mlp`.
pub fn as_hunyuan(tensors: &HashMap<String, Tensor>) -> HashMap<String, Tensor> {
    tensors
        .iter()
        .map(|(name, t)| {
            let name = name
                .replace(".q_norm.", ".query_layernorm.")
                .replace(".k_norm.", ".key_layernorm.")
                .replace(".mlp.gate.weight", ".mlp.gate.wg.weight")
                .replace(".mlp.shared_experts.", ".mlp.shared_mlp.");
            (name, t.clone())
        })
        .collect()
}

/// A Llama 4 text `config.json` (`Llama4ForCausalLM`) for a tiny target: `m`'s experts
/// (`intermediate_size`, one shared expert as wide) in every `step`-th layer
/// (`interleave_moe_layer_step`), dense layers `s.intermediate` wide (`intermediate_size_mlp`),
/// every fourth layer without RoPE, the others attending within `chunk` positions with
/// weightless q/k norms, and the NoPE layers' queries tempered from position `floor_scale - 1`.
pub fn llama4_config(s: &TinyShape, m: &TinyMoe, step: usize, chunk: usize, floor_scale: f64) -> Value {
    assert_eq!(m.shared_intermediate, Some(m.expert_intermediate), "Llama 4's shared expert is as wide");
    let mut c = target_config(Architecture::Llama4, s, false);
    c["intermediate_size"] = json!(m.expert_intermediate);
    c["intermediate_size_mlp"] = json!(s.intermediate);
    c["num_local_experts"] = json!(m.experts);
    c["num_experts_per_tok"] = json!(m.top_k);
    c["interleave_moe_layer_step"] = json!(step);
    c["attention_chunk_size"] = json!(chunk);
    c["use_qk_norm"] = json!(true);
    // As Scout's released config writes it: a number transformers reads as true.
    c["attn_temperature_tuning"] = json!(4);
    c["floor_scale"] = json!(floor_scale);
    c["attn_scale"] = json!(0.1);
    c["no_rope_layers"] = json!([]);
    c["router_aux_loss_coef"] = json!(0.001);
    c
}

/// Random weights for a tiny Llama 4 under the shared layer's names (write them with
/// [`as_llama4`]): Llama's attention, and in each of every `step`-th layer a router, `m`'s
/// experts and an ungated shared expert.
pub fn random_llama4(s: &TinyShape, m: &TinyMoe, step: usize, seed: u64) -> Result<HashMap<String, Tensor>> {
    let dense: Vec<usize> = (0..s.layers).filter(|l| !(l + 1).is_multiple_of(step)).collect();
    let m = TinyMoe { dense_layers: dense, ..m.clone() };
    random_moe_target(Architecture::GraniteMoe, s, &m, seed)
}

/// Tensors under the shared layer's names as a Llama 4 checkpoint stores them: the MLP as
/// `feed_forward` (`router`, `shared_expert`), each layer's experts fused as right-hand matrices
/// (`experts.gate_up_proj [E, H, 2I]`, gate columns first, and `experts.down_proj [E, I, H]`);
/// with `image_text`, under `language_model.*` beside a vision tensor, as the released
/// `Llama4ForConditionalGeneration` checkpoints.
pub fn as_llama4(
    tensors: &HashMap<String, Tensor>,
    num_experts: usize,
    image_text: bool,
) -> Result<HashMap<String, Tensor>> {
    let mut out = HashMap::new();
    let place = |name: &str| match (image_text, name.strip_prefix("model.")) {
        (true, Some(rest)) => format!("language_model.model.{rest}"),
        (true, None) => format!("language_model.{name}"),
        (false, _) => name.to_string(),
    };
    let mut fused_layers = Vec::new();
    for (name, t) in tensors {
        if let Some((layer, _)) = name.split_once(".mlp.experts.") {
            fused_layers.push(layer.to_string());
            continue;
        }
        let renamed = name
            .replace(".mlp.gate.", ".feed_forward.router.")
            .replace(".mlp.shared_experts.", ".feed_forward.shared_expert.")
            .replace(".mlp.", ".feed_forward.");
        out.insert(place(&renamed), t.clone());
    }
    fused_layers.sort();
    fused_layers.dedup();
    for layer in fused_layers {
        let expert = |e: usize, proj: &str| tensors[&format!("{layer}.mlp.experts.{e}.{proj}.weight")].t();
        let gate_up = (0..num_experts)
            .map(|e| Tensor::cat(&[expert(e, "gate_proj")?, expert(e, "up_proj")?], 1))
            .collect::<Result<Vec<_>>>()?;
        let down = (0..num_experts).map(|e| expert(e, "down_proj")).collect::<Result<Vec<_>>>()?;
        out.insert(place(&format!("{layer}.feed_forward.experts.gate_up_proj")), Tensor::stack(&gate_up, 0)?);
        out.insert(place(&format!("{layer}.feed_forward.experts.down_proj")), Tensor::stack(&down, 0)?.contiguous()?);
    }
    if image_text {
        out.insert("vision_model.patch_embedding.linear.weight".into(), random_tensor(&[8, 12], 0.1, 7)?);
    }
    Ok(out)
}

/// A Llama 4 text config wrapped as the released image-text checkpoints' `config.json`.
pub fn llama4_image_text_config(text: &Value) -> Value {
    json!({
        "architectures": ["Llama4ForConditionalGeneration"],
        "model_type": "llama4",
        "text_config": text,
        "vision_config": {"hidden_size": 12, "model_type": "llama4_vision_model"},
        "image_token_index": 2,
        "tie_word_embeddings": false,
    })
}

/// A StarCoder2 `config.json` for a tiny target: tied embeddings, biases everywhere
/// (`use_bias`), LayerNorms of `norm_epsilon` 1e-5, tanh GELU, attending within `window`.
pub fn starcoder2_config(s: &TinyShape, window: Option<usize>) -> Value {
    let mut c = target_config(Architecture::Starcoder2, s, true);
    let map = c.as_object_mut().expect("a config object");
    map.remove("rms_norm_eps");
    map.insert("norm_epsilon".into(), json!(1e-5));
    map.insert("use_bias".into(), json!(true));
    map.insert("hidden_act".into(), json!("gelu_pytorch_tanh"));
    map.insert("sliding_window".into(), json!(window));
    c
}

/// Random weights for a tiny StarCoder2 under the shared layer's names: Llama's without the
/// MLP's gate, plus a bias on every projection and every LayerNorm (see [`as_starcoder2`] for
/// the checkpoint's own names).
pub fn random_starcoder2(s: &TinyShape, seed: u64) -> Result<HashMap<String, Tensor>> {
    let mut t = random_target(Architecture::Llama, s, true, seed)?;
    t.retain(|name, _| !name.ends_with("mlp.gate_proj.weight"));
    let (h, q, kv) = (s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim);
    let per_layer = [
        ("input_layernorm", h),
        ("post_attention_layernorm", h),
        ("self_attn.q_proj", q),
        ("self_attn.k_proj", kv),
        ("self_attn.v_proj", kv),
        ("self_attn.o_proj", h),
        ("mlp.up_proj", s.intermediate),
        ("mlp.down_proj", h),
    ];
    insert_random_biases(&mut t, s.layers, &per_layer, &[("model.norm.bias", h)], seed * 1000)?;
    Ok(t)
}

/// Adds a random `[dim]` bias for each `(module, dim)` of `per_layer` in each of `layers`
/// layers (`model.layers.{i}.{module}.bias`) and for each `(name, dim)` of `extra`, seeded from
/// `seed` on.
fn insert_random_biases(
    t: &mut HashMap<String, Tensor>,
    layers: usize,
    per_layer: &[(&str, usize)],
    extra: &[(&str, usize)],
    seed: u64,
) -> Result<()> {
    let layered = (0..layers)
        .flat_map(|i| per_layer.iter().map(move |&(module, dim)| (format!("model.layers.{i}.{module}.bias"), dim)));
    let named = extra.iter().map(|&(name, dim)| (name.to_string(), dim)).chain(layered);
    for (k, (name, dim)) in named.enumerate() {
        t.insert(name, random_tensor(&[dim], 0.1, seed + k as u64)?);
    }
    Ok(())
}

/// A StarCoder2 checkpoint's own names for the shared layer's: the MLP's `c_fc` and `c_proj`.
pub fn as_starcoder2(tensors: &HashMap<String, Tensor>) -> HashMap<String, Tensor> {
    tensors
        .iter()
        .map(|(name, t)| {
            (name.replace(".mlp.up_proj.", ".mlp.c_fc.").replace(".mlp.down_proj.", ".mlp.c_proj."), t.clone())
        })
        .collect()
}

/// A StableLM `config.json` for a tiny target: LayerNorms of `layer_norm_eps` 1e-5, RoPE over
/// the leading `rotary_factor` of each head, q/k/v biases when `qkv_bias`, per-head q/k
/// LayerNorms when `qk_norm`, attention beside the MLP when `parallel`.
pub fn stablelm_config(s: &TinyShape, rotary_factor: f64, qkv_bias: bool, qk_norm: bool, parallel: bool) -> Value {
    let mut c = target_config(Architecture::StableLm, s, false);
    let map = c.as_object_mut().expect("a config object");
    map.remove("rms_norm_eps");
    for (key, value) in [
        ("layer_norm_eps", json!(1e-5)),
        ("partial_rotary_factor", json!(rotary_factor)),
        ("use_qkv_bias", json!(qkv_bias)),
        ("qk_layernorm", json!(qk_norm)),
        ("use_parallel_residual", json!(parallel)),
        ("hidden_act", json!("silu")),
    ] {
        map.insert(key.into(), value);
    }
    c
}

/// Random weights for a tiny StableLM under the shared layer's names: Llama's, with a bias on
/// every LayerNorm, q/k/v biases when `qkv_bias`, a `[heads, head_dim]` q/k norm weight when
/// `qk_norm`, and no norm before the MLP when `parallel` (see [`as_stablelm`] for the
/// checkpoint's own names).
pub fn random_stablelm(
    s: &TinyShape,
    qkv_bias: bool,
    qk_norm: bool,
    parallel: bool,
    seed: u64,
) -> Result<HashMap<String, Tensor>> {
    let mut t = random_target(Architecture::Llama, s, false, seed)?;
    let (h, q, kv) = (s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim);
    let mut k = seed * 1000;
    let mut next = || {
        k += 1;
        k
    };
    t.insert("model.norm.bias".into(), random_tensor(&[h], 0.1, next())?);
    for i in 0..s.layers {
        let p = format!("model.layers.{i}");
        t.insert(format!("{p}.input_layernorm.bias"), random_tensor(&[h], 0.1, next())?);
        if parallel {
            t.remove(&format!("{p}.post_attention_layernorm.weight"));
        } else {
            t.insert(format!("{p}.post_attention_layernorm.bias"), random_tensor(&[h], 0.1, next())?);
        }
        if qkv_bias {
            for (n, d) in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)] {
                t.insert(format!("{p}.self_attn.{n}.bias"), random_tensor(&[d], 0.1, next())?);
            }
        }
        if qk_norm {
            let norm = |heads: usize, seed: u64| random_tensor(&[heads, s.head_dim], 0.3, seed)? + 1.0;
            t.insert(format!("{p}.self_attn.q_norm.weight"), norm(s.heads, next())?);
            t.insert(format!("{p}.self_attn.k_norm.weight"), norm(s.kv_heads, next())?);
        }
    }
    Ok(t)
}

/// A StableLM checkpoint's own names: each head's q/k norm weight apart,
/// `{q,k}_layernorm.norms.{h}.weight`.
pub fn as_stablelm(tensors: &HashMap<String, Tensor>) -> Result<HashMap<String, Tensor>> {
    let mut out = HashMap::new();
    for (name, t) in tensors {
        let per_head = [("q_norm.weight", "q_layernorm"), ("k_norm.weight", "k_layernorm")]
            .into_iter()
            .find_map(|(ours, theirs)| name.strip_suffix(ours).map(|p| (p, theirs)));
        match per_head {
            Some((prefix, theirs)) => {
                for h in 0..t.dim(0)? {
                    out.insert(format!("{prefix}{theirs}.norms.{h}.weight"), t.get(h)?);
                }
            }
            None => {
                out.insert(name.clone(), t.clone());
            }
        }
    }
    Ok(out)
}

/// A Phi (Phi-2 layout) `config.json` for a tiny target: LayerNorms of `layer_norm_eps` 1e-5,
/// tanh GELU, RoPE over the leading `rotary_factor` of each head, q/k LayerNorms when
/// `qk_norm`.
pub fn phi_config(s: &TinyShape, rotary_factor: f64, qk_norm: bool) -> Value {
    let mut c = target_config(Architecture::Phi, s, false);
    let map = c.as_object_mut().expect("a config object");
    map.remove("rms_norm_eps");
    map.remove("head_dim");
    for (key, value) in [
        ("layer_norm_eps", json!(1e-5)),
        ("partial_rotary_factor", json!(rotary_factor)),
        ("qk_layernorm", json!(qk_norm)),
        ("hidden_act", json!("gelu_new")),
    ] {
        map.insert(key.into(), value);
    }
    c
}

/// Random weights for a tiny Phi under the shared layer's names: one LayerNorm with bias per
/// layer, biases on every projection and on `lm_head`, an MLP without a gate, and with
/// `qk_norm` one `[head_dim]` LayerNorm (with bias) for q and one for k (see [`as_phi`] for the
/// checkpoint's own names). `s.hidden` must be `s.heads · s.head_dim`.
pub fn random_phi(s: &TinyShape, qk_norm: bool, seed: u64) -> Result<HashMap<String, Tensor>> {
    assert_eq!(s.hidden, s.heads * s.head_dim, "Phi's heads span the hidden size");
    let mut t = random_target(Architecture::Llama, s, false, seed)?;
    t.retain(|name, _| !name.ends_with("mlp.gate_proj.weight") && !name.ends_with("post_attention_layernorm.weight"));
    let (h, q, kv, d) = (s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim, s.head_dim);
    let mut per_layer = vec![
        ("input_layernorm", h),
        ("self_attn.q_proj", q),
        ("self_attn.k_proj", kv),
        ("self_attn.v_proj", kv),
        ("self_attn.o_proj", h),
        ("mlp.up_proj", s.intermediate),
        ("mlp.down_proj", h),
    ];
    if qk_norm {
        per_layer.extend([("self_attn.q_norm", d), ("self_attn.k_norm", d)]);
        for i in 0..s.layers {
            for (j, which) in ["q_norm", "k_norm"].into_iter().enumerate() {
                let weight = (random_tensor(&[d], 0.1, seed * 1000 + 500 + 2 * i as u64 + j as u64)? + 1.0)?;
                t.insert(format!("model.layers.{i}.self_attn.{which}.weight"), weight);
            }
        }
    }
    let extra = [("model.norm.bias", h), ("lm_head.bias", s.vocab)];
    insert_random_biases(&mut t, s.layers, &per_layer, &extra, seed * 1000)?;
    Ok(t)
}

/// A Phi checkpoint's own names for the shared layer's: `dense`, `fc1`, `fc2`,
/// `{q,k}_layernorm` and `model.final_layernorm`.
pub fn as_phi(tensors: &HashMap<String, Tensor>) -> HashMap<String, Tensor> {
    tensors
        .iter()
        .map(|(name, t)| {
            let name = name
                .replace(".self_attn.o_proj.", ".self_attn.dense.")
                .replace(".self_attn.q_norm.", ".self_attn.q_layernorm.")
                .replace(".self_attn.k_norm.", ".self_attn.k_layernorm.")
                .replace(".mlp.up_proj.", ".mlp.fc1.")
                .replace(".mlp.down_proj.", ".mlp.fc2.")
                .replace("model.norm.", "model.final_layernorm.");
            (name, t.clone())
        })
        .collect()
}

/// A Phi-3.5-MoE `config.json` for a tiny target: Mixtral's keys for `m`'s experts (two per
/// token), sparsemixer's `router_jitter_noise` `jitter`, biases on attention and `lm_head`,
/// and LongRoPE over the whole pretrained window (512 positions, so its short factors serve)
/// with `short_mscale` 1.2 and `long_mscale` 1.3.
pub fn phimoe_config(s: &TinyShape, m: &TinyMoe, jitter: f64) -> Value {
    let mut c = moe_target_config(Architecture::Mixtral, s, m);
    c["architectures"] = json!([Architecture::PhiMoe.hf_name()]);
    c["model_type"] = json!(Architecture::PhiMoe.model_type());
    c["router_jitter_noise"] = json!(jitter);
    c["input_jitter_noise"] = json!(jitter);
    c["attention_bias"] = json!(true);
    c["lm_head_bias"] = json!(true);
    c["original_max_position_embeddings"] = json!(512);
    let half = s.head_dim / 2;
    let factors = |base: f64| (0..half).map(|i| base + 0.25 * i as f64).collect::<Vec<f64>>();
    c["rope_scaling"] = json!({
        "type": "longrope", "short_factor": factors(1.0), "long_factor": factors(2.0),
        "short_mscale": 1.2, "long_mscale": 1.3,
    });
    c
}

/// Random weights for a tiny Phi-3.5-MoE under the shared layer's names (write them with
/// [`as_mixtral`]): Mixtral's, plus biases on q, k, v, o, every LayerNorm and `lm_head`.
pub fn random_phimoe(s: &TinyShape, m: &TinyMoe, seed: u64) -> Result<HashMap<String, Tensor>> {
    let mut t = random_moe_target(Architecture::Mixtral, s, m, seed)?;
    let (h, q, kv) = (s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim);
    let per_layer = [
        ("input_layernorm", h),
        ("post_attention_layernorm", h),
        ("self_attn.q_proj", q),
        ("self_attn.k_proj", kv),
        ("self_attn.v_proj", kv),
        ("self_attn.o_proj", h),
    ];
    let extra = [("model.norm.bias", h), ("lm_head.bias", s.vocab)];
    insert_random_biases(&mut t, s.layers, &per_layer, &extra, seed * 1000 + 500)?;
    Ok(t)
}

/// An OLMo 1 `config.json` for a tiny target (untied), q/k/v clamped to `±clip` when given.
pub fn olmo_config(s: &TinyShape, clip: Option<f64>) -> Value {
    let mut c = target_config(Architecture::Olmo, s, false);
    c["clip_qkv"] = json!(clip);
    c
}

/// Random weights for a tiny OLMo 1: Llama's without a single norm weight (its LayerNorms
/// have none).
pub fn random_olmo(s: &TinyShape, seed: u64) -> Result<HashMap<String, Tensor>> {
    let mut t = random_target(Architecture::Llama, s, false, seed)?;
    t.retain(|name, _| !name.ends_with("norm.weight"));
    Ok(t)
}

/// A Nemotron `config.json` for a tiny target: LayerNorm1P of `norm_eps` 1e-5, RoPE over half
/// of each head, relu² MLP, no biases on the projections.
pub fn nemotron_config(s: &TinyShape) -> Value {
    let mut c = target_config(Architecture::Nemotron, s, false);
    let map = c.as_object_mut().expect("a config object");
    map.remove("rms_norm_eps");
    for (key, value) in
        [("norm_eps", json!(1e-5)), ("partial_rotary_factor", json!(0.5)), ("hidden_act", json!("relu2"))]
    {
        map.insert(key.into(), value);
    }
    c
}

/// Random weights for a tiny Nemotron: Llama's without the MLP's gate, each norm's weight
/// stored less one (LayerNorm1P) and given a bias.
pub fn random_nemotron(s: &TinyShape, seed: u64) -> Result<HashMap<String, Tensor>> {
    let mut t = random_target(Architecture::Llama, s, false, seed)?;
    t.retain(|name, _| !name.ends_with("mlp.gate_proj.weight"));
    let norms: Vec<String> = t.keys().filter(|n| n.ends_with("norm.weight")).cloned().collect();
    for (i, name) in norms.into_iter().enumerate() {
        let weight = (t[&name].clone() - 1.0)?;
        let dim = weight.dim(0)?;
        t.insert(name.replace(".weight", ".bias"), random_tensor(&[dim], 0.1, seed * 1000 + i as u64)?);
        t.insert(name, weight);
    }
    Ok(t)
}

/// A GPT-NeoX `config.json` for a tiny target as Pythia's read: `rotary_pct` and
/// `rotary_emb_base`, `layer_norm_eps`, exact GELU, `use_parallel_residual` as `parallel`,
/// untied.
pub fn gpt_neox_config(s: &TinyShape, rotary_pct: f64, parallel: bool) -> Value {
    let mut c = target_config(Architecture::GptNeoX, s, false);
    let map = c.as_object_mut().expect("a config object");
    for key in ["rms_norm_eps", "rope_theta", "num_key_value_heads", "head_dim"] {
        map.remove(key);
    }
    for (key, value) in [
        ("layer_norm_eps", json!(1e-5)),
        ("rotary_pct", json!(rotary_pct)),
        ("rotary_emb_base", json!(10000)),
        ("use_parallel_residual", json!(parallel)),
        ("hidden_act", json!("gelu")),
    ] {
        map.insert(key.into(), value);
    }
    c
}

/// Random weights for a tiny GPT-NeoX under the shared layer's names: Llama's without the
/// MLP's gate, with a bias on every projection and norm (see [`as_gpt_neox`] for the
/// checkpoint's own). `s.kv_heads` must equal `s.heads` and `s.hidden` span them.
pub fn random_gpt_neox(s: &TinyShape, seed: u64) -> Result<HashMap<String, Tensor>> {
    assert!(s.kv_heads == s.heads && s.hidden == s.heads * s.head_dim, "GPT-NeoX's heads span the hidden size");
    let mut t = random_starcoder2(s, seed)?;
    t.remove("lm_head.weight");
    t.insert("lm_head.weight".into(), random_tensor(&[s.vocab, s.hidden], 0.3, seed * 7 + 1)?);
    Ok(t)
}

/// A GPT-NeoX checkpoint's own names: `gpt_neox.` prefixes, `embed_in` / `embed_out`,
/// `final_layer_norm`, `attention.dense`, `mlp.dense_h_to_4h` / `dense_4h_to_h`, and q, k and v
/// fused head by head into `attention.query_key_value`.
pub fn as_gpt_neox(tensors: &HashMap<String, Tensor>, s: &TinyShape) -> Result<HashMap<String, Tensor>> {
    // A [q, k, v] group per head.
    renamed_with_fused_qkv(
        tensors,
        s,
        &[("model.embed_tokens.weight", "gpt_neox.embed_in.weight"), ("lm_head.weight", "embed_out.weight")],
        &[
            ("model.norm.", "gpt_neox.final_layer_norm."),
            ("model.layers.", "gpt_neox.layers."),
            (".self_attn.o_proj.", ".attention.dense."),
            (".mlp.up_proj.", ".mlp.dense_h_to_4h."),
            (".mlp.down_proj.", ".mlp.dense_4h_to_h."),
        ],
        "attention.query_key_value",
    )
}

/// How a tiny Falcon lays out its layers: `new_decoder_architecture` (KV groups of
/// `num_kv_heads`), else multi-query where the shape has one KV head and a group per head
/// otherwise; attention beside the MLP (`parallel_attn`) from one norm or (`two_norms`, the new
/// layout's `ln_attn` / `ln_mlp`) two; `bias` on every projection.
#[derive(Debug, Clone, Copy)]
pub struct FalconLayout {
    pub new_decoder_architecture: bool,
    pub parallel_attn: bool,
    pub two_norms: bool,
    pub bias: bool,
}

impl FalconLayout {
    /// The shared layer reads a norm before the MLP: Falcon's `ln_mlp` or, one after the
    /// other, its `post_attention_layernorm`.
    pub fn has_mlp_norm(&self) -> bool {
        self.two_norms || !self.parallel_attn
    }
}

/// A Falcon `config.json` for a tiny target in `layout`, with `FalconConfig`'s own keys
/// (`num_kv_heads`, `multi_query`, `ffn_hidden_size`, `layer_norm_epsilon`, `bias`) and its
/// defaults elsewhere (tied embeddings, `activation` unset: GELU).
pub fn falcon_config(s: &TinyShape, layout: FalconLayout) -> Value {
    assert_eq!(s.hidden, s.heads * s.head_dim, "Falcon's heads span the hidden size");
    assert!(
        layout.new_decoder_architecture || s.kv_heads == 1 || s.kv_heads == s.heads,
        "the first layout is multi-query or one group per head"
    );
    json!({
        "architectures": [Architecture::Falcon.hf_name()],
        "model_type": "falcon",
        "vocab_size": s.vocab,
        "hidden_size": s.hidden,
        "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads,
        "num_kv_heads": s.kv_heads,
        "multi_query": s.kv_heads == 1,
        "new_decoder_architecture": layout.new_decoder_architecture,
        "parallel_attn": layout.parallel_attn,
        "num_ln_in_parallel_attn": if layout.two_norms { 2 } else { 1 },
        "ffn_hidden_size": s.intermediate,
        "layer_norm_epsilon": 1e-5,
        "bias": layout.bias,
        "alibi": false,
        "rope_theta": 10000.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
    })
}

/// Random weights for a tiny Falcon under the shared layer's names: Llama's without the MLP's
/// gate or `lm_head` (tied), LayerNorms with bias, the norm before the MLP only where
/// `layout` has one, biases on the projections where it says (see [`as_falcon`] for the
/// checkpoint's own names).
pub fn random_falcon(s: &TinyShape, layout: FalconLayout, seed: u64) -> Result<HashMap<String, Tensor>> {
    let mut t = random_target(Architecture::Llama, s, true, seed)?;
    t.retain(|name, _| {
        !name.ends_with("mlp.gate_proj.weight") && (layout.has_mlp_norm() || !name.contains("post_attention_layernorm"))
    });
    let (h, q, kv) = (s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim);
    let mut per_layer = vec![("input_layernorm", h)];
    if layout.has_mlp_norm() {
        per_layer.push(("post_attention_layernorm", h));
    }
    if layout.bias {
        per_layer.extend([
            ("self_attn.q_proj", q),
            ("self_attn.k_proj", kv),
            ("self_attn.v_proj", kv),
            ("self_attn.o_proj", h),
            ("mlp.up_proj", s.intermediate),
            ("mlp.down_proj", h),
        ]);
    }
    insert_random_biases(&mut t, s.layers, &per_layer, &[("model.norm.bias", h)], seed * 1000)?;
    Ok(t)
}

/// A Falcon checkpoint's own names: `transformer.` prefixes, `word_embeddings`, `ln_f`, the
/// norms as `input_layernorm` / `post_attention_layernorm` or (`two_norms`) `ln_attn` /
/// `ln_mlp`, `self_attention.dense`, `mlp.dense_h_to_4h` / `dense_4h_to_h`, and q, k and v
/// fused group by group into `self_attention.query_key_value` (each KV group's query heads,
/// then its key head, then its value head).
pub fn as_falcon(
    tensors: &HashMap<String, Tensor>,
    s: &TinyShape,
    layout: FalconLayout,
) -> Result<HashMap<String, Tensor>> {
    let (attention_norm, mlp_norm) =
        if layout.two_norms { (".ln_attn.", ".ln_mlp.") } else { (".input_layernorm.", ".post_attention_layernorm.") };
    renamed_with_fused_qkv(
        tensors,
        s,
        &[("model.embed_tokens.weight", "transformer.word_embeddings.weight")],
        &[
            ("model.norm.", "transformer.ln_f."),
            ("model.layers.", "transformer.h."),
            (".input_layernorm.", attention_norm),
            (".post_attention_layernorm.", mlp_norm),
            (".self_attn.o_proj.", ".self_attention.dense."),
            (".mlp.up_proj.", ".mlp.dense_h_to_4h."),
            (".mlp.down_proj.", ".mlp.dense_4h_to_h."),
        ],
        "self_attention.query_key_value",
    )
}

/// `tensors` under a checkpoint's own names with q, k and v fused group by group (see
/// [`fused_grouped_qkv`]) into each layer's `fused_qkv`: a name `whole` lists maps as it says,
/// any other (the fused ones too) with each `(ours, theirs)` of `parts` replaced in turn.
fn renamed_with_fused_qkv(
    tensors: &HashMap<String, Tensor>,
    s: &TinyShape,
    whole: &[(&str, &str)],
    parts: &[(&str, &str)],
    fused_qkv: &str,
) -> Result<HashMap<String, Tensor>> {
    let rename = |name: &str| match whole.iter().find(|(ours, _)| *ours == name) {
        Some((_, theirs)) => theirs.to_string(),
        None => parts.iter().fold(name.to_string(), |n, (ours, theirs)| n.replace(ours, theirs)),
    };
    let mut out = HashMap::new();
    for (name, t) in tensors {
        if ![".self_attn.q_proj.", ".self_attn.k_proj.", ".self_attn.v_proj."].iter().any(|p| name.contains(p)) {
            out.insert(rename(name), t.clone());
        }
    }
    for i in 0..s.layers {
        for part in ["weight", "bias"] {
            if let Some(fused) = fused_grouped_qkv(tensors, s, i, part)? {
                out.insert(rename(&format!("model.layers.{i}.{fused_qkv}.{part}")), fused);
            }
        }
    }
    Ok(out)
}

/// Layer `layer`'s q, k and v `part` (weight or bias) stacked whole: all q rows, then k, then
/// v (GPT-2's `c_attn` before its transpose, MPT's `Wqkv`, Baichuan's `W_pack`, ChatGLM's
/// `query_key_value`).
fn stacked_qkv(tensors: &HashMap<String, Tensor>, layer: usize, part: &str) -> Result<Tensor> {
    let get = |p: &str| tensors[&format!("model.layers.{layer}.self_attn.{p}_proj.{part}")].clone();
    Tensor::cat(&[get("q"), get("k"), get("v")], 0)
}

/// Layer `layer`'s q, k and v `part` (weight or bias) fused group by group: each KV group's
/// query heads, then its key head, then its value head (Falcon's `query_key_value`,
/// GPT-BigCode's `c_attn`); `None` where the projections have no such part.
fn fused_grouped_qkv(
    tensors: &HashMap<String, Tensor>,
    s: &TinyShape,
    layer: usize,
    part: &str,
) -> Result<Option<Tensor>> {
    let get = |p: &str| tensors.get(&format!("model.layers.{layer}.self_attn.{p}_proj.{part}")).cloned();
    let (Some(q), Some(k), Some(v)) = (get("q"), get("k"), get("v")) else { return Ok(None) };
    // [kv_heads, heads_in_group, d, ...]: each group's queries, then its key and value.
    let grouped = |t: Tensor, heads: usize| -> Result<Tensor> {
        let mut dims = vec![s.kv_heads, heads, s.head_dim];
        dims.extend_from_slice(&t.dims()[1..]);
        t.reshape(dims)
    };
    let fused = Tensor::cat(&[grouped(q, s.heads / s.kv_heads)?, grouped(k, 1)?, grouped(v, 1)?], 1)?;
    let rows = (s.heads + 2 * s.kv_heads) * s.head_dim;
    Ok(Some(match part {
        "weight" => fused.reshape((rows, s.hidden))?,
        _ => fused.reshape(rows)?,
    }))
}

/// A GPT-BigCode `config.json` for a tiny target with GPT-2's keys (`n_embd`, `n_head`,
/// `n_layer`, `n_positions`, `n_inner`, `activation_function`), multi-query where the shape has
/// one KV head (else a `[q, k, v]` group per head), tied embeddings.
pub fn gpt_bigcode_config(s: &TinyShape, n_positions: usize) -> Value {
    assert_eq!(s.hidden, s.heads * s.head_dim, "GPT-BigCode's heads span the hidden size");
    assert!(s.kv_heads == 1 || s.kv_heads == s.heads, "multi-query, or one group per head");
    json!({
        "architectures": [Architecture::GptBigCode.hf_name()],
        "model_type": "gpt_bigcode",
        "vocab_size": s.vocab,
        "n_embd": s.hidden,
        "n_head": s.heads,
        "n_layer": s.layers,
        "n_positions": n_positions,
        "n_inner": s.intermediate,
        "multi_query": s.kv_heads == 1,
        "activation_function": "gelu_pytorch_tanh",
        "layer_norm_epsilon": 1e-5,
        "scale_attn_weights": true,
        "bos_token_id": 1,
        "eos_token_id": 2,
    })
}

/// Random weights for a tiny GPT-BigCode under the shared layer's names: StarCoder2's (biases
/// everywhere, LayerNorms with bias, no gate) tied, plus `n_positions` learned position rows
/// (`model.embed_positions.weight`; see [`as_gpt_bigcode`] for the checkpoint's own names).
pub fn random_gpt_bigcode(s: &TinyShape, n_positions: usize, seed: u64) -> Result<HashMap<String, Tensor>> {
    let mut t = random_starcoder2(s, seed)?;
    t.remove("lm_head.weight");
    t.insert("model.embed_positions.weight".into(), random_tensor(&[n_positions, s.hidden], 0.3, seed * 7 + 3)?);
    Ok(t)
}

/// A GPT-BigCode checkpoint's own names: `transformer.` prefixes, `wte` / `wpe`, `ln_1` /
/// `ln_2` / `ln_f`, `attn.c_proj`, `mlp.c_fc` / `mlp.c_proj`, and q, k and v fused into
/// `attn.c_attn` (all queries, then the key and value heads; a `[q, k, v]` group per head
/// without multi-query).
pub fn as_gpt_bigcode(tensors: &HashMap<String, Tensor>, s: &TinyShape) -> Result<HashMap<String, Tensor>> {
    renamed_with_fused_qkv(
        tensors,
        s,
        &[
            ("model.embed_tokens.weight", "transformer.wte.weight"),
            ("model.embed_positions.weight", "transformer.wpe.weight"),
        ],
        &[
            ("model.norm.", "transformer.ln_f."),
            ("model.layers.", "transformer.h."),
            (".input_layernorm.", ".ln_1."),
            (".post_attention_layernorm.", ".ln_2."),
            (".self_attn.o_proj.", ".attn.c_proj."),
            (".mlp.up_proj.", ".mlp.c_fc."),
            (".mlp.down_proj.", ".mlp.c_proj."),
        ],
        "attn.c_attn",
    )
}

/// A GPT-2 `config.json` for a tiny target (`n_embd`, `n_head`, `n_layer`, `n_positions`,
/// `n_inner`, `activation_function: gelu_new`), tied embeddings.
pub fn gpt2_config(s: &TinyShape, n_positions: usize) -> Value {
    assert!(s.kv_heads == s.heads, "GPT-2 keeps a KV head per query head");
    let mut c = gpt_bigcode_config(s, n_positions);
    let map = c.as_object_mut().expect("a config object");
    map.remove("multi_query");
    map.insert("architectures".into(), json!([Architecture::Gpt2.hf_name()]));
    map.insert("model_type".into(), json!("gpt2"));
    map.insert("activation_function".into(), json!("gelu_new"));
    c
}

/// A GPT-2 checkpoint's own names under `root` (`transformer.`, or nothing as the first
/// checkpoints saved them): `wte` / `wpe`, `ln_1` / `ln_2` / `ln_f`, and every projection a
/// Conv1D stored `[in, out]`: `attn.c_attn` (q, k and v side by side), `attn.c_proj`,
/// `mlp.c_fc`, `mlp.c_proj`.
pub fn as_gpt2(tensors: &HashMap<String, Tensor>, s: &TinyShape, root: &str) -> Result<HashMap<String, Tensor>> {
    let mut out = HashMap::new();
    for (name, t) in as_gpt_bigcode(tensors, s)? {
        let t = if name.ends_with(".weight") && (name.contains(".attn.") || name.contains(".mlp.")) {
            t.t()?.contiguous()?
        } else {
            t
        };
        out.insert(name.replacen("transformer.", root, 1), t);
    }
    // GPT-2's c_attn holds all of q, then k, then v (GPT-BigCode's without multi-query a
    // group per head).
    for i in 0..s.layers {
        let (weight, bias) = (stacked_qkv(tensors, i, "weight")?, stacked_qkv(tensors, i, "bias")?);
        out.insert(format!("{root}h.{i}.attn.c_attn.weight"), weight.t()?.contiguous()?);
        out.insert(format!("{root}h.{i}.attn.c_attn.bias"), bias);
    }
    Ok(out)
}

/// A BLOOM `config.json` for a tiny target with `BloomConfig`'s own keys (`n_embed`,
/// `n_layer`, `n_head`, `layer_norm_epsilon`) and no intermediate size (BLOOM's MLP is 4 ×
/// hidden, so `s.intermediate` must be that), tied embeddings as BLOOM's are.
pub fn bloom_config(s: &TinyShape) -> Value {
    assert!(s.kv_heads == s.heads && s.hidden == s.heads * s.head_dim, "BLOOM's heads span the hidden size");
    assert_eq!(s.intermediate, 4 * s.hidden, "BLOOM's MLP is 4 × hidden wide");
    json!({
        "architectures": [Architecture::Bloom.hf_name()], "model_type": "bloom",
        "n_embed": s.hidden, "n_layer": s.layers, "n_head": s.heads, "vocab_size": s.vocab,
        "layer_norm_epsilon": 1e-5, "apply_residual_connection_post_layernorm": false,
        "pretraining_tp": 1, "slow_but_exact": false, "bos_token_id": 1, "eos_token_id": 2,
    })
}

/// Random weights for a tiny BLOOM under the shared layer's names: GPT-NeoX's (biases on
/// every projection and norm) with the embedding's LayerNorm (`model.embed_norm`) and no
/// `lm_head` (tied).
pub fn random_bloom(s: &TinyShape, seed: u64) -> Result<HashMap<String, Tensor>> {
    let mut t = random_gpt_neox(s, seed)?;
    t.remove("lm_head.weight");
    let norm = (random_tensor(&[s.hidden], 0.2, seed * 11 + 3)? + 1.0)?;
    t.insert("model.embed_norm.weight".into(), norm);
    t.insert("model.embed_norm.bias".into(), random_tensor(&[s.hidden], 0.2, seed * 11 + 5)?);
    Ok(t)
}

/// A BLOOM checkpoint's own names under `root` (`transformer.`, or nothing as BigScience saved
/// the base model): `word_embeddings`, `word_embeddings_layernorm`, `h.{i}`,
/// `self_attention.dense`, `mlp.dense_h_to_4h` / `dense_4h_to_h`, `ln_f`, and q, k and v fused
/// head by head into `self_attention.query_key_value`.
pub fn as_bloom(tensors: &HashMap<String, Tensor>, s: &TinyShape, root: &str) -> Result<HashMap<String, Tensor>> {
    // A [q, k, v] group per head.
    let named = renamed_with_fused_qkv(
        tensors,
        s,
        &[("model.embed_tokens.weight", "transformer.word_embeddings.weight")],
        &[
            ("model.embed_norm.", "transformer.word_embeddings_layernorm."),
            ("model.norm.", "transformer.ln_f."),
            ("model.layers.", "transformer.h."),
            (".self_attn.o_proj.", ".self_attention.dense."),
            (".mlp.up_proj.", ".mlp.dense_h_to_4h."),
            (".mlp.down_proj.", ".mlp.dense_4h_to_h."),
        ],
        "self_attention.query_key_value",
    )?;
    Ok(named.into_iter().map(|(name, t)| (name.replacen("transformer.", root, 1), t)).collect())
}

/// An MPT `config.json` for a tiny target with `MptConfig`'s own keys (`d_model`, `n_heads`,
/// `n_layers`, `expansion_ratio`, `max_seq_len`, `no_bias`, and in `attn_config` ALiBi of
/// `alibi_bias_max` and `clip_qkv`); `s.intermediate` must be a whole multiple of the hidden
/// size.
pub fn mpt_config(s: &TinyShape, alibi_bias_max: f64, clip_qkv: Option<f64>) -> Value {
    assert!(s.kv_heads == s.heads && s.hidden == s.heads * s.head_dim, "MPT's heads span the hidden size");
    assert!(s.intermediate.is_multiple_of(s.hidden), "MPT's MLP is expansion_ratio × d_model wide");
    json!({
        "architectures": ["MPTForCausalLM"], "model_type": "mpt",
        "d_model": s.hidden, "n_heads": s.heads, "n_layers": s.layers, "expansion_ratio": s.intermediate / s.hidden,
        "max_seq_len": 512, "vocab_size": s.vocab, "no_bias": true, "norm_type": "low_precision_layernorm",
        "layer_norm_epsilon": 1e-5, "learned_pos_emb": true,
        "attn_config": {
            "attn_type": "multihead_attention", "alibi": true, "alibi_bias_max": alibi_bias_max,
            "clip_qkv": clip_qkv, "qk_ln": false, "softmax_scale": null, "prefix_lm": false,
        },
    })
}

/// Random weights for a tiny MPT under the shared layer's names: Llama's without the MLP's
/// gate and without `lm_head` (tied); no biases anywhere.
pub fn random_mpt(s: &TinyShape, seed: u64) -> Result<HashMap<String, Tensor>> {
    let mut t = random_target(Architecture::Llama, s, true, seed)?;
    t.retain(|name, _| !name.ends_with("mlp.gate_proj.weight"));
    Ok(t)
}

/// An MPT checkpoint's own names: `transformer.wte`, `transformer.blocks.{i}` with `norm_1`,
/// `attn.Wqkv` (q, k and v stacked), `attn.out_proj`, `norm_2`, `ffn.up_proj` /
/// `ffn.down_proj`, and `transformer.norm_f`.
pub fn as_mpt(tensors: &HashMap<String, Tensor>, s: &TinyShape) -> Result<HashMap<String, Tensor>> {
    let mut out = HashMap::new();
    for (name, t) in tensors {
        if [".self_attn.q_proj.", ".self_attn.k_proj.", ".self_attn.v_proj."].iter().any(|p| name.contains(p)) {
            continue;
        }
        let renamed = [
            ("model.embed_tokens.", "transformer.wte."),
            ("model.norm.", "transformer.norm_f."),
            ("model.layers.", "transformer.blocks."),
            (".input_layernorm.", ".norm_1."),
            (".post_attention_layernorm.", ".norm_2."),
            (".self_attn.o_proj.", ".attn.out_proj."),
            (".mlp.", ".ffn."),
        ]
        .iter()
        .fold(name.clone(), |n, (ours, theirs)| n.replace(ours, theirs));
        out.insert(renamed, t.clone());
    }
    for i in 0..s.layers {
        out.insert(format!("transformer.blocks.{i}.attn.Wqkv.weight"), stacked_qkv(tensors, i, "weight")?);
    }
    Ok(out)
}

/// A Baichuan `config.json` for a tiny target of class `class` (`BaiChuanForCausalLM`:
/// Baichuan-7B, which turns RoPE; `BaichuanForCausalLM` at this size: a 13B model's ALiBi),
/// its context as the 13B models give it (`model_max_length`), untied.
pub fn baichuan_config(s: &TinyShape, class: &str) -> Value {
    assert!(s.kv_heads == s.heads, "Baichuan keeps a KV head per head");
    let mut c = target_config(Architecture::Baichuan, s, false);
    let map = c.as_object_mut().expect("a config object");
    map.remove("max_position_embeddings");
    map.insert("architectures".into(), json!([class]));
    map.insert("model_max_length".into(), json!(512));
    c
}

/// A Baichuan checkpoint's own names: Llama's, with each layer's q, k and v stacked in
/// `self_attn.W_pack`.
pub fn as_baichuan(tensors: &HashMap<String, Tensor>, s: &TinyShape) -> Result<HashMap<String, Tensor>> {
    let mut out: HashMap<String, Tensor> = tensors
        .iter()
        .filter(|(name, _)| !["q_proj", "k_proj", "v_proj"].iter().any(|p| name.contains(&format!(".{p}."))))
        .map(|(name, t)| (name.clone(), t.clone()))
        .collect();
    for i in 0..s.layers {
        out.insert(format!("model.layers.{i}.self_attn.W_pack.weight"), stacked_qkv(tensors, i, "weight")?);
    }
    Ok(out)
}

/// A tiny `GlmForCausalLM` config: GLM-4-0414's ([`glm4_config`]) under the first port's
/// class.
pub fn glm_config(s: &TinyShape) -> Value {
    let mut c = glm4_config(s);
    c["architectures"] = json!([Architecture::Glm.hf_name()]);
    c["model_type"] = json!("glm");
    c
}

/// Random `GlmForCausalLM` weights as its checkpoints name them: [`random_glm4`]'s without
/// the norms after attention and MLP.
pub fn random_glm(s: &TinyShape, seed: u64) -> Result<HashMap<String, Tensor>> {
    let mut t = random_glm4(s, seed)?;
    t.retain(|name, _| !name.contains(".post_self_attn_layernorm.") && !name.contains(".post_mlp_layernorm."));
    Ok(t)
}

/// A ChatGLM `config.json` (ChatGLM3 / GLM-4-9B's keys) for a tiny target: multi-query
/// groups where the shape has fewer KV heads, q/k/v biases, RoPE's base times `rope_ratio`.
pub fn chatglm_config(s: &TinyShape, rope_ratio: f64) -> Value {
    json!({
        "architectures": ["ChatGLMModel"], "model_type": "chatglm",
        "hidden_size": s.hidden, "ffn_hidden_size": s.intermediate, "num_layers": s.layers,
        "num_attention_heads": s.heads, "kv_channels": s.head_dim,
        "multi_query_attention": s.kv_heads < s.heads, "multi_query_group_num": s.kv_heads,
        "padded_vocab_size": s.vocab, "seq_length": 512, "layernorm_epsilon": 1e-5, "rmsnorm": true,
        "add_qkv_bias": true, "add_bias_linear": false, "apply_residual_connection_post_layernorm": false,
        "post_layer_norm": true, "original_rope": true, "rope_ratio": rope_ratio, "tie_word_embeddings": false,
        "eos_token_id": s.vocab - 1,
    })
}

/// [`random_glm`]'s weights under ChatGLM's names, q, k and v stacked (weights and biases) in
/// `self_attention.query_key_value`.
pub fn as_chatglm(tensors: &HashMap<String, Tensor>, s: &TinyShape) -> Result<HashMap<String, Tensor>> {
    let mut out = HashMap::new();
    for (name, t) in tensors {
        if [".q_proj.", ".k_proj.", ".v_proj."].iter().any(|p| name.contains(p)) {
            continue;
        }
        let renamed = match name.as_str() {
            "model.embed_tokens.weight" => "transformer.embedding.word_embeddings.weight".to_string(),
            "model.norm.weight" => "transformer.encoder.final_layernorm.weight".to_string(),
            "lm_head.weight" => "transformer.output_layer.weight".to_string(),
            _ => name
                .replace("model.layers.", "transformer.encoder.layers.")
                .replace(".self_attn.o_proj.", ".self_attention.dense.")
                .replace(".mlp.gate_up_proj.", ".mlp.dense_h_to_4h.")
                .replace(".mlp.down_proj.", ".mlp.dense_4h_to_h."),
        };
        out.insert(renamed, t.clone());
    }
    for i in 0..s.layers {
        for part in ["weight", "bias"] {
            let fused = stacked_qkv(tensors, i, part)?;
            out.insert(format!("transformer.encoder.layers.{i}.self_attention.query_key_value.{part}"), fused);
        }
    }
    Ok(out)
}

/// An Apertus `config.json` for a tiny target (`hidden_act: xielu`).
pub fn apertus_config(s: &TinyShape) -> Value {
    let mut c = target_config(Architecture::Apertus, s, false);
    c["hidden_act"] = json!("xielu");
    c["attention_bias"] = json!(false);
    c
}

/// Random weights for a tiny Apertus under the shared layer's names: Qwen3's (per-head q/k
/// norms) without the MLP's gate, and every layer's xIELU parameters as transformers stores
/// them (`mlp.act_fn.alpha_p` / `alpha_n` before their softplus, `beta` and `eps`, one value
/// each), different in each layer.
pub fn random_apertus(s: &TinyShape, seed: u64) -> Result<HashMap<String, Tensor>> {
    let mut t = random_target(Architecture::Qwen3, s, false, seed)?;
    t.retain(|name, _| !name.ends_with("mlp.gate_proj.weight"));
    for i in 0..s.layers {
        let layer = i as f32;
        for (name, value) in
            [("alpha_p", -0.4 + 0.3 * layer), ("alpha_n", 0.2 - 0.5 * layer), ("beta", 0.5), ("eps", -1e-6)]
        {
            t.insert(format!("model.layers.{i}.mlp.act_fn.{name}"), Tensor::new(&[value], &Device::Cpu)?);
        }
    }
    Ok(t)
}

/// An Apertus checkpoint's own names: Llama's pre-norms as `attention_layernorm` and
/// `feedforward_layernorm`.
pub fn as_apertus(tensors: &HashMap<String, Tensor>) -> HashMap<String, Tensor> {
    tensors
        .iter()
        .map(|(name, t)| {
            let name = name
                .replace(".input_layernorm.", ".attention_layernorm.")
                .replace(".post_attention_layernorm.", ".feedforward_layernorm.");
            (name, t.clone())
        })
        .collect()
}
