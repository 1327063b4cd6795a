//! Capture planning, and the fixed-shape step against the ragged one on CPU tensors.

use candle_core::{D, DType, Device, Tensor};
use specrs_core::width::{AdaptiveWidthController, AdaptiveWidthParams, VerifyWidthRange, VerifyWidthSchedule};

use super::*;
use crate::attention::{AttentionShape, fixed_attention, reference_attention};
use crate::batch::BatchRow;
use crate::config::Architecture;
use crate::kv_cache::PagedKvCache;
use crate::models::{CausalLm, load_causal_lm};
use crate::testing::{self, TinyShape};
use crate::weights::ModelDType;

fn keys(plan: &CapturePlan) -> Vec<(usize, usize)> {
    plan.keys().map(|k| (k.batch, k.width)).collect()
}

#[test]
fn nothing_is_captured_without_architecture_support() {
    assert!(CapturePlan::new(false, 64, WidthSource::Fixed(3)).is_empty());
    assert!(CapturePlan::new(true, 0, WidthSource::Fixed(3)).is_empty());
}

#[test]
fn fixed_width_captures_power_of_two_batches_and_the_maximum() {
    let plan = CapturePlan::new(true, 12, WidthSource::Fixed(3));
    assert_eq!(keys(&plan), vec![(1, 3), (2, 3), (4, 3), (8, 3), (12, 3)]);
    // A batch of 5 pads to 8; 13 rows exceed every graph and run eagerly.
    assert_eq!(plan.key_for(5, 3), Some(GraphKey { batch: 8, width: 3 }));
    assert_eq!(plan.key_for(13, 3), None);
    // Plain decoding is width 0.
    assert_eq!(keys(&CapturePlan::new(true, 2, WidthSource::Fixed(0))), vec![(1, 0), (2, 0)]);
}

#[test]
fn adaptive_widths_below_the_min_batch_size_capture_only_the_widest() {
    let params = AdaptiveWidthParams { min_batch_size: 4, ..Default::default() };
    let controller = AdaptiveWidthController::new(vec![1, 2, 4], params).unwrap();
    let plan = CapturePlan::new(true, 8, WidthSource::Adaptive(&controller));
    // Buckets 1 and 2 serve batches below 4: widest only. Bucket 4 serves 3 (widest) and 4
    // (every width); bucket 8 serves 5..=8 (every width).
    assert_eq!(keys(&plan), vec![(1, 4), (2, 4), (4, 1), (4, 2), (4, 4), (8, 1), (8, 2), (8, 4)]);
    // A narrow choice for a small batch rounds up to a captured width.
    assert_eq!(plan.key_for(2, 1), Some(GraphKey { batch: 2, width: 4 }));
    assert_eq!(plan.key_for(6, 2), Some(GraphKey { batch: 8, width: 2 }));
    assert_eq!(plan.key_for(6, 3), Some(GraphKey { batch: 8, width: 4 }));
    // What the controller itself would verify at a small batch is always captured.
    let mut c = controller.clone();
    for b in 1..=8 {
        let w = c.next_step_width(b);
        assert!(plan.key_for(b, w).is_some_and(|k| k.width == w), "batch {b} width {w}");
    }
}

#[test]
fn schedules_capture_every_width_a_padded_bucket_serves() {
    let ranges = [VerifyWidthRange::new(1, 2, 4), VerifyWidthRange::new(3, 8, 2)];
    let schedule = VerifyWidthSchedule::build(&ranges, 8, 4).unwrap();
    let plan = CapturePlan::new(true, 8, WidthSource::Schedule(&schedule));
    assert_eq!(keys(&plan), vec![(1, 4), (2, 4), (4, 2), (8, 2)]);
}

const SHAPE: TinyShape =
    TinyShape { vocab: 40, hidden: 32, layers: 2, heads: 4, kv_heads: 2, head_dim: 8, intermediate: 48 };

