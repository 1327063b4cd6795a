//! Nemotron (`NemotronForCausalLM`) on a tiny checkpoint in its real layout: LayerNorm1P (a
//! LayerNorm with bias scaling by `1 + weight`), RoPE over half of each head and a relu² MLP
//! without a gate, matching transformers' forward (`common::Reference`) in one prefill and token
//! by token; its `nemotron` GGUF (norms stored as their scale, q/k rows as they are) loads to
//! the same model.

mod common;

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value as GgufValue;
use candle_core::{Device, Tensor};
use common::{Reference, assert_close, gguf_named, logits, write_gguf};
use specrs_models::testing::{self, TinyShape};
use specrs_models::{Architecture, ModelDType, load_causal_lm};

const SHAPE: TinyShape =
    TinyShape { vocab: 40, hidden: 32, layers: 3, heads: 4, kv_heads: 2, head_dim: 8, intermediate: 48 };

fn reference(tensors: &HashMap<String, Tensor>, layer_norm_1p: bool) -> Reference<'_> {
    Reference {
        rotary: SHAPE.head_dim / 2,
        factors: vec![1.0; SHAPE.head_dim / 4],
        centered_norms: true,
        layer_norm_1p,
        ..Reference::plain(tensors, SHAPE)
    }
}

#[test]
fn layer_norm_1p_half_rope_and_a_relu_squared_mlp_match_the_transformers_forward_and_the_gguf() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = testing::random_nemotron(&SHAPE, 71).unwrap();
    testing::write_checkpoint(dir.path(), &testing::nemotron_config(&SHAPE), &tensors).unwrap();
    let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
    let cfg = model.config();
    assert_eq!((cfg.architecture, cfg.rotary_dim), (Architecture::Nemotron, SHAPE.head_dim / 2));
    assert!(cfg.norms_add_one() && cfg.norms_have_bias() && !cfg.mlp_is_gated());
    let ids: Vec<u32> = (0..10).map(|i| (i * 7 + 2) % 40).collect();
    let want = reference(&tensors, true).logits(&ids);
    assert_close(&logits(&model, &ids, false), &want, "one prefill");
    assert_close(&logits(&model, &ids, true), &want, "token by token");
    // The `1 +` matters: the stored weights as the scale give other logits.
    let plain = reference(&tensors, false).logits(&ids);
    let diff = plain.iter().flatten().zip(want.iter().flatten()).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(diff > 1e-3, "LayerNorm1P reads as a plain LayerNorm");

    // llama.cpp's converter adds one to each norm weight.
    let named = gguf_named(&tensors, |_| false, true);
    let path = dir.path().join("nemotron.gguf");
    let extra = [
        ("nemotron.attention.layer_norm_epsilon", GgufValue::F32(1e-5)),
        ("nemotron.rope.dimension_count", GgufValue::U32((SHAPE.head_dim / 2) as u32)),
    ];
    write_gguf(&path, "nemotron", &SHAPE, &named, &extra);
    let (gguf, _) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).unwrap();
    assert!(!gguf.config().norms_add_one());
    assert_close(&logits(&gguf, &ids, false), &want, "the nemotron GGUF");
}
