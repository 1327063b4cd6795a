//! DeepSeek-V3 (`DeepseekV3ForCausalLM`) and V2 (`DeepseekV2ForCausalLM`) on tiny checkpoints
//! written in their real layout: multi-head latent attention (through the query bottleneck or
//! one `q_proj`, values narrower than keys, the shared rope key, DeepSeek's interleaved RoPE
//! pairs), a leading dense layer and then routed experts with a shared expert (V3's grouped
//! sigmoid with its correction bias, V2's softmax within the best groups, scaled), matching
//! transformers' forward (`common::Reference`) in one prefill and token by token; their
//! configuration read as transformers reads it; and `deepseek2` GGUF files (`kv_b_proj` whole,
//! or split into `k_b` / `v_b` as llama.cpp writes it since it runs latent attention absorbed)
//! loading to the same model.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use candle_core::quantized::gguf_file::Value as GgufValue;
use candle_core::{Device, Tensor};
use common::{Choice, MlaLayout, Reference, Routing, assert_close, gguf_f32, logits, write_gguf};
use serde_json::json;
use specrs_models::config::Router;
use specrs_models::testing::{self, TinyMla, TinyMoe, TinyShape};
use specrs_models::weights::gguf::gguf_name;
use specrs_models::{Architecture, DecoderConfig, ModelDType, RopeScaling, load_causal_lm};

const SHAPE: TinyShape =
    TinyShape { vocab: 40, hidden: 32, layers: 3, heads: 4, kv_heads: 4, head_dim: 10, intermediate: 48 };
const MLA: TinyMla =
    TinyMla { q_lora_rank: Some(12), kv_lora_rank: 10, qk_nope_head_dim: 6, qk_rope_head_dim: 4, v_head_dim: 5 };

fn moe() -> TinyMoe {
    TinyMoe {
        expert_intermediate: 8,
        shared_intermediate: Some(8),
        dense_layers: vec![0],
        groups: (2, 1, 2.5),
        ..TinyMoe::routed(4, 2)
    }
}

/// Loads a random DeepSeek `arch` with `mla` and `m` and checks it against the reference
/// forward; returns the reference's logits with the rope pairs taken as halves, for the caller
/// to compare.
fn matches_reference(arch: Architecture, mla: TinyMla, m: TinyMoe, seed: u64) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
    matches_reference_as(testing::deepseek_config(arch, &SHAPE, &mla, &m), arch, mla, m, seed)
}

/// [`matches_reference`] for the checkpoint `config` describes (its `mlp_layer_types` may
/// place dense layers where `m` puts them).
fn matches_reference_as(
    config: serde_json::Value,
    arch: Architecture,
    mla: TinyMla,
    m: TinyMoe,
    seed: u64,
) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let dir = tempfile::tempdir().unwrap();
    let tensors = testing::random_deepseek(arch, &SHAPE, &mla, &m, seed).unwrap();
    testing::write_checkpoint(dir.path(), &config, &tensors).unwrap();
    let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
    let cfg = model.config();
    let d = mla.qk_nope_head_dim + mla.qk_rope_head_dim;
    assert_eq!(cfg.architecture, arch);
    // Absorbed: one cached entry per token, `[rope key, latent]`, serving as key and value.
    let entry = mla.qk_rope_head_dim + mla.kv_lora_rank;
    assert_eq!((cfg.num_key_value_heads, cfg.head_dim, cfg.rotary_dim), (1, entry, mla.qk_rope_head_dim));
    assert_eq!(cfg.kv_bytes_per_token(4), (SHAPE.layers * entry * 4) as u64);
    let cache = model.new_kv_cache(2, 4).unwrap();
    assert_eq!((cache.kv_heads(), cache.head_dim()), (1, entry));
    let reference = |interleaved_rope| Reference {
        rotary: mla.qk_rope_head_dim,
        factors: vec![1.0; mla.qk_rope_head_dim / 2],
        interleaved_rope,
        routing: Some(Routing {
            top_k: m.top_k,
            norm_topk_prob: m.norm_topk_prob,
            choice: match arch {
                Architecture::DeepseekV2 => Choice::GroupedSoftmax(m.groups.0, m.groups.1, m.groups.2),
                _ => Choice::GroupedSigmoid(m.groups.0, m.groups.1, m.groups.2),
            },
        }),
        mla: Some(MlaLayout {
            kv_lora_rank: mla.kv_lora_rank,
            nope: mla.qk_nope_head_dim,
            rope: mla.qk_rope_head_dim,
            v: mla.v_head_dim,
            scale: (d as f32).powf(-0.5),
        }),
        ..Reference::plain(&tensors, SHAPE)
    };
    let ids: Vec<u32> = (0..10).map(|i| (i * 7 + 3) % 40).collect();
    let want = reference(true).logits(&ids);
    assert_close(&logits(&model, &ids, false), &want, "one prefill");
    assert_close(&logits(&model, &ids, true), &want, "token by token");
    (want, reference(false).logits(&ids))
}