fn tiny_model(dir: &std::path::Path) -> CausalLm {
    let cfg = testing::target_config(Architecture::Llama, &SHAPE, false);
    let tensors = testing::random_target(Architecture::Llama, &SHAPE, false, 5).unwrap();
    testing::write_checkpoint(dir, &cfg, &tensors).unwrap();
    load_causal_lm(dir, &Device::Cpu, ModelDType::F32).unwrap().0
}

/// Block size 4; sequence A owns blocks [3, 0], B owns [5, 1]; slot 63 is scratch.
fn verify_batch() -> ForwardBatch {
    // A: 5 cached tokens + 3 fed (last committed + 2 drafts); B: 2 cached + 2 fed.
    let slot = |table: &[u32], x: usize| table[x / 4] * 4 + (x % 4) as u32;
    let (ta, tb) = ([3u32, 0], [5u32, 1]);
    ForwardBatch {
        input_ids: vec![7, 11, 13, 21, 22],
        positions: vec![5, 6, 7, 2, 3],
        rows: vec![
            BatchRow { query_start: 0, query_len: 3, context_len: 8, block_table_start: 0, block_table_len: 2 },
            BatchRow { query_start: 3, query_len: 2, context_len: 4, block_table_start: 2, block_table_len: 2 },
        ],
        slot_mapping: vec![slot(&ta, 5), slot(&ta, 6), slot(&ta, 7), slot(&tb, 2), slot(&tb, 3)],
        block_tables: vec![3, 0, 5, 1],
        block_size: 4,
        logits_indices: (0..5).collect(),
        ..Default::default()
    }
}

fn prefill(model: &CausalLm, kv: &PagedKvCache) {
    let slot = |table: &[u32], x: usize| table[x / 4] * 4 + (x % 4) as u32;
    let (ta, tb) = ([3u32, 0], [5u32, 1]);
    let batch = ForwardBatch {
        input_ids: vec![1, 2, 3, 4, 5, 9, 8],
        positions: vec![0, 1, 2, 3, 4, 0, 1],
        rows: vec![
            BatchRow { query_start: 0, query_len: 5, context_len: 5, block_table_start: 0, block_table_len: 2 },
            BatchRow { query_start: 5, query_len: 2, context_len: 2, block_table_start: 2, block_table_len: 2 },
        ],
        slot_mapping: (0..5).map(|x| slot(&ta, x)).chain((0..2).map(|x| slot(&tb, x))).collect(),
        block_tables: vec![3, 0, 5, 1],
        block_size: 4,
        ..Default::default()
    };
    model.forward(&batch, kv).unwrap();
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    crate::testing::max_abs_diff(a, b).unwrap()
}

#[test]
fn fixed_attention_matches_the_reference_on_a_padded_layout() {
    let shape = AttentionShape::new(4, 2, 8, 8f32.powf(-0.5));
    let cache = PagedKvCache::new(1, 16, 4, 2, 8, DType::F32, &Device::Cpu).unwrap();
    let (kc, vc) = cache.layer(0);
    kc.slice_set(&testing::random_tensor(&[64, 16], 1.0, 1).unwrap(), 0, 0).unwrap();
    vc.slice_set(&testing::random_tensor(&[64, 16], 1.0, 2).unwrap(), 0, 0).unwrap();
    for window in [None, Some(3)] {
        let batch = ForwardBatch { sliding_window: window, ..verify_batch() };
        let q = testing::random_tensor(&[5, 4, 8], 1.0, 3).unwrap();
        let want = reference_attention(&q, kc, vc, &batch, &shape).unwrap();
        // Three rows of three queries: row 1's last query and row 2 are padding.
        let key = GraphKey { batch: 3, width: 2 };
        let inputs = StepInputs::new(key, 12, 63, &Device::Cpu).unwrap();
        inputs.fill(&batch).unwrap();
        let layout = [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)];
        let mut q_fixed = Tensor::zeros((9, 4, 8), DType::F32, &Device::Cpu).unwrap();
        for (flat, &(r, j)) in layout.iter().enumerate() {
            q_fixed = q_fixed
                .slice_assign(
                    &[fixed_output_row(key, r, j)..fixed_output_row(key, r, j) + 1, 0..4, 0..8],
                    &q.narrow(0, flat, 1).unwrap(),
                )
                .unwrap();
        }
        let got = fixed_attention(&q_fixed, kc, vc, &inputs.attention, &shape).unwrap();
        assert!(got.flatten_all().unwrap().to_vec1::<f32>().unwrap().iter().all(|x| x.is_finite()));
        for (flat, &(r, j)) in layout.iter().enumerate() {
            let diff = max_diff(&got.get(fixed_output_row(key, r, j)).unwrap(), &want.get(flat).unwrap());
            assert!(diff < 1e-5, "window {window:?} row {r} query {j}: {diff}");
        }
    }
}

