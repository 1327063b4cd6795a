//! Where the draft head runs and where draft distributions live when a pipeline spans
//! several devices: `draft_head_parallelism` and `draft_probs_layout` (docs/CUDA.md has the
//! full semantics and how they were inferred).
//!
//! With data parallelism each replica (one device here) runs the target over its own rows,
//! so the hidden states a draft head reads start out spread over the replicas:
//!
//! - head `device0`: one copy of the head, on the first device, drafts the whole batch; the
//!   replicas' hidden states are gathered there first.
//! - head `replica`: each replica holds its own copy and drafts its own rows; nothing moves.
//! - probs `device0`: the step's draft distributions (`[rows, V]` f32, the large tensor
//!   rejection sampling reads) are one buffer on the first device, in batch order.
//! - probs `replica`: each replica keeps the distributions of its own rows, next to the
//!   target logits they will be verified against.
//!
//! Drafts and distributions are the same under every combination: each row is drafted by the
//! same computation with the same counter-based draft uniform; only where it runs changes.

use std::ops::Range;

use candle_core::{Device, Result, Tensor};
use specrs_core::DraftPlacement;
use specrs_core::sampling::{RngStream, SamplingParams, uniform};

use crate::reductions;

/// A draft head: hidden states `[n, H]` on its device to logits `[n, V]` (f32) there.
pub trait DraftHead: Send + Sync {
    fn logits(&self, hidden: &Tensor) -> Result<Tensor>;
}

impl DraftHead for crate::linear::LinearWeight {
    fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        self.matmul_t(hidden)?.to_dtype(candle_core::DType::F32)
    }
}

/// The data-parallel replicas: one device each, owning consecutive rows of the batch.
#[derive(Debug, Clone)]
pub struct ReplicaSet {
    devices: Vec<Device>,
}

impl ReplicaSet {
    pub fn new(devices: Vec<Device>) -> Result<Self> {
        if devices.is_empty() {
            candle_core::bail!("a replica set needs at least one device");
        }
        Ok(Self { devices })
    }

    pub fn len(&self) -> usize {
        self.devices.len()
    }

    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    pub fn device(&self, replica: usize) -> &Device {
        &self.devices[replica]
    }

    /// The first device, where `device0` placements live.
    pub fn device0(&self) -> &Device {
        &self.devices[0]
    }
}

/// The draft-head copies a placement needs: one (on device 0) for `device0`, one per
/// replica (copy `i` on replica `i`'s device) for `replica`.
pub struct PlacedHeads<H> {
    placement: DraftPlacement,
    copies: Vec<H>,
}

impl<H: DraftHead> PlacedHeads<H> {
    pub fn new(placement: DraftPlacement, replicas: &ReplicaSet, copies: Vec<H>) -> Result<Self> {
        let want = match placement {
            DraftPlacement::Device0 => 1,
            DraftPlacement::Replica => replicas.len(),
        };
        if copies.len() != want {
            candle_core::bail!(
                "draft_head_parallelism={} needs {want} head copies, got {}",
                placement.as_str(),
                copies.len()
            );
        }
        Ok(Self { placement, copies })
    }

    pub fn placement(&self) -> DraftPlacement {
        self.placement
    }
}

/// One replica's share of a step's draft distributions.
#[derive(Debug, Clone)]
pub struct ReplicaShard {
    pub replica: usize,
    /// The shard's rows in the batch.
    pub rows: Range<usize>,
    /// `[rows.len(), V]` f32 on the replica's device.
    pub probs: Tensor,
}

/// Where a step's draft distributions live (`draft_probs_layout`).
#[derive(Debug, Clone)]
pub enum DraftProbs {
    /// `[rows, V]` f32 on device 0, in batch order.
    Device0(Tensor),
    /// One shard per replica, on that replica's device.
    PerReplica(Vec<ReplicaShard>),
}

impl DraftProbs {
    /// All rows on device 0, in batch order (copies shards that live elsewhere).
    pub fn gathered(&self, replicas: &ReplicaSet) -> Result<Tensor> {
        match self {
            Self::Device0(t) => Ok(t.clone()),
            Self::PerReplica(shards) => {
                let parts = shards.iter().map(|s| s.probs.to_device(replicas.device0())).collect::<Result<Vec<_>>>()?;
                Tensor::cat(&parts, 0)
            }
        }
    }
}

/// The sampling inputs of a step's drafting rows, in batch order.
#[derive(Debug, Clone, Copy)]
pub struct DraftRows<'a> {
    pub params: &'a [&'a SamplingParams],
    pub seeds: &'a [u64],
    /// Draft index within the row's proposal: the counter of the draft stream.
    pub step: usize,
}

