//! DFlash2 (`DFlash2DraftModel`, e.g. `z-lab/Qwen3.8-27B-DFlash2`): the DFlash backbone in the
//! z-lab format plus, per layer, two dynamic grouped convolutions along the block, and a
//! candidate selector that rescores the `lm_head` top-k with low-rank pairwise scores before a
//! greedy walk. Semantics follow vLLM's `qwen3_dflash2.py`.
//!
//! **Convolutions** (`layers.{i}.attention_conv`, `layers.{i}.mlp_conv`): each holds
//! `base_kernel [2, taps, H]` and `kernel_projection.weight [2·taps·G, H]` with `G = H /
//! conv_group_size` groups. From the normed layer input `u [T, H]` the projection gives two
//! dynamic kernels `δ_s [T, taps, G]`; side `s` convolves causally within each block:
//! `y_t = Σ_{j < taps, j ≤ slot(t)} (base_s[j] + δ_{s,t}[j]) ⊙ x_{t−j}`, a group's `δ` shared
//! by its `conv_group_size` channels and the coefficients taken at the output slot `t`. A
//! layer runs `x + conv_1(attn(conv_0(u)))` with `u = input_layernorm(x)`, then likewise
//! `x + conv_1(mlp(conv_0(v)))` with `v = post_attention_layernorm(x)` and `mlp_conv`'s kernels.
//!
//! **Selector** (`candidate_selector.{predecessor_codebook [V, r], successor_codebook [V, r],
//! hidden_projection.weight [r, H]}`): each drafting slot `l` takes the `selector_top_k` best
//! `lm_head` logits as candidates with unary scores `u = softcap(output_multiplier · logit)`
//! (`final_logit_softcapping`: `cap · tanh(u / cap)`); an edge from predecessor `p` to
//! candidate `c` scores `u_c + ⟨pred[p] ⊙ hidden_projection(h_l), succ[c]⟩`. The walk starts
//! from the anchor and at each slot takes the best-scoring candidate given the token chosen
//! before it. The walk is greedy at every temperature (vLLM drafts DFlash2 greedily too); its
//! proposals carry no distribution, which rejection sampling treats as one-hot.
//!
//! Block embeddings are scaled by `dflash_config.input_embedding_scale`.

use std::path::Path;

use candle_core::{DType, Device, Result, Tensor};
use serde_json::Value;

use super::block::{BlockBackbone, BlockConfig, TargetDims, architecture_name, opt_f64, read_config, req_usize};
use super::dflash::zlab_block_config;
use super::{BlockDraftModel, SlotSampler};
use crate::error::{ModelError, Result as LoadResult};
use crate::host::with_f32_slice;
use crate::linear::Linear;
use crate::models::CausalLm;
use crate::weights::{ModelDType, WeightStore};

/// The DFlash2-specific `dflash_config` keys.
#[derive(Debug, Clone, PartialEq)]
pub struct DFlash2Params {
    /// Taps of each block convolution (`conv_kernel_size`).
    pub conv_kernel_size: usize,
    /// Channels sharing one dynamic coefficient (`conv_group_size`).
    pub conv_group_size: usize,
    pub selector_rank: usize,
    pub selector_top_k: usize,
    pub output_multiplier: f64,
    /// `final_logit_softcapping`; `None` when absent or not positive.
    pub final_logit_softcapping: Option<f64>,
}

