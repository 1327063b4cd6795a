//! The sparse mixture-of-experts feed-forward of Mixtral, Qwen2-MoE, Qwen3-MoE, GLM-4.5,
//! DeepSeek-V2 / V3, gpt-oss, Hunyuan-A13B and Llama 4: a linear router scores every expert for
//! each token and picks the token's experts (the top-k of a softmax, DeepSeek-V2's group-limited
//! one, DeepSeek-V3's group-limited sigmoid choice or Llama 4's sigmoid, see [`Router`]), each
//! expert (a SwiGLU MLP) runs once on the rows routed to it, and the outputs are summed back with
//! their routing weights (Llama 4 weighs the rows going in instead). Qwen2-MoE adds an always-on
//! shared expert scaled by a sigmoid gate; GLM-4.5, DeepSeek, Hunyuan-A13B and Llama 4 an
//! ungated one.
//!
//! The routing is read on the host (a `[T, experts]` copy per layer): free on the CPU, one
//! small synchronising copy per layer on a GPU, which is why the MoE targets declare no
//! device-graph capture.

use candle_core::{DType, Result, Tensor};

use crate::config::{ExpertKind, MoeConfig, Router};
use crate::error::Result as LoadResult;
use crate::linear::{FusedLinear, Linear};
use crate::models::transformer::Mlp;
use crate::weights::WeightStore;

/// An always-on expert; Qwen2-MoE scales it by a sigmoid gate.
#[derive(Debug, Clone)]
struct SharedExpert {
    mlp: Mlp,
    gate: Option<Linear>,
}

#[derive(Debug, Clone)]
pub struct SparseMoe {
    /// `[experts, hidden]`: one logit per expert.
    router: Linear,
    /// `[experts]` (GLM-4.5's `e_score_correction_bias`): added to the scores to choose
    /// experts, never to weight them.
    choice_bias: Option<Vec<f32>>,
    experts: Vec<Mlp>,
    config: MoeConfig,
    shared: Option<SharedExpert>,
}

/// Tokens routed to one expert and their weights.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Route {
    pub tokens: Vec<u32>,
    pub weights: Vec<f32>,
}

/// Indices of the `k` largest of `values` (the lower index first among equals).
fn top_indices(values: &[f32], k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&a, &b| values[b].total_cmp(&values[a]).then(a.cmp(&b)));
    order.truncate(k);
    order
}

/// DeepSeek-V3's routing of one token's `scores` (sigmoid; ERNIE 4.5's softmax probabilities
/// in one group): experts are chosen by `scores + choice_bias` among the `topk_group` best of
/// `n_group` groups (a group scored by the sum of its two best), the others counting as zero;
/// the chosen experts are weighted by their plain scores, renormalised when `norm_topk_prob`,
/// times `scale`. Returns `(expert, weight)` pairs.
pub fn biased_grouped_choice(
    scores: &[f32],
    choice_bias: Option<&[f32]>,
    top_k: usize,
    (n_group, topk_group): (usize, usize),
    norm_topk_prob: bool,
    scale: f64,
) -> Vec<(usize, f32)> {
    let choice: Vec<f32> = match choice_bias {
        Some(bias) => scores.iter().zip(bias).map(|(s, b)| s + b).collect(),
        None => scores.to_vec(),
    };
    // A group scores the sum of its two best.
    let pair_sum = |g: &[f32]| top_indices(g, 2).iter().map(|&i| g[i]).sum();
    let chosen = top_indices(&within_best_groups(&choice, n_group, topk_group, pair_sum), top_k);
    let total: f32 = if norm_topk_prob { chosen.iter().map(|&e| scores[e]).sum::<f32>() + 1e-20 } else { 1.0 };
    chosen.into_iter().map(|e| (e, (scores[e] / total * scale as f32))).collect()
}

/// DeepSeek-V2's routing of one token's softmax `probs`: its `top_k` experts among the
/// `topk_group` best of `n_group` groups (a group scored by its best expert), weighted by their
/// probabilities, renormalised when `norm_topk_prob` and otherwise times `scale`, as DeepSeek's
/// own gate does (released configs do not renormalise). One group is plain top-k (`greedy`).
pub fn grouped_softmax_choice(
    probs: &[f32],
    top_k: usize,
    (n_group, topk_group): (usize, usize),
    norm_topk_prob: bool,
    scale: f64,
) -> Vec<(usize, f32)> {
    let best = |g: &[f32]| g.iter().copied().fold(f32::MIN, f32::max);
    let chosen = top_indices(&within_best_groups(probs, n_group, topk_group, best), top_k);
    let factor = match norm_topk_prob && top_k > 1 {
        true => 1.0 / (chosen.iter().map(|&e| probs[e]).sum::<f32>() + 1e-20),
        false => scale as f32,
    };
    chosen.into_iter().map(|e| (e, probs[e] * factor)).collect()
}

