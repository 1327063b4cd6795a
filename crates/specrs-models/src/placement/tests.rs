//! Placement on two logical devices. Both are `Device::Cpu` here, so "on replica i" is
//! checked through the bookkeeping (which head copy ran which rows, which shard holds which
//! rows); the tensors' contents are checked for equality across every combination.

use std::sync::Mutex;

use candle_core::{Device, Tensor};
use specrs_core::DraftPlacement;
use specrs_core::sampling::SamplingParams;

use super::*;
use crate::testing::random_tensor;

const V: usize = 64;
const H: usize = 16;

/// A head copy that records how many rows each call drafted.
struct RecordingHead {
    weight: Tensor,
    calls: Mutex<Vec<usize>>,
}

impl RecordingHead {
    fn new(device: &Device) -> Self {
        Self {
            weight: random_tensor(&[V, H], 2.0, 11).unwrap().to_device(device).unwrap(),
            calls: Mutex::new(Vec::new()),
        }
    }

    fn calls(&self) -> Vec<usize> {
        self.calls.lock().unwrap().clone()
    }
}

impl DraftHead for RecordingHead {
    fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        self.calls.lock().unwrap().push(hidden.dim(0)?);
        hidden.matmul(&self.weight.t()?)
    }
}

#[test]
fn replicas_draft_their_own_rows_and_keep_their_distributions_while_device0_gathers() {
    let replicas = ReplicaSet::new(vec![Device::Cpu, Device::Cpu]).unwrap();
    let hidden = vec![random_tensor(&[3, H], 1.0, 1).unwrap(), random_tensor(&[2, H], 1.0, 2).unwrap()];
    let sampled = SamplingParams { temperature: 0.9, top_k: 20, ..Default::default() };
    let greedy = SamplingParams::greedy();
    let params: Vec<&SamplingParams> = vec![&sampled, &greedy, &sampled, &sampled, &greedy];
    let seeds = [5u64, 6, 7, 8, 9];
    let rows = DraftRows { params: &params, seeds: &seeds, step: 1 };

    let mut results = Vec::new();
    for head_placement in [DraftPlacement::Device0, DraftPlacement::Replica] {
        for layout in [DraftPlacement::Device0, DraftPlacement::Replica] {
            let copies: Vec<RecordingHead> = match head_placement {
                DraftPlacement::Device0 => vec![RecordingHead::new(replicas.device0())],
                DraftPlacement::Replica => (0..2).map(|i| RecordingHead::new(replicas.device(i))).collect(),
            };
            let heads = PlacedHeads::new(head_placement, &replicas, copies).unwrap();
            let out = draft_step(&replicas, &heads, &hidden, rows, layout).unwrap();
            // Who drafted what.
            let calls: Vec<Vec<usize>> = heads.copies.iter().map(RecordingHead::calls).collect();
            match head_placement {
                DraftPlacement::Device0 => assert_eq!(calls, vec![vec![5]], "device0 drafts the whole batch"),
                DraftPlacement::Replica => assert_eq!(calls, vec![vec![3], vec![2]], "each copy drafts its rows"),
            }
            // Where the distributions are.
            match (&out.probs, layout) {
                (DraftProbs::Device0(t), DraftPlacement::Device0) => {
                    assert_eq!(t.dims(), &[5, V]);
                    assert!(t.device().same_device(replicas.device0()));
                }
                (DraftProbs::PerReplica(shards), DraftPlacement::Replica) => {
                    let layout: Vec<(usize, std::ops::Range<usize>, usize)> =
                        shards.iter().map(|s| (s.replica, s.rows.clone(), s.probs.dim(0).unwrap())).collect();
                    assert_eq!(layout, vec![(0, 0..3, 3), (1, 3..5, 2)]);
                    for s in shards {
                        assert!(s.probs.device().same_device(replicas.device(s.replica)));
                    }
                }
                (probs, layout) => panic!("layout {layout:?} produced {probs:?}"),
            }
            results.push((out.drafts.clone(), out.probs.gathered(&replicas).unwrap()));
        }
    }
    // The same drafts and distributions under every placement.
    let (drafts0, probs0) = &results[0];
    for (drafts, probs) in &results[1..] {
        assert_eq!(drafts, drafts0);
        let diff = (probs - probs0).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        assert!(diff < 1e-6, "distributions differ by {diff}");
    }
    // Greedy rows are one-hot at their draft; sampled rows drew a token they give mass to.
    let probs = probs0.to_vec2::<f32>().unwrap();
    for (i, &d) in drafts0.iter().enumerate() {
        assert!(probs[i][d as usize] > 0.0);
        if params[i].is_greedy() {
            assert_eq!(probs[i][d as usize], 1.0);
        }
    }
}

#[test]
fn placements_check_their_copies_and_shards() {
    let replicas = ReplicaSet::new(vec![Device::Cpu, Device::Cpu]).unwrap();
    let one = vec![RecordingHead::new(&Device::Cpu)];
    assert!(PlacedHeads::new(DraftPlacement::Replica, &replicas, one).is_err());
    let heads = PlacedHeads::new(DraftPlacement::Device0, &replicas, vec![RecordingHead::new(&Device::Cpu)]).unwrap();
    let params: Vec<&SamplingParams> = vec![];
    let rows = DraftRows { params: &params, seeds: &[], step: 0 };
    let hidden = vec![random_tensor(&[1, H], 1.0, 1).unwrap()];
    assert!(draft_step(&replicas, &heads, &hidden, rows, DraftPlacement::Device0).is_err());
    assert!(ReplicaSet::new(Vec::new()).is_err());
}
