//! Qwen2-MoE and Qwen3-MoE on tiny checkpoints written in the real formats:
//! - the sparse layers (softmax top-k with and without renormalisation, GLM-4.5's and
//!   dots.llm1's grouped sigmoid choice with its correction bias and scale, experts, Qwen2-MoE's
//!   gated and GLM-4.5's ungated shared expert) and the dense layers kept (`mlp_only_layers`,
//!   `first_k_dense_replace`) match transformers' forward (`common::Reference`), in one prefill
//!   and token by token against the paged cache; experts stored fused load alike;
//! - the same checkpoints as llama.cpp's converter writes them (`qwen2moe` / `qwen3moe`,
//!   `olmoe`, `glm4moe`, `dots1`, Mixtral as `llama`; the experts stacked into one tensor per
//!   projection, or one tensor each in older Mixtral files) load to the same model, in f32 and with
//!   Q8_0 experts read expert by expert from the stacked bytes;
//! - configuration errors name their key.

mod common;

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::{self, Value as GgufValue};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use common::{Choice, Reference, Routing, assert_close, assert_within, batch, llama_cpp_permuted, logits};
use serde_json::json;
use specrs_models::drafters::SequentialDraftModel;
use specrs_models::drafters::mtp::MtpDraft;
use specrs_models::testing::{self, TinyMoe, TinyShape};
use specrs_models::weights::gguf::gguf_name;
use specrs_models::{Architecture, DecoderConfig, ModelDType, Router, SharedExpertConfig, load_causal_lm};

const SHAPE: TinyShape =
    TinyShape { vocab: 40, hidden: 32, layers: 3, heads: 4, kv_heads: 2, head_dim: 8, intermediate: 48 };

fn qwen3_moe(dense_layers: Vec<usize>) -> TinyMoe {
    TinyMoe {
        experts: 4,
        top_k: 2,
        expert_intermediate: 32,
        shared_intermediate: None,
        norm_topk_prob: true,
        dense_layers,
        groups: (1, 1, 1.0),
    }
}

/// Mixtral's routing on the tiny shape: 4 experts, top-2, renormalised, every layer sparse.
fn mixtral() -> TinyMoe {
    TinyMoe { norm_topk_prob: true, ..qwen3_moe(Vec::new()) }
}

/// OLMoE on the tiny shape: every layer sparse, the routed weights as they are.
fn olmoe() -> TinyMoe {
    TinyMoe { norm_topk_prob: false, ..qwen3_moe(Vec::new()) }
}

/// The checkpoint as `arch` names it on disk.
fn on_disk(arch: Architecture, tensors: &HashMap<String, Tensor>, moe: &TinyMoe) -> HashMap<String, Tensor> {
    match arch {
        Architecture::Mixtral => testing::as_mixtral(tensors.clone()),
        Architecture::GraniteMoe => testing::as_granite_moe(tensors.clone(), &SHAPE, moe).unwrap(),
        _ => tensors.clone(),
    }
}

/// Granite MoE's multipliers in these tests: embedding, residual, attention, logits divisor.
const GRANITE_MULTIPLIERS: [f64; 4] = [2.0, 0.5, 0.125, 4.0];

/// GLM-4.5-Air's shape, shrunk: a leading dense layer, 8 experts in 4 groups of which each
/// token may use 2, top-2, weights renormalised and scaled by 2.5, one shared expert.
fn glm45() -> TinyMoe {
    TinyMoe { shared_intermediate: Some(32), dense_layers: vec![0], groups: (4, 2, 2.5), ..TinyMoe::routed(8, 2) }
}

fn qwen2_moe() -> TinyMoe {
    TinyMoe { shared_intermediate: Some(64), norm_topk_prob: false, ..qwen3_moe(Vec::new()) }
}