/// `values` with every expert outside the `topk_group` best of `n_group` equal groups (scored
/// by `group_score`) set to zero.
fn within_best_groups(
    values: &[f32],
    n_group: usize,
    topk_group: usize,
    group_score: impl Fn(&[f32]) -> f32,
) -> Vec<f32> {
    let per_group = values.len() / n_group;
    let group_scores: Vec<f32> = values.chunks(per_group).map(group_score).collect();
    let groups = top_indices(&group_scores, topk_group);
    values.iter().enumerate().map(|(e, &v)| if groups.contains(&(e / per_group)) { v } else { 0.0 }).collect()
}

/// Routes each row of `probs [T, experts]` to its `top_k` most probable experts (the lower
/// index first among equals), weights renormalised to sum to one when `norm_topk_prob`.
pub fn route(probs: &[Vec<f32>], top_k: usize, norm_topk_prob: bool) -> Vec<Route> {
    let num_experts = probs.first().map_or(0, Vec::len);
    let mut routes = vec![Route::default(); num_experts];
    for (token, p) in probs.iter().enumerate() {
        let chosen = top_indices(p, top_k);
        let total: f32 = if norm_topk_prob { chosen.iter().map(|&e| p[e]).sum() } else { 1.0 };
        for &e in &chosen {
            routes[e].tokens.push(token as u32);
            routes[e].weights.push(p[e] / total);
        }
    }
    routes
}

/// Phi-3.5-MoE's sparsemixer at inference over one token's router `logits`: the best expert
/// (the lower index among equals), weighted by its softmax among the experts `j` whose logits
/// pass `(best - l_j) / max(|l_j|, best) <= 2 · jitter_eps`; then the best of the others,
/// weighted by its softmax among the others that pass the same test against it. The two
/// weights are not renormalised.
pub fn sparse_mixer_choice(logits: &[f32], jitter_eps: f32) -> Vec<(usize, f32)> {
    // The best of `candidates` (logits, -inf where ruled out) and its weight.
    let pick = |candidates: &[f32]| -> (usize, f32) {
        let best = top_indices(candidates, 1)[0];
        let top = candidates[best];
        // `top == l` keeps the best itself where both are zero (0 / 0 decides nothing).
        let total: f32 = candidates
            .iter()
            .zip(logits)
            .filter(|&(_, &l)| (top - l) / l.abs().max(top) <= 2.0 * jitter_eps || top == l)
            .map(|(&c, _)| (c - top).exp())
            .sum();
        (best, 1.0 / total)
    };
    let (first, w1) = pick(logits);
    let mut others = logits.to_vec();
    others[first] = f32::NEG_INFINITY;
    let (second, w2) = pick(&others);
    vec![(first, w1), (second, w2)]
}

/// Each expert's tokens and weights from every token's `(expert, weight)` choice, in order.
fn gather_routes(num_experts: usize, choices: impl Iterator<Item = Vec<(usize, f32)>>) -> Vec<Route> {
    let mut routes = vec![Route::default(); num_experts];
    for (token, choice) in choices.enumerate() {
        for (e, w) in choice {
            routes[e].tokens.push(token as u32);
            routes[e].weights.push(w);
        }
    }
    routes
}