/// Parses a DFlash2 draft `config.json` for a target of `target`'s dimensions.
pub fn dflash2_config(json: &Value, target: &TargetDims) -> LoadResult<(BlockConfig, DFlash2Params)> {
    match architecture_name(json) {
        "DFlash2DraftModel" => {}
        other => {
            return Err(ModelError::UnknownArchitecture {
                name: other.to_string(),
                supported: "DFlash2DraftModel".into(),
            });
        }
    }
    let mut cfg = zlab_block_config(json, target)?;
    let dc = &json["dflash_config"];
    let key = |k: &str| format!("dflash_config.{k}");
    let params = DFlash2Params {
        conv_kernel_size: req_usize(dc, "conv_kernel_size", &key("conv_kernel_size"))?,
        conv_group_size: req_usize(dc, "conv_group_size", &key("conv_group_size"))?,
        selector_rank: req_usize(dc, "selector_rank", &key("selector_rank"))?,
        selector_top_k: req_usize(dc, "selector_top_k", &key("selector_top_k"))?,
        output_multiplier: opt_f64(dc, "output_multiplier", &key("output_multiplier"))?.unwrap_or(1.0),
        final_logit_softcapping: opt_f64(dc, "final_logit_softcapping", &key("final_logit_softcapping"))?
            .filter(|&c| c > 0.0),
    };
    cfg.input_embedding_scale = opt_f64(dc, "input_embedding_scale", &key("input_embedding_scale"))?.unwrap_or(1.0);
    if params.conv_kernel_size == 0 {
        return Err(ModelError::config(key("conv_kernel_size"), "must be >= 1"));
    }
    let h = cfg.layer.hidden_size;
    if params.conv_group_size == 0 || !h.is_multiple_of(params.conv_group_size) {
        return Err(ModelError::config(
            key("conv_group_size"),
            format!("must divide hidden_size = {h}, got {}", params.conv_group_size),
        ));
    }
    if params.selector_rank == 0 {
        return Err(ModelError::config(key("selector_rank"), "must be >= 1"));
    }
    if params.selector_top_k == 0 || params.selector_top_k > target.vocab_size {
        return Err(ModelError::config(
            key("selector_top_k"),
            format!("must be in 1..={}, got {}", target.vocab_size, params.selector_top_k),
        ));
    }
    cfg.check(target)?;
    Ok((cfg, params))
}

/// One dynamic grouped convolution along block slots (`attention_conv` or `mlp_conv`).
#[derive(Debug, Clone)]
pub struct GroupedConv {
    /// `[2, taps, H]`: side 0 before the sub-block, side 1 after it.
    base_kernel: Tensor,
    /// `H -> 2·taps·G`.
    kernel_projection: Linear,
    taps: usize,
    num_groups: usize,
    group_size: usize,
}

impl GroupedConv {
    pub fn load(store: &WeightStore, prefix: &str, hidden: usize, params: &DFlash2Params) -> LoadResult<Self> {
        let (taps, group_size) = (params.conv_kernel_size, params.conv_group_size);
        let num_groups = hidden / group_size;
        Ok(Self {
            base_kernel: store.tensor(&format!("{prefix}.base_kernel"), &[2, taps, hidden])?,
            kernel_projection: store.linear(
                &format!("{prefix}.kernel_projection"),
                2 * taps * num_groups,
                hidden,
                false,
            )?,
            taps,
            num_groups,
            group_size,
        })
    }

    /// Side 0 on `u [T, H]`, and side 1's dynamic kernels `[T, taps, G]` for [`Self::finish`].
    pub fn prepare(&self, u: &Tensor, slot_masks: &[Tensor]) -> Result<(Tensor, Tensor)> {
        let t = u.dim(0)?;
        // [T, H] -> [T, 2, taps, G].
        let coefficients = self.kernel_projection.forward(u)?.reshape((t, 2, self.taps, self.num_groups))?;
        let side0 = coefficients.narrow(1, 0, 1)?.squeeze(1)?;
        let side1 = coefficients.narrow(1, 1, 1)?.squeeze(1)?;
        Ok((self.convolve(u, &side0, 0, slot_masks)?, side1))
    }

    /// Side 1 on the sub-block's output `y [T, H]`.
    pub fn finish(&self, y: &Tensor, coefficients: &Tensor, slot_masks: &[Tensor]) -> Result<Tensor> {
        self.convolve(y, coefficients, 1, slot_masks)
    }