fn reference(arch: Architecture, tensors: &HashMap<String, Tensor>, moe: &TinyMoe, ids: &[u32]) -> Vec<Vec<f32>> {
    // GLM-4.5 rotates half of each head; it and dots.llm1 route as DeepSeek-V3.
    let rotary = if arch == Architecture::Glm4Moe { SHAPE.head_dim / 2 } else { SHAPE.head_dim };
    let grouped = matches!(arch, Architecture::Glm4Moe | Architecture::Dots1);
    Reference {
        rotary,
        factors: vec![1.0; rotary / 2],
        routing: Some(Routing {
            top_k: moe.top_k,
            norm_topk_prob: moe.norm_topk_prob,
            choice: match grouped {
                true => Choice::GroupedSigmoid(moe.groups.0, moe.groups.1, moe.groups.2),
                false => Choice::Softmax,
            },
        }),
        ..Reference::plain(tensors, SHAPE)
    }
    .logits(ids)
}

fn ids() -> Vec<u32> {
    (0..11).map(|i| (i * 7 + 2) % 40).collect()
}

#[test]
fn sparse_and_dense_layers_match_the_transformers_forward() {
    for (arch, moe) in [
        (Architecture::Qwen3Moe, qwen3_moe(vec![1])),
        (Architecture::Qwen2Moe, qwen2_moe()),
        (Architecture::Glm4Moe, glm45()),
        (Architecture::Dots1, glm45()),
        (Architecture::Mixtral, mixtral()),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let tensors = testing::random_moe_target(arch, &SHAPE, &moe, 5).unwrap();
        let config = testing::moe_target_config(arch, &SHAPE, &moe);
        testing::write_checkpoint(dir.path(), &config, &on_disk(arch, &tensors, &moe)).unwrap();
        let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
        assert_eq!(model.config().architecture, arch);
        let want = reference(arch, &tensors, &moe, &ids());
        assert_close(&logits(&model, &ids(), false), &want, &format!("{arch:?}, one prefill"));
        assert_close(&logits(&model, &ids(), true), &want, &format!("{arch:?}, token by token"));
    }
}