/// SwiGLU experts stored fused: `gate_up_proj` holding each expert's gate then up projection
/// and `down_proj`, either as linear weights (`[E, 2I, H]`, `[E, H, I]`: transformers 5) or
/// as right-hand matrices (`[E, H, 2I]`, `[E, I, H]`: Qwen3-VL-MoE), told apart by shape.
fn load_fused_experts(store: &WeightStore, prefix: &str, hidden: usize, moe: &MoeConfig) -> LoadResult<Vec<Mlp>> {
    let (experts, width) = (moe.num_experts, moe.expert_intermediate_size);
    let host = |name: &str| -> LoadResult<Tensor> {
        Ok(store
            .tensor_any_shape(&format!("{prefix}.{name}"))?
            .to_dtype(DType::F32)?
            .to_device(&candle_core::Device::Cpu)?)
    };
    let (gate_up, down) = (host("gate_up_proj")?, host("down_proj")?);
    // Linear weights, or right-hand matrices; where hidden = 2I the down projection decides.
    let linear = ([experts, 2 * width, hidden], [experts, hidden, width]);
    let right_hand = ([experts, hidden, 2 * width], [experts, width, hidden]);
    let fits = |(g, d): ([usize; 3], [usize; 3])| gate_up.dims() == g && down.dims() == d;
    let transposed = match (fits(linear), fits(right_hand)) {
        (true, false) => false,
        (false, true) => true,
        _ => {
            return Err(crate::error::ModelError::ShapeMismatch {
                name: format!("{prefix}.gate_up_proj and {prefix}.down_proj"),
                source_desc: store.description().to_string(),
                expected: [linear.0, linear.1].concat(),
                got: [gate_up.dims(), down.dims()].concat(),
            });
        }
    };
    // Each expert's weights as `[out, in]` linear weights.
    let as_linear = |w: Tensor| -> LoadResult<Linear> {
        let w = if transposed { w.t()?.contiguous()? } else { w };
        let (out, inp) = w.dims2()?;
        Ok(Linear::new(store.place_dense(&w, None)?, None, out, inp))
    };
    let out_dim = if transposed { 1 } else { 0 };
    (0..experts)
        .map(|e| {
            let fused = gate_up.get(e)?;
            let gate = as_linear(fused.narrow(out_dim, 0, width)?.contiguous()?)?;
            let up = as_linear(fused.narrow(out_dim, width, width)?.contiguous()?)?;
            Ok(Mlp::new(FusedLinear::new(vec![gate, up])?, as_linear(down.get(e)?)?))
        })
        .collect()
}

/// The router's `[experts]` correction bias, `{prefix}.gate.e_score_correction_bias` (ERNIE
/// 4.5 stores it as `[1, experts]`).
fn choice_bias(store: &WeightStore, prefix: &str, experts: usize) -> LoadResult<Vec<f32>> {
    let name = format!("{prefix}.gate.e_score_correction_bias");
    let bias = store.tensor_any_shape(&name)?;
    match bias.dims() {
        [e] | [1, e] if *e == experts => Ok(bias.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?),
        dims => Err(crate::error::ModelError::ShapeMismatch {
            name,
            source_desc: store.description().to_string(),
            expected: vec![experts],
            got: dims.to_vec(),
        }),
    }
}

impl SparseMoe {
    /// Loads `{prefix}.gate` (with GLM-4.5's `gate.e_score_correction_bias`),
    /// `{prefix}.experts.{e}.{gate,up,down}_proj`, and Qwen2-MoE's `shared_expert.*` with
    /// `shared_expert_gate`, or GLM-4.5's `shared_experts.*`.
    ///
    /// gpt-oss's mixture is stored otherwise: its biased `{prefix}.router` and its experts
    /// (`crate::models::gpt_oss::load_experts`).
    pub fn load(store: &WeightStore, prefix: &str, hidden: usize, moe: &MoeConfig) -> LoadResult<Self> {
        if let ExpertKind::GptOss { swiglu_limit } = moe.experts {
            let router = store.linear(&format!("{prefix}.router"), moe.num_experts, hidden, true)?;
            let experts = crate::models::gpt_oss::load_experts(store, prefix, hidden, moe, swiglu_limit)?;
            return Ok(Self { router, choice_bias: None, experts, config: moe.clone(), shared: None });
        }
        let router = store.linear(&format!("{prefix}.gate"), moe.num_experts, hidden, false)?;
        let choice_bias = match moe.router {
            Router::GroupedSigmoid { .. } | Router::BiasedSoftmax => Some(choice_bias(store, prefix, moe.num_experts)?),
            Router::Softmax
            | Router::GroupedSoftmax { .. }
            | Router::InputScaledSigmoid
            | Router::SparseMixer { .. } => None,
        };
        let experts = match moe.experts {
            ExpertKind::Stacked => crate::models::granite::load_experts(store, prefix, hidden, moe)?,
            _ if store.contains(&format!("{prefix}.experts.gate_up_proj")) => {
                load_fused_experts(store, &format!("{prefix}.experts"), hidden, moe)?
            }
            _ => (0..moe.num_experts)
                .map(|e| Mlp::load(store, &format!("{prefix}.experts.{e}"), hidden, moe.expert_intermediate_size))
                .collect::<LoadResult<Vec<_>>>()?,
        };
        let shared = match &moe.shared_expert {
            Some(s) if s.gated => Some(SharedExpert {
                mlp: Mlp::load(store, &format!("{prefix}.shared_expert"), hidden, s.intermediate_size)?,
                gate: Some(store.linear(&format!("{prefix}.shared_expert_gate"), 1, hidden, false)?),
            }),
            Some(s) => Some(SharedExpert {
                mlp: Mlp::load(store, &format!("{prefix}.shared_experts"), hidden, s.intermediate_size)?,
                gate: None,
            }),
            None => None,
        };
        Ok(Self { router, choice_bias, experts, config: moe.clone(), shared })
    }