#[test]
fn the_fixed_step_gives_the_ragged_steps_logits_and_keys() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let kv = model.new_kv_cache(16, 4).unwrap();
    prefill(&model, &kv);
    let batch = verify_batch();
    let want = model.forward(&batch, &kv).unwrap().logits.unwrap();
    let (k_after, _) = kv.layer(1);
    let k_after = k_after.copy().unwrap();

    // The same step on the fixed layout (4 rows, width 2): it rewrites the verify slots with
    // the same keys and values, and its logits at the real queries are the ragged ones.
    let key = GraphKey { batch: 4, width: 2 };
    let inputs = StepInputs::new(key, 16, 63, &Device::Cpu).unwrap();
    inputs.fill(&batch).unwrap();
    let got = model.forward_fixed(&inputs, &kv, &[], false).unwrap().logits.unwrap();
    assert_eq!(got.dims(), &[12, SHAPE.vocab]);
    let layout = [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)];
    for (flat, &(r, j)) in layout.iter().enumerate() {
        let diff = max_diff(&got.get(fixed_output_row(key, r, j)).unwrap(), &want.get(flat).unwrap());
        assert!(diff < 1e-4, "row {r} query {j}: {diff}");
    }
    // The same keys land in the same slots; padding only touched the scratch slot.
    let (k_fixed, _) = kv.layer(1);
    let real_rows = Tensor::arange(0u32, 63, &Device::Cpu).unwrap();
    let diff = max_diff(&k_fixed.index_select(&real_rows, 0).unwrap(), &k_after.index_select(&real_rows, 0).unwrap());
    assert!(diff < 1e-5, "keys differ by {diff}");
    // Greedy tokens agree exactly.
    let argmax = |t: &Tensor| t.argmax(D::Minus1).unwrap().to_vec1::<u32>().unwrap();
    let fixed_rows: Vec<u32> = layout.iter().map(|&(r, j)| fixed_output_row(key, r, j) as u32).collect();
    let picked = got.index_select(&Tensor::new(fixed_rows.as_slice(), &Device::Cpu).unwrap(), 0).unwrap();
    assert_eq!(argmax(&picked), argmax(&want));
}

