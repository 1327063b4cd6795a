//! Gemma (`GemmaForCausalLM`) on a tiny checkpoint in its real layout: Llama's pre-norm layer
//! with norms scaling by `1 + weight`, GeGLU (the first configs' `hidden_act: gelu` read as
//! transformers runs it, tanh GELU), embeddings times `sqrt(hidden)` and a tied head, matching
//! transformers' forward (`common::Reference`) in one prefill and token by token; its `gemma`
//! GGUF (norms stored as their scale) loads to the same model.

mod common;

use candle_core::Device;
use common::{GemmaLayout, Reference, assert_close, gguf_named, logits, write_gguf};
use specrs_models::config::NormPlacement;
use specrs_models::testing::{self, TinyShape};
use specrs_models::{Architecture, ModelDType, load_causal_lm};

const SHAPE: TinyShape =
    TinyShape { vocab: 40, hidden: 32, layers: 3, heads: 4, kv_heads: 1, head_dim: 16, intermediate: 48 };

#[test]
fn gemma_norms_geglu_and_scaled_embeddings_match_the_transformers_forward_and_the_gguf() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = testing::random_gemma(&SHAPE, 67).unwrap();
    testing::write_checkpoint(dir.path(), &testing::gemma_config(&SHAPE), &tensors).unwrap();
    let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
    let cfg = model.config();
    assert_eq!((cfg.architecture, cfg.norm_placement()), (Architecture::Gemma, NormPlacement::Pre));
    assert!(cfg.norms_add_one() && cfg.tie_word_embeddings && cfg.sliding_window.is_none());
    assert_eq!(cfg.scales.embedding, (SHAPE.hidden as f64).sqrt());
    let reference = Reference {
        gemma: Some(GemmaLayout {
            sliding: vec![false; SHAPE.layers],
            window: 0,
            local_theta: 10_000.0,
            scale: (SHAPE.head_dim as f32).powf(-0.5),
            softcaps: None,
        }),
        ..Reference::plain(&tensors, SHAPE)
    };
    let ids: Vec<u32> = (0..10).map(|i| (i * 3 + 7) % 40).collect();
    let want = reference.logits(&ids);
    assert_close(&logits(&model, &ids, false), &want, "one prefill");
    assert_close(&logits(&model, &ids, true), &want, "token by token");

    // llama.cpp's converter keeps q/k rows (NeoX RoPE), Llama's norm names (`ffn_norm` before
    // the MLP) and stores each norm as its scale.
    let named = gguf_named(&tensors, |_| false, true);
    let path = dir.path().join("gemma.gguf");
    write_gguf(&path, "gemma", &SHAPE, &named, &[]);
    let (gguf, _) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).unwrap();
    assert_eq!((gguf.config().architecture, gguf.config().norm_placement()), (Architecture::Gemma, NormPlacement::Pre));
    assert_close(&logits(&gguf, &ids, false), &want, "the gemma GGUF");
}