/// Writes `tensors` as llama.cpp's converter writes a `qwen2moe` / `qwen3moe` / `olmoe` /
/// `glm4moe` GGUF (GLM-4.5's pre-MLP norm as `post_attention_norm`, its router as metadata),
/// or Mixtral as `llama` with permuted q/k rows: experts stacked into `ffn_{gate,up,down}_exps`
/// (`[experts, rows, cols]`), or (`stacked: false`) one tensor per expert as files written
/// before llama.cpp stacked them; everything in `dtype` where its rows allow, norms and biases
/// in f32. GLM-4.5's layers of `shape` past those of `SHAPE` are its MTP (`nextn`) layers.
fn write_moe_gguf(
    path: &Path,
    arch: Architecture,
    shape: &TinyShape,
    moe: &TinyMoe,
    tensors: &HashMap<String, Tensor>,
    dtype: GgmlDType,
    stacked: bool,
) {
    let quantize = |t: &Tensor| {
        let dims = t.dims();
        let matrix = dims.len() >= 2 && !dims.last().unwrap().is_multiple_of(32) || dims.len() < 2;
        QTensor::quantize(t, if matrix { GgmlDType::F32 } else { dtype }).unwrap()
    };
    let mut named: Vec<(String, QTensor)> = Vec::new();
    let permuted = matches!(arch, Architecture::Mixtral | Architecture::GraniteMoe);
    for (name, t) in tensors {
        if name.contains(".experts.") {
            continue;
        }
        // llama.cpp keeps the shared expert's gate as a vector, and permutes Llama's q and k.
        let t = if name.ends_with("shared_expert_gate.weight") {
            t.flatten_all().unwrap()
        } else if permuted && name.ends_with("q_proj.weight") {
            llama_cpp_permuted(t, shape.heads)
        } else if permuted && name.ends_with("k_proj.weight") {
            llama_cpp_permuted(t, shape.kv_heads)
        } else {
            t.clone()
        };
        let gguf = match name.strip_suffix(".post_attention_layernorm.weight") {
            Some(layer) if arch == Architecture::Glm4Moe => {
                format!("{}.post_attention_norm.weight", layer.replace("model.layers.", "blk."))
            }
            _ => gguf_name(name).unwrap_or_else(|| panic!("{name} has a GGUF name")),
        };
        named.push((gguf, quantize(&t)));
    }
    for l in (0..shape.layers).filter(|l| !moe.dense_layers.contains(l)) {
        for (proj, short) in [("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "down")] {
            let experts: Vec<Tensor> = (0..moe.experts)
                .map(|e| tensors[&format!("model.layers.{l}.mlp.experts.{e}.{proj}.weight")].clone())
                .collect();
            if stacked {
                named
                    .push((format!("blk.{l}.ffn_{short}_exps.weight"), quantize(&Tensor::stack(&experts, 0).unwrap())));
            } else {
                for (e, t) in experts.iter().enumerate() {
                    named.push((format!("blk.{l}.ffn_{short}.{e}.weight"), quantize(t)));
                }
            }
        }
    }
    let key = match arch {
        Architecture::Mixtral => "llama".to_string(),
        _ => arch.hf_name().trim_end_matches("ForCausalLM").to_lowercase(),
    };
    let u32v = |x: usize| GgufValue::U32(x as u32);
    let mut metadata: Vec<(String, GgufValue)> = vec![
        ("general.architecture".into(), GgufValue::String(key.clone())),
        (format!("{key}.embedding_length"), u32v(shape.hidden)),
        (format!("{key}.block_count"), u32v(shape.layers)),
        (format!("{key}.attention.head_count"), u32v(shape.heads)),
        (format!("{key}.attention.head_count_kv"), u32v(shape.kv_heads)),
        (format!("{key}.attention.key_length"), u32v(shape.head_dim)),
        (format!("{key}.context_length"), u32v(512)),
        (format!("{key}.attention.layer_norm_rms_epsilon"), GgufValue::F32(1e-5)),
        (format!("{key}.rope.freq_base"), GgufValue::F32(10_000.0)),
        (format!("{key}.vocab_size"), u32v(shape.vocab)),
        (format!("{key}.expert_count"), u32v(moe.experts)),
        (format!("{key}.expert_used_count"), u32v(moe.top_k)),
        (format!("{key}.expert_feed_forward_length"), u32v(moe.expert_intermediate)),
    ];
    let dense_width = if moe.dense_layers.is_empty() { moe.expert_intermediate } else { shape.intermediate };
    metadata.push((format!("{key}.feed_forward_length"), u32v(dense_width)));
    if matches!(arch, Architecture::Glm4Moe | Architecture::Dots1) {
        let (n_group, topk_group, scale) = moe.groups;
        let rotary = if arch == Architecture::Glm4Moe { shape.head_dim / 2 } else { shape.head_dim };
        metadata.extend([
            (format!("{key}.rope.dimension_count"), u32v(rotary)),
            (format!("{key}.leading_dense_block_count"), u32v(moe.dense_layers.len())),
            (format!("{key}.nextn_predict_layers"), u32v(shape.layers - SHAPE.layers)),
            (format!("{key}.expert_shared_count"), u32v(moe.shared_intermediate.unwrap() / moe.expert_intermediate)),
            (format!("{key}.expert_weights_scale"), GgufValue::F32(scale as f32)),
            (format!("{key}.expert_weights_norm"), GgufValue::Bool(moe.norm_topk_prob)),
            (format!("{key}.expert_group_count"), u32v(n_group)),
            (format!("{key}.expert_group_used_count"), u32v(topk_group)),
            (format!("{key}.expert_gating_func"), u32v(2)),
        ]);
    } else if let Some(w) = moe.shared_intermediate {
        metadata.push((format!("{key}.expert_shared_feed_forward_length"), u32v(w)));
    }
    if arch == Architecture::GraniteMoe {
        let [embedding, residual, attention, logits] = GRANITE_MULTIPLIERS.map(|m| GgufValue::F32(m as f32));
        for (name, value) in [
            ("embedding_scale", embedding),
            ("residual_scale", residual),
            ("attention.scale", attention),
            ("logit_scale", logits),
        ] {
            metadata.push((format!("{key}.{name}"), value));
        }
    }
    let metadata: Vec<(&str, &GgufValue)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let named: Vec<(&str, &QTensor)> = named.iter().map(|(n, t)| (n.as_str(), t)).collect();
    gguf_file::write(&mut std::fs::File::create(path).unwrap(), &metadata, &named).unwrap();
}

#[test]
fn gguf_mixtures_load_expert_by_expert_to_the_same_model() {
    // llama.cpp runs every layer sparse, and renormalises Qwen3-MoE's and Mixtral's weights.
    for (arch, moe) in [
        (Architecture::Qwen3Moe, qwen3_moe(Vec::new())),
        (Architecture::Qwen2Moe, qwen2_moe()),
        (Architecture::Mixtral, mixtral()),
        (Architecture::GraniteMoe, TinyMoe { shared_intermediate: Some(32), ..mixtral() }),
        (Architecture::Olmoe, olmoe()),
        (Architecture::Glm4Moe, glm45()),
        (Architecture::Dots1, glm45()),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let tensors = match arch {
            Architecture::Olmoe => testing::random_olmoe(&SHAPE, &moe, 9).unwrap(),
            _ => testing::random_moe_target(arch, &SHAPE, &moe, 9).unwrap(),
        };
        let hf = dir.path().join("hf");
        let config = match arch {
            Architecture::GraniteMoe => testing::granite_moe_config(&SHAPE, &moe, GRANITE_MULTIPLIERS),
            Architecture::Olmoe => testing::olmoe_config(&SHAPE, &moe),
            _ => testing::moe_target_config(arch, &SHAPE, &moe),
        };
        testing::write_checkpoint(&hf, &config, &on_disk(arch, &tensors, &moe)).unwrap();
        let layouts = [(GgmlDType::F32, ModelDType::F32, true), (GgmlDType::Q8_0, ModelDType::Q8_0, true)];
        // Mixtral files from before llama.cpp stacked experts keep one tensor per expert.
        let legacy = (arch == Architecture::Mixtral).then_some((GgmlDType::Q8_0, ModelDType::Q8_0, false));
        for (dtype, as_loaded, stacked) in layouts.into_iter().chain(legacy) {
            let path = dir.path().join(format!("{dtype:?}-{stacked}.gguf"));
            write_moe_gguf(&path, arch, &SHAPE, &moe, &tensors, dtype, stacked);
            let (gguf, _) = load_causal_lm(&path, &Device::Cpu, ModelDType::Auto).unwrap();
            let cfg = gguf.config();
            assert_eq!(cfg.architecture, arch);
            let read = cfg.moe.as_ref().unwrap();
            assert_eq!((read.num_experts, read.top_k, read.norm_topk_prob), (moe.experts, 2, moe.norm_topk_prob));
            assert_eq!(read.shared_expert.as_ref().map(|s| s.intermediate_size), moe.shared_intermediate);
            let (hf_cfg, _) = load_causal_lm(&hf, &Device::Cpu, ModelDType::F32).unwrap();
            assert_eq!(
                (&read.router, read.first_k_dense_replace, cfg.rotary_dim),
                (&hf_cfg.config().moe.as_ref().unwrap().router, moe.dense_layers.len(), hf_cfg.config().rotary_dim),
                "{arch:?}"
            );
            // The safetensors checkpoint quantized at load to the GGUF's format: the same blocks,
            // but for Qwen2-MoE's shared-expert gate, a vector llama.cpp keeps in f32 while the
            // [1, hidden] matrix is quantized at load (a 1e-2 logit difference).
            let (hf_model, _) = load_causal_lm(&hf, &Device::Cpu, as_loaded).unwrap();
            let what = format!("{arch:?} {dtype:?} stacked {stacked}");
            let (got, want) = (logits(&gguf, &ids(), false), logits(&hf_model, &ids(), false));
            if arch == Architecture::Qwen2Moe && dtype != GgmlDType::F32 {
                assert_within(&got, &want, 3e-2, &what);
            } else {
                assert_close(&got, &want, &what);
            }
        }
    }
}

#[test]
fn a_glm45_gguf_carries_its_mtp_layer_past_the_decoder_layers() {
    // llama.cpp counts GLM-4.5's MTP layer in `block_count` and names its own parts `nextn.*`;
    // the target and its MTP head load from the file as from the checkpoint.
    let dir = tempfile::tempdir().unwrap();
    let moe = glm45();
    let with_mtp = TinyShape { layers: SHAPE.layers + 1, ..SHAPE };
    let mut tensors = testing::random_moe_target(Architecture::Glm4Moe, &with_mtp, &moe, 19).unwrap();
    let (h, mtp) = (SHAPE.hidden, format!("model.layers.{}", SHAPE.layers));
    for (name, seed) in [("enorm.weight", 1), ("hnorm.weight", 2), ("shared_head.norm.weight", 3)] {
        tensors.insert(format!("{mtp}.{name}"), (testing::random_tensor(&[h], 0.2, seed).unwrap() + 1.0).unwrap());
    }
    tensors.insert(format!("{mtp}.eh_proj.weight"), testing::random_tensor(&[h, 2 * h], 0.1, 4).unwrap());
    let hf_dir = dir.path().join("hf");
    let mut config = testing::moe_target_config(Architecture::Glm4Moe, &SHAPE, &moe);
    config["num_nextn_predict_layers"] = json!(1);
    testing::write_checkpoint(&hf_dir, &config, &tensors).unwrap();
    let path = dir.path().join("glm45.gguf");
    write_moe_gguf(&path, Architecture::Glm4Moe, &with_mtp, &moe, &tensors, GgmlDType::F32, true);
    let (hf, hf_store) = load_causal_lm(&hf_dir, &Device::Cpu, ModelDType::F32).unwrap();
    let (gguf, gguf_store) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).unwrap();
    assert_eq!(gguf.config().num_hidden_layers, SHAPE.layers);
    assert_close(&logits(&gguf, &ids(), false), &logits(&hf, &ids(), false), "GLM-4.5 GGUF vs safetensors");
    // One MTP step from the same hidden states, through each head's own cache.
    let draft_logits = |store, target| {
        let draft = MtpDraft::load_from_target(store, target).unwrap();
        let kv = draft.new_kv_cache(4, 4).unwrap();
        let hidden = testing::random_tensor(&[ids().len(), h], 1.0, 7).unwrap();
        let (_, out) = draft.forward(&hidden, &batch(&ids(), 0), &kv).unwrap();
        out.logits.to_vec2::<f32>().unwrap()
    };
    assert_close(&draft_logits(&gguf_store, &gguf), &draft_logits(&hf_store, &hf), "the GGUF's MTP head");
}