#[test]
fn fixed_steps_return_the_ragged_forwards_outputs_in_its_order() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let outputs = StepOutputs { taps: vec![1, 0, SHAPE.layers], want_final_hidden: true };
    // Logits for the rows' last two tokens only, in an order other than the tokens'.
    let batch = ForwardBatch {
        logits_indices: vec![4, 1, 2],
        taps: outputs.taps.clone(),
        want_final_hidden: true,
        ..verify_batch()
    };
    let ragged_kv = model.new_kv_cache(16, 4).unwrap();
    prefill(&model, &ragged_kv);
    let want = model.forward(&batch, &ragged_kv).unwrap();

    let kv = model.new_kv_cache(16, 4).unwrap();
    prefill(&model, &kv);
    let plan = CapturePlan::new(true, 3, WidthSource::Fixed(2));
    let steps = FixedSteps::new(&model, &kv, plan, 16, 63, outputs, true).unwrap();
    assert!(!steps.is_captured(), "a CPU model runs its fixed steps eagerly");
    let (key, got) = steps.run(&model, &kv, &batch, 2).unwrap().unwrap();
    assert_eq!(key, GraphKey { batch: 2, width: 2 });
    assert!(max_diff(got.logits.as_ref().unwrap(), want.logits.as_ref().unwrap()) < 1e-4);
    assert_eq!(got.taps.len(), 3);
    for (i, (g, w)) in got.taps.iter().zip(&want.taps).enumerate() {
        assert_eq!(g.dims(), w.dims(), "tap {i}");
        assert!(max_diff(g, w) < 1e-4, "tap {i}");
    }
    assert!(max_diff(got.final_hidden.as_ref().unwrap(), want.final_hidden.as_ref().unwrap()) < 1e-4);
    // Its keys and values landed where the ragged step put them.
    for layer in 0..SHAPE.layers {
        let real_rows = Tensor::arange(0u32, 63, &Device::Cpu).unwrap();
        let (k, v) = kv.layer(layer);
        let (k_want, v_want) = ragged_kv.layer(layer);
        for (got, want) in [(k, k_want), (v, v_want)] {
            let diff = max_diff(&got.index_select(&real_rows, 0).unwrap(), &want.index_select(&real_rows, 0).unwrap());
            assert!(diff < 1e-5, "layer {layer}: {diff}");
        }
    }
}

#[test]
fn fixed_steps_leave_what_they_cannot_hold_to_the_ragged_forward() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let kv = model.new_kv_cache(16, 4).unwrap();
    let steps = |max_batch: usize, max_keys: usize| {
        let plan = CapturePlan::new(true, max_batch, WidthSource::Fixed(2));
        FixedSteps::new(&model, &kv, plan, max_keys, 63, StepOutputs::default(), false).unwrap()
    };
    let run = |s: &FixedSteps, b: &ForwardBatch| s.run(&model, &kv, b, 2).unwrap().err();
    assert_eq!(run(&steps(1, 16), &verify_batch()), Some(Uncaptured::NoKey), "two rows, one-row graphs");
    assert_eq!(run(&steps(2, 4), &verify_batch()), Some(Uncaptured::DoesNotFit), "eight keys, room for four");
    let tapped = ForwardBatch { taps: vec![1], ..verify_batch() };
    assert_eq!(run(&steps(2, 16), &tapped), Some(Uncaptured::OtherOutputs));
    let past_rope = ForwardBatch { positions: vec![5, 6, 7, 2, u32::MAX], ..verify_batch() };
    assert_eq!(run(&steps(2, 16), &past_rope), Some(Uncaptured::DoesNotFit));
}

#[test]
fn batches_that_do_not_fit_are_refused() {
    let inputs = StepInputs::new(GraphKey { batch: 1, width: 2 }, 16, 63, &Device::Cpu).unwrap();
    assert!(!inputs.fits(&verify_batch()), "two rows do not fit one");
    assert!(inputs.fill(&verify_batch()).is_err());
    let narrow = StepInputs::new(GraphKey { batch: 2, width: 1 }, 16, 63, &Device::Cpu).unwrap();
    assert!(!narrow.fits(&verify_batch()), "three queries do not fit two");
    let short = StepInputs::new(GraphKey { batch: 2, width: 2 }, 4, 63, &Device::Cpu).unwrap();
    assert!(!short.fits(&verify_batch()), "eight keys do not fit four");
}

