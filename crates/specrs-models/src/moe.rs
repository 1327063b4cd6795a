//! The sparse mixture-of-experts feed-forward of Qwen2-MoE and Qwen3-MoE: a linear router
//! scores every expert for each token, the top-k of its softmax pick the token's experts, each
//! expert (a SwiGLU MLP) runs once on the rows routed to it, and the outputs are summed back
//! with their routing weights. Qwen2-MoE adds an always-on shared expert scaled by a sigmoid
//! gate.
//!
//! The routing is read on the host (a `[T, experts]` copy per layer): free on the CPU, one
//! small synchronising copy per layer on a GPU, which is why the MoE targets declare no
//! device-graph capture.

use candle_core::{DType, Result, Tensor};

use crate::config::MoeConfig;
use crate::error::Result as LoadResult;
use crate::linear::Linear;
use crate::models::transformer::Mlp;
use crate::weights::WeightStore;

/// Qwen2-MoE's shared expert and its scalar gate.
#[derive(Debug, Clone)]
struct SharedExpert {
    mlp: Mlp,
    gate: Linear,
}

#[derive(Debug, Clone)]
pub struct SparseMoe {
    /// `[experts, hidden]`: one logit per expert.
    router: Linear,
    experts: Vec<Mlp>,
    top_k: usize,
    norm_topk_prob: bool,
    shared: Option<SharedExpert>,
}

/// Tokens routed to one expert and their weights.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Route {
    pub tokens: Vec<u32>,
    pub weights: Vec<f32>,
}

/// Routes each row of `probs [T, experts]` to its `top_k` most probable experts (the lower
/// index first among equals), weights renormalised to sum to one when `norm_topk_prob`.
pub fn route(probs: &[Vec<f32>], top_k: usize, norm_topk_prob: bool) -> Vec<Route> {
    let num_experts = probs.first().map_or(0, Vec::len);
    let mut routes = vec![Route::default(); num_experts];
    let mut order: Vec<usize> = Vec::with_capacity(num_experts);
    for (token, p) in probs.iter().enumerate() {
        order.clear();
        order.extend(0..p.len());
        order.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
        let chosen = &order[..top_k];
        let total: f32 = if norm_topk_prob { chosen.iter().map(|&e| p[e]).sum() } else { 1.0 };
        for &e in chosen {
            routes[e].tokens.push(token as u32);
            routes[e].weights.push(p[e] / total);
        }
    }
    routes
}

impl SparseMoe {
    /// Loads `{prefix}.gate`, `{prefix}.experts.{e}.{gate,up,down}_proj` and, for Qwen2-MoE,
    /// `{prefix}.shared_expert.*` and `{prefix}.shared_expert_gate`.
    pub fn load(store: &WeightStore, prefix: &str, hidden: usize, moe: &MoeConfig) -> LoadResult<Self> {
        let router = store.linear(&format!("{prefix}.gate"), moe.num_experts, hidden, false)?;
        let experts = (0..moe.num_experts)
            .map(|e| Mlp::load(store, &format!("{prefix}.experts.{e}"), hidden, moe.expert_intermediate_size))
            .collect::<LoadResult<Vec<_>>>()?;
        let shared = match moe.shared_expert_intermediate_size {
            Some(width) => Some(SharedExpert {
                mlp: Mlp::load(store, &format!("{prefix}.shared_expert"), hidden, width)?,
                gate: store.linear(&format!("{prefix}.shared_expert_gate"), 1, hidden, false)?,
            }),
            None => None,
        };
        Ok(Self { router, experts, top_k: moe.top_k, norm_topk_prob: moe.norm_topk_prob, shared })
    }

    pub fn size_in_bytes(&self) -> usize {
        self.router.weight().size_in_bytes()
            + self.experts.iter().map(Mlp::size_in_bytes).sum::<usize>()
            + self.shared.as_ref().map_or(0, |s| s.mlp.size_in_bytes() + s.gate.weight().size_in_bytes())
    }

    /// `x [T, H] -> [T, H]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (t, h) = x.dims2()?;
        // 1. Router: [T, H] -> [T, E] probabilities, in f32 as transformers computes them.
        let logits = self.router.forward(x)?.to_dtype(DType::F32)?;
        let probs = candle_nn::ops::softmax_last_dim(&logits)?.to_vec2::<f32>()?;
        // 2. Each expert once over its rows: [n, H] -> [n, H], weighted, added back into [T, H].
        let mut out = Tensor::zeros((t, h), x.dtype(), x.device())?;
        for (expert, r) in self.experts.iter().zip(route(&probs, self.top_k, self.norm_topk_prob)) {
            if r.tokens.is_empty() {
                continue;
            }
            let n = r.tokens.len();
            let rows = Tensor::from_vec(r.tokens, n, x.device())?;
            let weights = Tensor::from_vec(r.weights, (n, 1), x.device())?.to_dtype(x.dtype())?;
            let y = expert.forward(&x.index_select(&rows, 0)?)?.broadcast_mul(&weights)?;
            out = out.index_add(&rows, &y, 0)?;
        }
        // 3. Qwen2-MoE: + sigmoid(gate(x)) · shared(x).
        if let Some(shared) = &self.shared {
            let gate = candle_nn::ops::sigmoid(&shared.gate.forward(x)?)?;
            out = (out + shared.mlp.forward(x)?.broadcast_mul(&gate)?)?;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_each_token_to_its_top_k_with_optional_renormalisation() {
        let probs = vec![vec![0.1, 0.6, 0.3, 0.0], vec![0.25, 0.25, 0.25, 0.25]];
        let routes = route(&probs, 2, false);
        assert_eq!(routes[1], Route { tokens: vec![0, 1], weights: vec![0.6, 0.25] });
        assert_eq!(routes[2], Route { tokens: vec![0], weights: vec![0.3] });
        // Ties go to the lower index: token 1 takes experts 0 and 1.
        assert_eq!(routes[0], Route { tokens: vec![1], weights: vec![0.25] });
        assert!(routes[3].tokens.is_empty());
        let renormalised = route(&probs, 2, true);
        assert!((renormalised[1].weights[0] - 0.6 / 0.9).abs() < 1e-6);
        assert!((renormalised[2].weights[0] - 0.3 / 0.9).abs() < 1e-6);
        assert_eq!(renormalised[0].weights, vec![0.5]);
    }
}