/// Each sparse layer's experts fused as transformers 5 saves them (`experts.gate_up_proj
/// [E, 2I, H]`, `experts.down_proj [E, H, I]`) or, `columns`, as Qwen3-VL-MoE does
/// (`[E, H, 2I]`, `[E, I, H]`).
fn fused_experts(tensors: &HashMap<String, Tensor>, moe: &TinyMoe, columns: bool) -> HashMap<String, Tensor> {
    let mut out: HashMap<String, Tensor> =
        tensors.iter().filter(|(n, _)| !n.contains(".experts.")).map(|(n, t)| (n.clone(), t.clone())).collect();
    for l in (0..SHAPE.layers).filter(|l| !moe.dense_layers.contains(l)) {
        let p = format!("model.layers.{l}.mlp.experts");
        let each = |e: usize, proj: &str| tensors[&format!("{p}.{e}.{proj}.weight")].clone();
        let gate_up: Vec<Tensor> =
            (0..moe.experts).map(|e| Tensor::cat(&[each(e, "gate_proj"), each(e, "up_proj")], 0).unwrap()).collect();
        let down: Vec<Tensor> = (0..moe.experts).map(|e| each(e, "down_proj")).collect();
        let stack = |ts: Vec<Tensor>| {
            let ts: Vec<Tensor> =
                ts.into_iter().map(|t| if columns { t.t().unwrap().contiguous().unwrap() } else { t }).collect();
            Tensor::stack(&ts, 0).unwrap()
        };
        out.insert(format!("{p}.gate_up_proj"), stack(gate_up));
        out.insert(format!("{p}.down_proj"), stack(down));
    }
    out
}