    /// `y_t = Σ_j [slot(t) ≥ j] · (base[side, j] + δ_t[j]) ⊙ x_{t−j}`, `δ [T, taps, G]` expanded
    /// over each group's channels.
    fn convolve(&self, x: &Tensor, delta: &Tensor, side: usize, slot_masks: &[Tensor]) -> Result<Tensor> {
        let (t, h) = x.dims2()?;
        let (g, gs) = (self.num_groups, self.group_size);
        let blocks = x.reshape((t, g, gs))?;
        // [1, taps, G, gs] + [T, taps, G, 1] -> [T, taps, G, gs].
        let base = self.base_kernel.get(side)?.reshape((1, self.taps, g, gs))?;
        let coefficients = base.broadcast_add(&delta.to_dtype(x.dtype())?.unsqueeze(3)?)?;
        let tap = |j: usize| coefficients.narrow(1, j, 1)?.squeeze(1);
        let mut out = (tap(0)? * &blocks)?;
        for (j, mask) in slot_masks.iter().enumerate().take(self.taps.min(t)).skip(1) {
            // Row t reads x_{t−j}: shift down j rows; the slot mask drops reads across blocks.
            let shifted =
                Tensor::cat(&[&Tensor::zeros((j, g, gs), x.dtype(), x.device())?, &blocks.narrow(0, 0, t - j)?], 0)?;
            out = (out + (tap(j)? * shifted)?.broadcast_mul(mask)?)?;
        }
        out.reshape((t, h))
    }
}

/// A layer's two convolutions.
#[derive(Debug, Clone)]
pub struct LayerConvs {
    pub attention: GroupedConv,
    pub mlp: GroupedConv,
}

impl LayerConvs {
    pub fn taps(&self) -> usize {
        self.attention.taps.max(self.mlp.taps)
    }
}

/// The low-rank pairwise rescoring of `lm_head` candidates.
#[derive(Debug, Clone)]
struct CandidateSelector {
    predecessor_codebook: Tensor,
    successor_codebook: Tensor,
    hidden_projection: Linear,
}

/// A loaded DFlash2 drafter.
#[derive(Debug, Clone)]
pub struct DFlash2Draft {
    backbone: BlockBackbone,
    selector: CandidateSelector,
    params: DFlash2Params,
}

impl DFlash2Draft {
    /// Loads a draft checkpoint directory for `target`, sharing its embedding and `lm_head`.
    pub fn load(dir: &Path, target: &CausalLm, device: &Device, dtype: ModelDType) -> LoadResult<Self> {
        let json = read_config(dir)?;
        let (cfg, params) = dflash2_config(&json, &TargetDims::from(target.config()))?;
        let store = WeightStore::open(dir, device.clone(), dtype)?;
        Self::load_from(&store, cfg, params, target)
    }

    pub fn load_from(
        store: &WeightStore,
        cfg: BlockConfig,
        params: DFlash2Params,
        target: &CausalLm,
    ) -> LoadResult<Self> {
        let (h, v, r) = (cfg.layer.hidden_size, target.config().vocab_size, params.selector_rank);
        let backbone = BlockBackbone::load(store, cfg, target, |i| {
            Ok(Some(LayerConvs {
                attention: GroupedConv::load(store, &format!("layers.{i}.attention_conv"), h, &params)?,
                mlp: GroupedConv::load(store, &format!("layers.{i}.mlp_conv"), h, &params)?,
            }))
        })?;
        let selector = CandidateSelector {
            predecessor_codebook: store.tensor("candidate_selector.predecessor_codebook", &[v, r])?,
            successor_codebook: store.tensor("candidate_selector.successor_codebook", &[v, r])?,
            hidden_projection: store.linear("candidate_selector.hidden_projection", r, h, false)?,
        };
        Ok(Self { backbone, selector, params })
    }

    pub fn params(&self) -> &DFlash2Params {
        &self.params
    }

    /// Codebook rows of `ids` as host f32, `[ids.len() · r]`.
    fn codes(&self, codebook: &Tensor, ids: &[u32]) -> Result<Vec<f32>> {
        let idx = Tensor::from_slice(ids, ids.len(), codebook.device())?;
        codebook.index_select(&idx, 0)?.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()
    }
}

