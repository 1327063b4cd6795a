//! `InternLM2ForCausalLM`: InternLM2 and InternLM2.5. Llama's layer under other names
//! (`tok_embeddings`, `attention.wo`, `attention_norm`, `feed_forward.w1/w3/w2`, `ffn_norm`,
//! `output`), with q, k and v fused into `attention.wqkv`, whose rows are grouped per key-value
//! head: for head `h`, the `groups = heads / kv_heads` query heads it serves, then its key, then
//! its value, `head_dim` rows each. The store reads the Llama names from there
//! ([`aliases`]); nothing else differs. `dynamic` RoPE scaling (InternLM2.5) only acts past
//! the model's context, so inside it the rotation is plain.

use crate::config::DecoderConfig;
use crate::weights::{Alias, Aliases};

pub fn adapt(cfg: DecoderConfig) -> DecoderConfig {
    cfg
}

/// Where an InternLM2 checkpoint keeps each Llama-named tensor.
pub fn aliases(cfg: &DecoderConfig) -> Aliases {
    let mut table = Aliases::new();
    table.insert("model.embed_tokens.weight".into(), Alias::renamed("model.tok_embeddings.weight"));
    table.insert("lm_head.weight".into(), Alias::renamed("output.weight"));
    let (nh, nkv, d) = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim);
    let groups = nh / nkv;
    // Rows of head block `b` of wqkv.
    let block = |b: usize| (b * d) as u32..((b + 1) * d) as u32;
    let q_rows: Vec<u32> = (0..nkv).flat_map(|h| (0..groups).flat_map(move |j| block(h * (groups + 2) + j))).collect();
    let k_rows: Vec<u32> = (0..nkv).flat_map(|h| block(h * (groups + 2) + groups)).collect();
    let v_rows: Vec<u32> = (0..nkv).flat_map(|h| block(h * (groups + 2) + groups + 1)).collect();
    for i in 0..cfg.num_hidden_layers {
        let (hf, own) = (format!("model.layers.{i}"), format!("model.layers.{i}"));
        let wqkv = format!("{own}.attention.wqkv.weight");
        for (proj, rows) in [("q_proj", &q_rows), ("k_proj", &k_rows), ("v_proj", &v_rows)] {
            table.insert(format!("{hf}.self_attn.{proj}.weight"), Alias::rows(wqkv.clone(), rows.clone()));
        }
        for (name, source) in [
            ("self_attn.o_proj.weight", "attention.wo.weight"),
            ("input_layernorm.weight", "attention_norm.weight"),
            ("post_attention_layernorm.weight", "ffn_norm.weight"),
            ("mlp.gate_proj.weight", "feed_forward.w1.weight"),
            ("mlp.up_proj.weight", "feed_forward.w3.weight"),
            ("mlp.down_proj.weight", "feed_forward.w2.weight"),
        ] {
            table.insert(format!("{hf}.{name}"), Alias::renamed(format!("{own}.{source}")));
        }
    }
    table
}