#[test]
fn experts_stored_fused_in_either_orientation_load_to_the_same_model() {
    let moe = qwen3_moe(vec![1]);
    let tensors = testing::random_moe_target(Architecture::Qwen3Moe, &SHAPE, &moe, 23).unwrap();
    let config = testing::moe_target_config(Architecture::Qwen3Moe, &SHAPE, &moe);
    let want = reference(Architecture::Qwen3Moe, &tensors, &moe, &ids());
    for columns in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        testing::write_checkpoint(dir.path(), &config, &fused_experts(&tensors, &moe, columns)).unwrap();
        let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
        assert_close(&logits(&model, &ids(), false), &want, &format!("fused experts, columns: {columns}"));
    }
    // A gate_up_proj of neither shape is named with what it should be.
    let dir = tempfile::tempdir().unwrap();
    let mut bad = fused_experts(&tensors, &moe, false);
    let name = "model.layers.0.mlp.experts.gate_up_proj";
    bad.insert(name.into(), bad[name].narrow(1, 0, 2).unwrap().contiguous().unwrap());
    testing::write_checkpoint(dir.path(), &config, &bad).unwrap();
    let e = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).err().unwrap().to_string();
    assert!(e.contains("gate_up_proj"), "{e}");
}

#[test]
fn configuration_errors_name_their_key() {
    let cfg = |edit: &dyn Fn(&mut serde_json::Value)| {
        let mut c = testing::moe_target_config(Architecture::Qwen3Moe, &SHAPE, &qwen3_moe(Vec::new()));
        edit(&mut c);
        DecoderConfig::from_hf_json(&c)
    };
    let e = cfg(&|c| c["num_experts_per_tok"] = json!(5)).unwrap_err().to_string();
    assert!(e.contains("num_experts_per_tok") && e.contains("num_experts (4)"), "{e}");
    let e = cfg(&|c| {
        c.as_object_mut().unwrap().remove("moe_intermediate_size");
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("moe_intermediate_size"), "{e}");
    let e = cfg(&|c| c["mlp_only_layers"] = json!("all")).unwrap_err().to_string();
    assert!(e.contains("mlp_only_layers"), "{e}");
    let e = cfg(&|c| c["architectures"] = json!(["Qwen2MoeForCausalLM"])).unwrap_err().to_string();
    assert!(e.contains("shared_expert_intermediate_size"), "{e}");
    let glm = |edit: &dyn Fn(&mut serde_json::Value)| {
        let mut c = testing::moe_target_config(Architecture::Glm4Moe, &SHAPE, &glm45());
        edit(&mut c);
        DecoderConfig::from_hf_json(&c)
    };
    let e = glm(&|c| c["n_group"] = json!(3)).unwrap_err().to_string();
    assert!(e.contains("n_group (3) must divide the 8 experts"), "{e}");
    let e = glm(&|c| c["topk_group"] = json!(5)).unwrap_err().to_string();
    assert!(e.contains("topk_group (5)"), "{e}");
    let read = glm(&|_| {}).unwrap();
    assert_eq!((read.rotary_dim, read.attention_bias, read.qk_norm), (4, true, false));
    let moe = read.moe.unwrap();
    assert_eq!(moe.shared_expert, Some(SharedExpertConfig { intermediate_size: 32, gated: false }));
    assert_eq!(moe.router, Router::GroupedSigmoid { n_group: 4, topk_group: 2, routed_scaling_factor: 2.5 });
    assert!(!moe.is_sparse_layer(0) && moe.is_sparse_layer(1), "first_k_dense_replace keeps layer 0 dense");
    assert!(glm(&|c| c["use_qk_norm"] = json!(true)).unwrap().qk_norm);
    let unshared = glm(&|c| c["n_shared_experts"] = json!(0)).unwrap();
    assert_eq!(unshared.moe.unwrap().shared_expert, None, "no shared expert to load");
    let sparse = cfg(&|c| {
        c["decoder_sparse_step"] = json!(2);
        c["mlp_only_layers"] = json!([3]);
    })
    .unwrap();
    let moe = sparse.moe.unwrap();
    let layers: Vec<bool> = (0..6).map(|i| moe.is_sparse_layer(i)).collect();
    assert_eq!(layers, [false, true, false, false, false, true], "every second layer, layer 3 kept dense");
}