#[test]
fn latent_attention_and_grouped_experts_match_the_transformers_forward() {
    let (interleaved, halves) = matches_reference(Architecture::DeepseekV3, MLA, moe(), 5);
    // DeepSeek's rope pairs are interleaved: taking them as halves gives other logits.
    let gap = interleaved.iter().flatten().zip(halves.iter().flatten()).map(|(a, b)| (a - b).abs());
    assert!(gap.fold(0f32, f32::max) > 1e-2, "interleaved and half rotation agree");
}

#[test]
fn queries_without_the_low_rank_bottleneck_match_too() {
    // DeepSeek-V2-Lite's shape: one q_proj; values as wide as the non-rotated keys.
    matches_reference(Architecture::DeepseekV3, TinyMla { q_lora_rank: None, v_head_dim: 6, ..MLA }, moe(), 9);
}

#[test]
fn deepseek_v2_routes_by_softmax_within_the_best_groups_and_scales_the_weights() {
    // V2-Lite's attention (one q_proj), V2's router: two groups of two, one kept, weights
    // times 2.5 without renormalising (the released configs' norm_topk_prob: false).
    let m = TinyMoe { norm_topk_prob: false, ..moe() };
    matches_reference(Architecture::DeepseekV2, TinyMla { q_lora_rank: None, ..MLA }, m, 13);
}

#[test]
fn glm47_flash_loads_as_deepseek_v3_with_its_listed_dense_layers_and_values_wider_than_keys() {
    // GLM-4.7-Flash (`Glm4MoeLiteForCausalLM`): DeepSeek-V3's attention and router; its
    // `mlp_layer_types` list puts dense MLPs anywhere (layers 0 and 2 here), and latent
    // attention, absorbed, takes value heads wider than the query/key heads.
    let mla = TinyMla { v_head_dim: MLA.qk_nope_head_dim + MLA.qk_rope_head_dim + 2, ..MLA };
    let mut config = testing::deepseek_config(Architecture::DeepseekV3, &SHAPE, &mla, &moe());
    config["architectures"] = json!(["Glm4MoeLiteForCausalLM"]);
    config["model_type"] = json!("glm4_moe_lite");
    config["mlp_layer_types"] = json!(["dense", "sparse", "dense"]);
    let m = TinyMoe { dense_layers: vec![0, 2], ..moe() };
    let cfg = DecoderConfig::from_hf_json(&config).unwrap();
    assert_eq!(cfg.architecture, Architecture::DeepseekV3);
    let experts = cfg.moe.as_ref().unwrap();
    assert_eq!((0..3).map(|l| experts.is_sparse_layer(l)).collect::<Vec<_>>(), [false, true, false]);
    matches_reference_as(config, Architecture::DeepseekV3, mla, m, 29);
}