    /// Each token's experts and weights from the router's `logits [T, E]` (f32).
    fn routes(&self, logits: &Tensor) -> Result<Vec<Route>> {
        let moe = &self.config;
        match moe.router {
            Router::Softmax => {
                let probs = candle_nn::ops::softmax_last_dim(logits)?.to_vec2::<f32>()?;
                Ok(route(&probs, moe.top_k, moe.norm_topk_prob))
            }
            Router::InputScaledSigmoid => {
                // Chosen by logit; sigmoid is monotonic, so by weight too.
                let weights = candle_nn::ops::sigmoid(logits)?.to_vec2::<f32>()?;
                Ok(route(&weights, moe.top_k, false))
            }
            Router::BiasedSoftmax => {
                let probs = candle_nn::ops::softmax_last_dim(logits)?.to_vec2::<f32>()?;
                Ok(gather_routes(
                    moe.num_experts,
                    probs
                        .iter()
                        .map(|p| biased_grouped_choice(p, self.choice_bias.as_deref(), moe.top_k, (1, 1), true, 1.0)),
                ))
            }
            Router::GroupedSigmoid { n_group, topk_group, routed_scaling_factor } => {
                let scores = candle_nn::ops::sigmoid(logits)?.to_vec2::<f32>()?;
                Ok(gather_routes(
                    moe.num_experts,
                    scores.iter().map(|s| {
                        biased_grouped_choice(
                            s,
                            self.choice_bias.as_deref(),
                            moe.top_k,
                            (n_group, topk_group),
                            moe.norm_topk_prob,
                            routed_scaling_factor,
                        )
                    }),
                ))
            }
            Router::SparseMixer { jitter_eps } => {
                let logits = logits.to_vec2::<f32>()?;
                Ok(gather_routes(moe.num_experts, logits.iter().map(|l| sparse_mixer_choice(l, jitter_eps as f32))))
            }
            Router::GroupedSoftmax { n_group, topk_group, routed_scaling_factor } => {
                let probs = candle_nn::ops::softmax_last_dim(logits)?.to_vec2::<f32>()?;
                Ok(gather_routes(
                    moe.num_experts,
                    probs.iter().map(|p| {
                        grouped_softmax_choice(
                            p,
                            moe.top_k,
                            (n_group, topk_group),
                            moe.norm_topk_prob,
                            routed_scaling_factor,
                        )
                    }),
                ))
            }
        }
    }

    /// A mixture from its parts (benchmarks, converters): the router `[E, H]`, the experts, and
    /// for GLM-4.5's routing the correction bias. Shared experts are loaded from checkpoints only.
    pub fn from_parts(router: Linear, experts: Vec<Mlp>, choice_bias: Option<Vec<f32>>, config: MoeConfig) -> Self {
        Self { router, choice_bias, experts, config, shared: None }
    }

    pub fn size_in_bytes(&self) -> usize {
        self.router.weight().size_in_bytes()
            + self.experts.iter().map(Mlp::size_in_bytes).sum::<usize>()
            + self
                .shared
                .as_ref()
                .map_or(0, |s| s.mlp.size_in_bytes() + s.gate.as_ref().map_or(0, |g| g.weight().size_in_bytes()))
    }