/// Capture and replay on a GPU (CUDA builds run by `SPECRS_TEST_DEVICE=cuda`, see
/// scripts/gpu-check.sh): replayed logits equal the eager ragged step's, twice in a row with
/// different contents, so the graph really reads the refilled inputs.
#[cfg(feature = "cuda")]
#[test]
fn captured_steps_replay_the_eager_logits() {
    if std::env::var("SPECRS_TEST_DEVICE").as_deref() != Ok("cuda") {
        eprintln!("skipped: set SPECRS_TEST_DEVICE=cuda on a GPU machine");
        return;
    }
    let device = super::cuda::graph_ready_device(0).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg = testing::target_config(Architecture::Llama, &SHAPE, false);
    let tensors = testing::random_target(Architecture::Llama, &SHAPE, false, 5).unwrap();
    testing::write_checkpoint(dir.path(), &cfg, &tensors).unwrap();
    let model = load_causal_lm(dir.path(), &device, ModelDType::F32).unwrap().0;
    let kv = model.new_kv_cache(16, 4).unwrap();
    prefill(&model, &kv);
    let key = GraphKey { batch: 4, width: 2 };
    let inputs = StepInputs::new(key, 16, 63, &device).unwrap();
    inputs.fill(&verify_batch()).unwrap();
    let graph = super::cuda::StepGraph::capture(&device, inputs, |i| {
        Ok(vec![model.forward_fixed(i, &kv, &[], false)?.logits.unwrap()])
    })
    .unwrap();
    let layout = [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)];
    for drafts in [[11u32, 13], [30, 2]] {
        let mut batch = verify_batch();
        batch.input_ids[1..3].copy_from_slice(&drafts);
        let want = model.forward(&batch, &kv).unwrap().logits.unwrap();
        let got = &graph.replay(&batch).unwrap()[0];
        for (flat, &(r, j)) in layout.iter().enumerate() {
            let diff = max_diff(&got.get(fixed_output_row(key, r, j)).unwrap(), &want.get(flat).unwrap());
            assert!(diff < 1e-3, "drafts {drafts:?} row {r} query {j}: {diff}");
        }
    }
}

/// bf16 and f16 on the device (candle's CPU matmul has neither, so this runs only with
/// `SPECRS_TEST_DEVICE=cuda`): the ragged step (reference attention, KV scatter writes) and the
/// fixed step track the f32 model within half-precision error.
#[test]
fn half_precision_steps_track_f32_on_the_device() {
    let device = match std::env::var("SPECRS_TEST_DEVICE").as_deref() {
        Ok("cuda") => Device::new_cuda(0).unwrap(),
        _ => {
            eprintln!("skipped: half-precision matmuls need SPECRS_TEST_DEVICE=cuda");
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let cfg = testing::target_config(Architecture::Llama, &SHAPE, false);
    let tensors = testing::random_target(Architecture::Llama, &SHAPE, false, 5).unwrap();
    testing::write_checkpoint(dir.path(), &cfg, &tensors).unwrap();
    let logits = |dtype: ModelDType| {
        let model = load_causal_lm(dir.path(), &device, dtype).unwrap().0;
        let kv = model.new_kv_cache(16, 4).unwrap();
        prefill(&model, &kv);
        let ragged = model.forward(&verify_batch(), &kv).unwrap().logits.unwrap();
        let key = GraphKey { batch: 2, width: 2 };
        let inputs = StepInputs::new(key, 16, 63, &device).unwrap();
        inputs.fill(&verify_batch()).unwrap();
        let fixed = model.forward_fixed(&inputs, &kv, &[], false).unwrap().logits.unwrap();
        let rows: Vec<u32> =
            [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)].iter().map(|&(r, j)| fixed_output_row(key, r, j) as u32).collect();
        let fixed = fixed.index_select(&Tensor::new(rows.as_slice(), &device).unwrap(), 0).unwrap();
        (ragged.to_device(&Device::Cpu).unwrap(), fixed.to_device(&Device::Cpu).unwrap())
    };
    let (want, want_fixed) = logits(ModelDType::F32);
    assert!(max_diff(&want, &want_fixed) < 1e-3);
    let scale = want.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
    for dtype in [ModelDType::BF16, ModelDType::F16] {
        let (ragged, fixed) = logits(dtype);
        for (name, got) in [("ragged", &ragged), ("fixed", &fixed)] {
            let diff = max_diff(got, &want);
            assert!(diff < 0.05 * scale, "{dtype:?} {name}: {diff} against a logit scale of {scale}");
        }
    }
}
