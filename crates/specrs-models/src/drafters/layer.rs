//! The decoder layer drafters are built from: attention over the drafter's own KV, then a
//! SwiGLU MLP, with the attention input and the residual chosen by the drafter (EAGLE-1 feeds
//! its fused features straight in; EAGLE-3 attends over `[norm(embedding), norm(hidden)]`
//! while the residual is the hidden state alone; MTP is an ordinary pre-norm layer).

use candle_core::{Result, Tensor};

use crate::batch::ForwardBatch;
use crate::config::DecoderConfig;
use crate::error::Result as LoadResult;
use crate::kv_cache::PagedKvCache;
use crate::models::transformer::{FeedForward, Mlp, SelfAttention};
use crate::moe::SparseMoe;
use crate::norm::RmsNorm;
use crate::rope::RotaryEmbedding;
use crate::weights::WeightStore;

#[derive(Debug, Clone)]
pub struct DraftLayer {
    pub input_layernorm: Option<RmsNorm>,
    pub self_attn: SelfAttention,
    pub post_attention_layernorm: RmsNorm,
    pub mlp: FeedForward,
}

impl DraftLayer {
    /// Loads `{prefix}.*` with attention inputs `attn_in` wide; `input_layernorm` only when the
    /// checkpoint has it; routed experts in place of the MLP where `cfg` has them and the
    /// checkpoint a router (GLM-4.5's MTP layer).
    pub fn load(store: &WeightStore, prefix: &str, cfg: &DecoderConfig, attn_in: usize) -> LoadResult<Self> {
        let (nh, nkv, d) = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim);
        let ln = format!("{prefix}.input_layernorm.weight");
        Ok(Self {
            input_layernorm: if store.contains(&ln) {
                Some(RmsNorm::load(store, &ln, cfg.hidden_size, cfg.rms_norm_eps)?)
            } else {
                None
            },
            self_attn: SelfAttention::load_with_input(
                store,
                &format!("{prefix}.self_attn"),
                cfg,
                attn_in,
                nh * d,
                nkv * d,
                nh,
                nkv,
                d,
            )?,
            post_attention_layernorm: RmsNorm::load(
                store,
                &format!("{prefix}.post_attention_layernorm.weight"),
                cfg.hidden_size,
                cfg.rms_norm_eps,
            )?,
            mlp: match &cfg.moe {
                Some(moe) if store.contains(&format!("{prefix}.mlp.gate.weight")) => FeedForward::Sparse(Box::new(
                    SparseMoe::load(store, &format!("{prefix}.mlp"), cfg.hidden_size, moe)?,
                )),
                _ => FeedForward::Dense(Mlp::load(
                    store,
                    &format!("{prefix}.mlp"),
                    cfg.hidden_size,
                    cfg.intermediate_size,
                )?),
            },
        })
    }

    /// `attn_input [T, attn_in]`, `residual [T, hidden]` -> `[T, hidden]`, keys and values in
    /// layer 0 of `kv`.
    pub fn forward(
        &self,
        attn_input: &Tensor,
        residual: &Tensor,
        rope: &RotaryEmbedding,
        kv: &PagedKvCache,
        batch: &ForwardBatch,
    ) -> Result<Tensor> {
        self.forward_at(attn_input, residual, rope, kv, 0, batch)
    }

    /// [`Self::forward`] with keys and values in layer `kv_layer` of `kv` (drafters of several
    /// layers).
    pub fn forward_at(
        &self,
        attn_input: &Tensor,
        residual: &Tensor,
        rope: &RotaryEmbedding,
        kv: &PagedKvCache,
        kv_layer: usize,
        batch: &ForwardBatch,
    ) -> Result<Tensor> {
        let positions = Tensor::from_slice(&batch.positions, batch.positions.len(), attn_input.device())?;
        let (cos, sin) = rope.tables(&positions)?;
        let h = self.self_attn.forward(attn_input, &cos, &sin, kv, kv_layer, batch)?;
        let x = (residual + h)?;
        let h = self.mlp.forward(&self.post_attention_layernorm.forward(&x)?)?;
        x + h
    }

    pub fn kv_bytes_per_token(cfg: &DecoderConfig, dtype_bytes: usize) -> u64 {
        cfg.kv_bytes_per_token_per_layer(dtype_bytes)
    }
}