    /// `x [T, H] -> [T, H]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (t, h) = x.dims2()?;
        let moe = &self.config;
        // 1. Router: [T, H] -> [T, E] logits, routed in f32 as transformers routes them.
        let logits = self.router.forward(x)?.to_dtype(DType::F32)?;
        // 2. Each expert once over its rows: [n, H] -> [n, H], weighted, added back into [T, H].
        let mut out = Tensor::zeros((t, h), x.dtype(), x.device())?;
        for (expert, r) in self.experts.iter().zip(self.routes(&logits)?) {
            if r.tokens.is_empty() {
                continue;
            }
            let n = r.tokens.len();
            let rows = Tensor::from_vec(r.tokens, n, x.device())?;
            let weights = Tensor::from_vec(r.weights, (n, 1), x.device())?.to_dtype(x.dtype())?;
            let routed = x.index_select(&rows, 0)?;
            let y = match moe.router {
                // Llama 4 weighs what goes in; the SwiGLU is not linear, so it differs.
                Router::InputScaledSigmoid => expert.forward(&routed.broadcast_mul(&weights)?)?,
                _ => expert.forward(&routed)?.broadcast_mul(&weights)?,
            };
            out = out.index_add(&rows, &y, 0)?;
        }
        // 3. The shared expert: + shared(x), scaled by sigmoid(gate(x)) on Qwen2-MoE.
        if let Some(shared) = &self.shared {
            let y = shared.mlp.forward(x)?;
            out = match &shared.gate {
                Some(gate) => (out + y.broadcast_mul(&candle_nn::ops::sigmoid(&gate.forward(x)?)?)?)?,
                None => (out + y)?,
            };
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_mixer_weighs_each_pick_among_its_near_rivals_without_renormalising() {
        // Expert 0 leads expert 1 by a relative 0.01 (within 2 · 0.01), the others are far:
        // its weight is its softmax against expert 1 alone. Expert 1, picked next, has no near
        // rival left, so it weighs 1 and the pair sums past one.
        let choice = sparse_mixer_choice(&[1.0, 0.99, -2.0, 0.5], 0.01);
        let w1 = 1.0 / (1.0 + (-0.01f32).exp());
        assert_eq!((choice[0].0, choice[1].0), (0, 1));
        assert!((choice[0].1 - w1).abs() < 1e-6 && (choice[1].1 - 1.0).abs() < 1e-6, "{choice:?}");
        // With no jitter allowed, each pick weighs 1.
        let strict = sparse_mixer_choice(&[1.0, 0.99, -2.0, 0.5], 0.0);
        assert_eq!(strict, vec![(0, 1.0), (1, 1.0)]);
    }

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

    #[test]
    fn grouped_sigmoid_chooses_by_biased_scores_within_the_best_groups_and_weights_by_plain_scores() {
        // Two groups of three: group 0's two best biased scores sum to 1.5, group 1's to 1.3.
        let scores = [0.9, 0.1, 0.5, 0.2, 0.7, 0.6];
        let bias = [0.0, 0.0, 0.1, 0.0, 0.0, 0.0];
        let chosen = biased_grouped_choice(&scores, Some(&bias), 2, (2, 1), false, 1.0);
        assert_eq!(chosen, vec![(0, 0.9), (2, 0.5)], "experts 4 and 5 sit in the dropped group");
        // Both groups allowed: 4 (0.7) beats 2 (0.6 biased); renormalised and scaled by 2.5.
        let chosen = biased_grouped_choice(&scores, Some(&bias), 2, (2, 2), true, 2.5);
        let (w0, w4) = (0.9 / 1.6 * 2.5, 0.7 / 1.6 * 2.5);
        assert_eq!(chosen.iter().map(|c| c.0).collect::<Vec<_>>(), vec![0, 4]);
        assert!((chosen[0].1 - w0).abs() < 1e-6 && (chosen[1].1 - w4).abs() < 1e-6);
        // The bias steers the choice only: a large bias picks expert 1 at its plain score.
        let chosen = biased_grouped_choice(&scores, Some(&[0.0, 5.0, 0.0, 0.0, 0.0, 0.0]), 1, (1, 1), false, 1.0);
        assert_eq!(chosen, vec![(1, 0.1)]);
    }

    #[test]
    fn grouped_softmax_scores_a_group_by_its_best_expert_and_scales_unless_renormalising() {
        // Group 0's best is 0.3, group 1's 0.34: only group 1 is open, though group 0 holds
        // the next-best experts.
        let probs = [0.3, 0.1, 0.2, 0.34, 0.04, 0.02];
        let chosen = grouped_softmax_choice(&probs, 2, (2, 1), false, 16.0);
        assert_eq!(chosen.iter().map(|c| c.0).collect::<Vec<_>>(), vec![3, 4]);
        assert!((chosen[0].1 - 0.34 * 16.0).abs() < 1e-5 && (chosen[1].1 - 0.04 * 16.0).abs() < 1e-5);
        // One group (`greedy`): plain top-k; renormalised weights are not scaled.
        let chosen = grouped_softmax_choice(&probs, 2, (1, 1), true, 16.0);
        assert_eq!(chosen.iter().map(|c| c.0).collect::<Vec<_>>(), vec![3, 0]);
        assert!((chosen[0].1 - 0.34 / 0.64).abs() < 1e-6 && (chosen[1].1 - 0.3 / 0.64).abs() < 1e-6);
    }
}