/// The `k` largest entries of `row`, best first, ties to the lower index, NaN and infinities
/// ranked as the device ranks them ([`crate::reductions::top_k_rows`]): `(index, value)`.
fn top_k(row: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut idx: Vec<u32> = (0..row.len() as u32).collect();
    let rank = |i: u32| match row[i as usize] {
        x if x.is_nan() => f32::MIN,
        x => x.clamp(f32::MIN, f32::MAX),
    };
    let by_value = |a: &u32, b: &u32| rank(*b).total_cmp(&rank(*a)).then(a.cmp(b));
    if k < idx.len() {
        idx.select_nth_unstable_by(k, by_value);
        idx.truncate(k);
    }
    idx.sort_unstable_by(by_value);
    idx.into_iter().map(|i| (i, row[i as usize])).collect()
}

impl BlockDraftModel for DFlash2Draft {
    fn name(&self) -> &str {
        "DFlash2"
    }

    fn backbone(&self) -> &BlockBackbone {
        &self.backbone
    }

    fn head(&self, hidden: &Tensor, anchors: &[u32], sampler: &mut dyn SlotSampler) -> Result<Vec<Vec<u32>>> {
        if anchors.is_empty() {
            return Ok(Vec::new());
        }
        let (n, w) = (anchors.len(), hidden.dim(0)? / anchors.len());
        let (k, r) = (self.params.selector_top_k, self.params.selector_rank);
        // 1. Candidates: each slot's lm_head top-k ([n·W, V] -> [n·W, k], on the device when
        //    the driver chooses there) with scaled, soft-capped unary scores.
        let logits = self.backbone.logits(hidden)?;
        let top: Vec<(u32, f32)> = if sampler.chooses_on_device() {
            let (ids, values) = crate::reductions::top_k_rows(&logits, k)?;
            ids.flatten_all()?.to_vec1::<u32>()?.into_iter().zip(values.flatten_all()?.to_vec1::<f32>()?).collect()
        } else {
            let vocab = logits.dim(1)?;
            with_f32_slice(&logits, |all| all.chunks(vocab).flat_map(|row| top_k(row, k)).collect())?
        };
        let (candidates, unary): (Vec<u32>, Vec<f32>) = top
            .into_iter()
            .map(|(id, logit)| {
                let u = logit as f64 * self.params.output_multiplier;
                let u = self.params.final_logit_softcapping.map_or(u, |cap| cap * (u / cap).tanh());
                (id, u as f32)
            })
            .unzip();
        // 2. The low-rank factors: projected hidden states [n·W, r], candidate codes [n·W·k, r].
        let projected =
            self.selector.hidden_projection.forward(hidden)?.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        let successors = self.codes(&self.selector.successor_codebook, &candidates)?;
        // 3. Greedy walk from the anchor: each slot's best candidate given the previous choice.
        let mut previous = anchors.to_vec();
        let mut drafts = vec![Vec::with_capacity(w); n];
        for slot in 0..w {
            let predecessors = self.codes(&self.selector.predecessor_codebook, &previous)?;
            for (i, draft) in drafts.iter_mut().enumerate() {
                let row = i * w + slot;
                let hp = &projected[row * r..(row + 1) * r];
                let pred = &predecessors[i * r..(i + 1) * r];
                let score = |c: usize| -> f32 {
                    let succ = &successors[(row * k + c) * r..(row * k + c + 1) * r];
                    unary[row * k + c] + pred.iter().zip(hp).zip(succ).map(|((p, h), s)| p * h * s).sum::<f32>()
                };
                let scores: Vec<f32> = (0..k).map(score).collect();
                // The first best on ties, like argmax.
                let best = (1..k).fold(0, |best, c| if scores[c] > scores[best] { c } else { best });
                let token = candidates[row * k + best];
                draft.push(token);
                previous[i] = token;
            }
        }
        Ok(drafts)
    }
}
