//! GPT-NeoX (`GPTNeoXForCausalLM`, Pythia) on tiny checkpoints in its real layout: q, k and v
//! fused head by head, RoPE over `rotary_pct` of each head, biases everywhere, an exact-GELU
//! MLP without a gate, and attention beside the MLP each from its own LayerNorm
//! (`use_parallel_residual`) or one after the other, matching transformers' forward
//! (`common::Reference`) in one prefill and token by token; other activations are refused by
//! key.

mod common;

use std::collections::HashMap;

use candle_core::{Device, Tensor};
use common::{Reference, assert_close, logits};
use serde_json::json;
use specrs_models::config::NormPlacement;
use specrs_models::testing::{self, TinyShape};
use specrs_models::{Architecture, DecoderConfig, ModelDType, load_causal_lm};

const SHAPE: TinyShape =
    TinyShape { vocab: 40, hidden: 32, layers: 3, heads: 4, kv_heads: 4, head_dim: 8, intermediate: 48 };
/// Half of each 8-dim head turns.
const ROTARY: usize = 4;

fn reference(tensors: &HashMap<String, Tensor>, parallel: bool, exact_gelu: bool) -> Reference<'_> {
    Reference {
        rotary: ROTARY,
        factors: vec![1.0; ROTARY / 2],
        centered_norms: true,
        ungated_gelu: true,
        exact_gelu,
        parallel,
        parallel_mlp_norm: parallel,
        ..Reference::plain(tensors, SHAPE)
    }
}

#[test]
fn fused_heads_partial_rope_and_parallel_or_sequential_blocks_match_the_transformers_forward() {
    for parallel in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let tensors = testing::random_gpt_neox(&SHAPE, 73).unwrap();
        let on_disk = testing::as_gpt_neox(&tensors, &SHAPE).unwrap();
        testing::write_checkpoint(dir.path(), &testing::gpt_neox_config(&SHAPE, 0.5, parallel), &on_disk).unwrap();
        let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
        let cfg = model.config();
        assert_eq!((cfg.architecture, cfg.rotary_dim), (Architecture::GptNeoX, ROTARY));
        let placement = if parallel { NormPlacement::Parallel } else { NormPlacement::Pre };
        assert_eq!(cfg.norm_placement(), placement);
        assert!(cfg.attention_bias && cfg.attention_output_bias && cfg.mlp_bias && !cfg.tie_word_embeddings);
        let ids: Vec<u32> = (0..10).map(|i| (i * 7 + 4) % 40).collect();
        let want = reference(&tensors, parallel, true).logits(&ids);
        let what = if parallel { "parallel" } else { "sequential" };
        assert_close(&logits(&model, &ids, false), &want, what);
        assert_close(&logits(&model, &ids, true), &want, &format!("{what} token by token"));
        // The exact GELU is what the model runs: the tanh form differs past the tolerance.
        let tanh = reference(&tensors, parallel, false).logits(&ids);
        let diff = tanh.iter().flatten().zip(want.iter().flatten()).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(diff > 2e-4, "{what}: exact and tanh GELU agree to {diff}, within the tolerance");
    }
}

#[test]
fn the_config_reads_pythia_keys_and_refuses_other_activations() {
    let c = DecoderConfig::from_hf_json(&testing::gpt_neox_config(&SHAPE, 0.25, true)).unwrap();
    assert_eq!((c.num_key_value_heads, c.head_dim, c.rotary_dim, c.rope_theta), (4, 8, 2, 10_000.0));
    let mut relu = testing::gpt_neox_config(&SHAPE, 0.25, true);
    relu["hidden_act"] = json!("relu");
    let e = DecoderConfig::from_hf_json(&relu).unwrap_err().to_string();
    assert!(e.contains("hidden_act") && e.contains("gelu"), "{e}");
}

#[test]
fn the_gptneox_gguf_with_q_k_v_restacked_loads_to_the_same_model() {
    use candle_core::quantized::gguf_file::Value as GgufValue;
    use common::{gguf_fused_qkv, gguf_named, is_q_k_or_v, write_gguf};

    let dir = tempfile::tempdir().unwrap();
    let tensors = testing::random_gpt_neox(&SHAPE, 79).unwrap();
    // llama.cpp's converter restacks each layer's query_key_value as all q rows, then k, then v.
    let mut named = gguf_named(&tensors, is_q_k_or_v, false);
    named.extend(gguf_fused_qkv(&tensors, SHAPE.layers));
    let ids: Vec<u32> = (0..10).map(|i| (i * 7 + 4) % 40).collect();
    for parallel in [true, false] {
        let extra = [
            ("gptneox.attention.layer_norm_epsilon", GgufValue::F32(1e-5)),
            ("gptneox.rope.dimension_count", GgufValue::U32(ROTARY as u32)),
            ("gptneox.use_parallel_residual", GgufValue::Bool(parallel)),
        ];
        let path = dir.path().join(format!("gptneox-{parallel}.gguf"));
        write_gguf(&path, "gptneox", &SHAPE, &named, &extra);
        let (gguf, _) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).unwrap();
        assert_eq!(gguf.config().parallel_residual, parallel);
        let want = reference(&tensors, parallel, true).logits(&ids);
        assert_close(&logits(&gguf, &ids, false), &want, &format!("gptneox GGUF (parallel: {parallel})"));
    }
}