/// A step's drafts and where their distributions live.
#[derive(Debug, Clone)]
pub struct PlacedDrafts {
    pub drafts: Vec<u32>,
    pub probs: DraftProbs,
}

/// Drafts one token per row from `hidden[i]` (`[rows of replica i, H]`, on replica `i`'s
/// device): greedy rows take the argmax, sampled rows draw from their processed distribution
/// with the draft-stream uniform, as the sequential driver does on the host. The head runs
/// where `heads` says, and the distributions end up where `layout` says.
pub fn draft_step<H: DraftHead>(
    replicas: &ReplicaSet,
    heads: &PlacedHeads<H>,
    hidden: &[Tensor],
    rows: DraftRows<'_>,
    layout: DraftPlacement,
) -> Result<PlacedDrafts> {
    if hidden.len() != replicas.len() {
        candle_core::bail!("{} hidden-state shards for {} replicas", hidden.len(), replicas.len());
    }
    let mut ranges = Vec::with_capacity(hidden.len());
    let mut start = 0;
    for h in hidden {
        let n = h.dim(0)?;
        ranges.push(start..start + n);
        start += n;
    }
    if rows.params.len() != start || rows.seeds.len() != start {
        candle_core::bail!(
            "{start} hidden rows but {} parameter sets and {} seeds",
            rows.params.len(),
            rows.seeds.len()
        );
    }
    // Per head copy: the rows it drafts, and its distributions on its own device.
    let per_head: Vec<(Range<usize>, Tensor, Vec<u32>)> = match heads.placement {
        DraftPlacement::Device0 => {
            let gathered = hidden.iter().map(|h| h.to_device(replicas.device0())).collect::<Result<Vec<_>>>()?;
            let logits = heads.copies[0].logits(&Tensor::cat(&gathered, 0)?)?;
            let (probs, drafts) = distributions_and_drafts(&logits, &rows, 0..start)?;
            vec![(0..start, probs, drafts)]
        }
        DraftPlacement::Replica => ranges
            .iter()
            .zip(hidden)
            .zip(&heads.copies)
            .map(|((range, h), head)| {
                let (probs, drafts) = distributions_and_drafts(&head.logits(h)?, &rows, range.clone())?;
                Ok((range.clone(), probs, drafts))
            })
            .collect::<Result<Vec<_>>>()?,
    };
    let drafts: Vec<u32> = per_head.iter().flat_map(|(_, _, d)| d.iter().copied()).collect();
    let probs = match (heads.placement, layout) {
        (DraftPlacement::Device0, DraftPlacement::Device0) => DraftProbs::Device0(per_head[0].1.clone()),
        (DraftPlacement::Device0, DraftPlacement::Replica) => {
            // Scatter device 0's rows to the replicas that verify them.
            let all = &per_head[0].1;
            let shards = ranges
                .iter()
                .enumerate()
                .map(|(replica, range)| {
                    let probs = all.narrow(0, range.start, range.len())?.to_device(replicas.device(replica))?;
                    Ok(ReplicaShard { replica, rows: range.clone(), probs })
                })
                .collect::<Result<Vec<_>>>()?;
            DraftProbs::PerReplica(shards)
        }
        (DraftPlacement::Replica, DraftPlacement::Replica) => DraftProbs::PerReplica(
            per_head
                .into_iter()
                .enumerate()
                .map(|(replica, (rows, probs, _))| ReplicaShard { replica, rows, probs })
                .collect(),
        ),
        (DraftPlacement::Replica, DraftPlacement::Device0) => {
            let parts = per_head.iter().map(|(_, p, _)| p.to_device(replicas.device0())).collect::<Result<Vec<_>>>()?;
            DraftProbs::Device0(Tensor::cat(&parts, 0)?)
        }
    };
    Ok(PlacedDrafts { drafts, probs })
}

/// Distributions `[n, V]` (one-hot at the argmax for greedy rows) and drafts of the batch
/// rows `range`, whose logits are `logits [n, V]`.
fn distributions_and_drafts(logits: &Tensor, rows: &DraftRows<'_>, range: Range<usize>) -> Result<(Tensor, Vec<u32>)> {
    let params = &rows.params[range.clone()];
    let seeds = &rows.seeds[range];
    let argmax = reductions::argmax_rows(logits)?;
    let probs = reductions::distributions(logits, params, &argmax)?;
    let uniforms: Vec<f64> = seeds.iter().map(|&s| uniform(s, RngStream::Draft, rows.step as u64)).collect();
    let samples = reductions::sample_rows(&probs, &uniforms)?;
    let argmax = argmax.to_vec1::<u32>()?;
    let drafts = params.iter().enumerate().map(|(i, p)| if p.is_greedy() { argmax[i] } else { samples[i] }).collect();
    Ok((probs, drafts))
}

#[cfg(test)]
mod tests;