#[test]
fn configuration_is_read_as_transformers_reads_it_and_errors_name_their_key() {
    let base = testing::deepseek_config(Architecture::DeepseekV3, &SHAPE, &MLA, &moe());
    let cfg = DecoderConfig::from_hf_json(&base).unwrap();
    let mla = cfg.mla.unwrap();
    assert!(mla.rope_interleave && cfg.moe.as_ref().unwrap().first_k_dense_replace == 1);
    assert!((cfg.scales.attention.unwrap() - 10f64.powf(-0.5)).abs() < 1e-12);
    // YaRN with `mscale_all_dim` scales scores by mscale² (DeepSeek-V3's 40x: 0.1·ln 40 + 1).
    let mut yarn = base.clone();
    yarn["rope_scaling"] = json!({"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 128,
        "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0});
    let mscale = 0.1 * 40f64.ln() + 1.0;
    let scale = DecoderConfig::from_hf_json(&yarn).unwrap().scales.attention.unwrap();
    assert!((scale - 10f64.powf(-0.5) * mscale * mscale).abs() < 1e-12, "{scale}");
    let error = |key: &str, value: serde_json::Value| {
        let mut c = base.clone();
        c[key] = value;
        DecoderConfig::from_hf_json(&c).unwrap_err().to_string()
    };
    let e = error("kv_lora_rank", json!(null));
    assert!(e.contains("kv_lora_rank"), "{e}");
    let e = error("mlp_layer_types", json!(["dense", "sparse"]));
    assert!(e.contains("mlp_layer_types") && e.contains("3 layers"), "{e}");
    let e = error("mlp_layer_types", json!(["dense", "moe", "sparse"]));
    assert!(e.contains("mlp_layer_types") && e.contains("moe"), "{e}");
    let e = error("qk_rope_head_dim", json!(0));
    assert!(e.contains("qk_rope_head_dim") && e.contains("positive"), "{e}");
    let e = error("moe_layer_freq", json!(2));
    assert!(e.contains("moe_layer_freq"), "{e}");
    // V2: `greedy` is one group whatever n_group says; an unknown method is named.
    let mut v2 = testing::deepseek_config(Architecture::DeepseekV2, &SHAPE, &MLA, &moe());
    v2["topk_method"] = json!("greedy");
    let router = DecoderConfig::from_hf_json(&v2).unwrap().moe.unwrap().router;
    assert_eq!(router, Router::GroupedSoftmax { n_group: 1, topk_group: 1, routed_scaling_factor: 2.5 });
    v2["topk_method"] = json!("noaux_tc");
    let e = DecoderConfig::from_hf_json(&v2).unwrap_err().to_string();
    assert!(e.contains("topk_method") && e.contains("noaux_tc"), "{e}");
}

/// Writes `tensors` as llama.cpp's converter writes a `deepseek2` file: experts stacked into
/// `ffn_*_exps`, rows as the checkpoint has them, and either `kv_b_proj` split per head into
/// `attn_k_b [heads, latent, nope]` and `attn_v_b [heads, v, latent]` with the absorbed
/// dims as metadata (`split`), or whole with the expanded head's dims (older files); V3's
/// sigmoid gating named unless `gating_key` is false.
fn write_deepseek2_gguf(
    path: &Path,
    arch: Architecture,
    tensors: &HashMap<String, Tensor>,
    split: bool,
    gating_key: bool,
    extra: &[(&str, GgufValue)],
) {
    let (m, mla) = (moe(), MLA);
    let (nope, rope, v, latent) = (mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim, mla.kv_lora_rank);
    let f32 = gguf_f32;
    let mut named = Vec::new();
    let mut experts: BTreeMap<String, BTreeMap<usize, Tensor>> = BTreeMap::new();
    for (name, t) in tensors {
        let layer = name.strip_prefix("model.layers.").and_then(|r| r.split_once('.')).map(|(l, _)| l);
        if let (Some(l), Some((_, tail))) = (layer, name.split_once(".mlp.experts.")) {
            let (e, proj) = tail.split_once('.').unwrap();
            let stacked = format!("blk.{l}.ffn_{}_exps.weight", proj.trim_end_matches("_proj.weight"));
            experts.entry(stacked).or_default().insert(e.parse().unwrap(), t.clone());
        } else if let (Some(l), true) = (layer, split && name.ends_with("kv_b_proj.weight")) {
            let kv_b = t.reshape((SHAPE.heads, nope + v, latent)).unwrap();
            named.push((
                format!("blk.{l}.attn_k_b.weight"),
                f32(&kv_b.narrow(1, 0, nope).unwrap().transpose(1, 2).unwrap()),
            ));
            named.push((format!("blk.{l}.attn_v_b.weight"), f32(&kv_b.narrow(1, nope, v).unwrap())));
        } else {
            named.push((gguf_name(name).unwrap_or_else(|| panic!("{name} has a GGUF name")), f32(t)));
        }
    }
    for (name, by_expert) in experts {
        let stacked = Tensor::stack(&by_expert.into_values().collect::<Vec<_>>(), 0).unwrap();
        named.push((name, f32(&stacked)));
    }
    let u32v = |x: usize| GgufValue::U32(x as u32);
    let (key, value) = if split { (latent + rope, latent) } else { (nope + rope, v) };
    let mut metadata = vec![
        ("deepseek2.attention.head_count_kv", u32v(if split { 1 } else { SHAPE.heads })),
        ("deepseek2.attention.key_length", u32v(key)),
        ("deepseek2.attention.value_length", u32v(value)),
        ("deepseek2.rope.dimension_count", u32v(rope)),
        ("deepseek2.attention.kv_lora_rank", u32v(latent)),
        ("deepseek2.leading_dense_block_count", u32v(m.dense_layers.len())),
        ("deepseek2.expert_feed_forward_length", u32v(m.expert_intermediate)),
        ("deepseek2.expert_count", u32v(m.experts)),
        ("deepseek2.expert_used_count", u32v(m.top_k)),
        ("deepseek2.expert_shared_count", u32v(m.shared_intermediate.unwrap() / m.expert_intermediate)),
        ("deepseek2.expert_weights_scale", GgufValue::F32(m.groups.2 as f32)),
        ("deepseek2.expert_group_count", u32v(m.groups.0)),
        ("deepseek2.expert_group_used_count", u32v(m.groups.1)),
    ];
    if split {
        metadata.push(("deepseek2.attention.key_length_mla", u32v(nope + rope)));
        metadata.push(("deepseek2.attention.value_length_mla", u32v(v)));
    }
    if let Some(rank) = mla.q_lora_rank {
        metadata.push(("deepseek2.attention.q_lora_rank", u32v(rank)));
    }
    if m.norm_topk_prob {
        metadata.push(("deepseek2.expert_weights_norm", GgufValue::Bool(true)));
    }
    // Files converted from checkpoints without `scoring_func` (GLM-4.7-Flash) have no gating key.
    if arch == Architecture::DeepseekV3 && gating_key {
        metadata.push(("deepseek2.expert_gating_func", u32v(2)));
    }
    metadata.extend(extra.iter().cloned());
    write_gguf(path, "deepseek2", &SHAPE, &named, &metadata);
}

#[test]
fn deepseek2_gguf_files_load_to_the_same_model_with_kv_b_whole_or_split() {
    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<u32> = (0..9).map(|i| (i * 5 + 2) % 40).collect();
    for (arch, seed) in [(Architecture::DeepseekV3, 21), (Architecture::DeepseekV2, 23)] {
        let m = moe();
        let tensors = testing::random_deepseek(arch, &SHAPE, &MLA, &m, seed).unwrap();
        let hf_dir = dir.path().join(format!("hf-{seed}"));
        testing::write_checkpoint(&hf_dir, &testing::deepseek_config(arch, &SHAPE, &MLA, &m), &tensors).unwrap();
        let (hf, _) = load_causal_lm(&hf_dir, &Device::Cpu, ModelDType::F32).unwrap();
        let want = logits(&hf, &ids, false);
        for split in [true, false] {
            let path = dir.path().join(format!("{seed}-{split}.gguf"));
            write_deepseek2_gguf(&path, arch, &tensors, split, true, &[]);
            let (gguf, _) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).unwrap();
            let cfg = gguf.config();
            // V2 and V3 share `deepseek2`; the gating function tells them apart.
            assert_eq!(cfg.architecture, arch, "split: {split}");
            assert_eq!(cfg.mla, hf.config().mla, "split: {split}");
            assert_eq!(cfg.moe, hf.config().moe, "split: {split}");
            assert_eq!((cfg.num_key_value_heads, cfg.head_dim), (1, MLA.qk_rope_head_dim + MLA.kv_lora_rank));
            assert_eq!(cfg.scales, hf.config().scales);
            let what = format!("{arch:?} GGUF (kv_b split: {split}) vs safetensors");
            assert_close(&logits(&gguf, &ids, false), &want, &format!("{what}, one prefill"));
            assert_close(&logits(&gguf, &ids, true), &want, &format!("{what}, token by token"));
        }
    }
}

#[test]
fn deepseek2_gguf_yarn_scales_scores_by_mscale_squared_and_leaves_cos_sin_unscaled() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("yarn.gguf");
    let tensors = testing::random_deepseek(Architecture::DeepseekV3, &SHAPE, &MLA, &moe(), 3).unwrap();
    // DeepSeek-V3's YaRN: factor 40, mscale_all_dim 1 written as a log multiplier of 0.1.
    let yarn = [
        ("deepseek2.rope.scaling.type", GgufValue::String("yarn".into())),
        ("deepseek2.rope.scaling.factor", GgufValue::F32(40.0)),
        ("deepseek2.rope.scaling.original_context_length", GgufValue::U32(128)),
        ("deepseek2.rope.scaling.yarn_log_multiplier", GgufValue::F32(0.1)),
    ];
    write_deepseek2_gguf(&path, Architecture::DeepseekV3, &tensors, true, false, &yarn);
    let (model, _) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).unwrap();
    let cfg = model.config();
    // No gating key: the correction bias tells V3's sigmoid router apart.
    assert_eq!(cfg.architecture, Architecture::DeepseekV3);
    let mscale = 0.1 * 40f64.ln() + 1.0;
    let scale = cfg.scales.attention.unwrap();
    assert!((scale - 10f64.powf(-0.5) * mscale * mscale).abs() < 1e-6, "{scale}");
    let Some(RopeScaling::Yarn { params, attention_factor }) = &cfg.rope_scaling else { panic!("YaRN expected") };
    assert_eq!((params.factor, params.original_max_position_embeddings, *attention_factor), (40.0, 128.0, 1.0));
}
