//! Block drafters (DFlash z-lab and speculators, DFlash2, DSpark DeepSpec and speculators),
//! loaded from tiny checkpoints written in their real formats and checked against a reference
//! forward written here with plain candle ops on the raw tensors read back from the files.
//!
//! The scenario exercises what the engine relies on: context materialised into paged KV in
//! two chunks on scattered blocks, two rows of different lengths in one block forward, each
//! layer's masking (bidirectional, causal, windowed), and the heads (reduced vocabulary, the
//! DSpark Markov chain, the DFlash2 selector walk). Config rules fail with errors naming their
//! key.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{D, Device, Tensor};
use serde_json::{Value, json};
use specrs_models::drafters::block::{LayerAttention, TargetDims};
use specrs_models::drafters::dflash::{DFlashDraft, dflash_config};
use specrs_models::drafters::dflash2::{DFlash2Draft, dflash2_config};
use specrs_models::drafters::dspark::{DSparkDraft, dspark_config};
use specrs_models::drafters::{BlockDraftModel, SlotSampler};
use specrs_models::testing::{self, BlockShape, TinyShape};
use specrs_models::{BatchRow, CausalLm, ForwardBatch, ModelDType, ModelError, load_causal_lm};

const S: TinyShape =
    TinyShape { vocab: 48, hidden: 64, layers: 4, heads: 4, kv_heads: 2, head_dim: 16, intermediate: 64 };
const B: BlockShape = BlockShape { layers: 2, heads: 4, kv_heads: 2, head_dim: 16, block_size: 5 };
/// The fixtures' mask token: the last id.
const MASK: u32 = 47;
const KV_BLOCK: usize = 4;

struct Target {
    _dir: tempfile::TempDir,
    root: std::path::PathBuf,
    model: CausalLm,
    tensors: HashMap<String, Tensor>,
}

fn target() -> Target {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let tensors = testing::random_target(specrs_models::Architecture::Qwen3, &S, false, 5).unwrap();
    let path = root.join("target");
    let cfg = testing::target_config(specrs_models::Architecture::Qwen3, &S, false);
    testing::write_checkpoint(&path, &cfg, &tensors).unwrap();
    let (model, _) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).unwrap();
    Target { _dir: dir, root, model, tensors }
}

fn write(dir: &Path, cfg: &Value, tensors: &HashMap<String, Tensor>) -> HashMap<String, Tensor> {
    testing::write_checkpoint(dir, cfg, tensors).unwrap();
    // The reference reads back exactly what the file holds.
    candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu).unwrap()
}

/// Two rows: contexts of 7 and 3 committed positions, anchors right after them.
struct Scenario {
    ctx: [usize; 2],
    anchors: [u32; 2],
    tables: [[u32; 4]; 2],
    /// Per tap `[10, H]`: row 0's positions, then row 1's.
    taps: Vec<Tensor>,
}

fn scenario(n_taps: usize) -> Scenario {
    Scenario {
        ctx: [7, 3],
        anchors: [11, 30],
        tables: [[5, 2, 9, 11], [1, 7, 3, 14]],
        taps: (0..n_taps).map(|i| testing::random_tensor(&[10, S.hidden], 1.5, 77 + i as u64).unwrap()).collect(),
    }
}

impl Scenario {
    fn slot(&self, row: usize, pos: usize) -> u32 {
        self.tables[row][pos / KV_BLOCK] * KV_BLOCK as u32 + (pos % KV_BLOCK) as u32
    }

    fn flat_start(&self, row: usize) -> usize {
        if row == 0 { 0 } else { self.ctx[0] }
    }
}

struct Argmax;

impl SlotSampler for Argmax {
    fn choose(&mut self, _row: usize, _slot: usize, logits: &[f32], map: Option<&[u32]>) -> u32 {
        let i = argmax(logits);
        map.map_or(i, |m| m[i as usize])
    }
}

fn argmax(v: &[f32]) -> u32 {
    (0..v.len()).fold(0, |b, i| if v[i] > v[b] { i } else { b }) as u32
}

/// The drafter under test: materialise (two chunks), one block forward over both rows, the
/// head on the drafting slots. Returns each row's block hidden states `[S, H]` and drafts.
fn run(model: &dyn BlockDraftModel, sc: &Scenario) -> (Vec<Tensor>, Vec<Vec<u32>>) {
    let kv = model.new_kv_cache(16, KV_BLOCK).unwrap();
    // Chunk 1: row 0 positions 0..5 and row 1 positions 0..3; chunk 2: row 0 positions 5..7.
    for chunk in [vec![(0, 0..5), (1, 0..3)], vec![(0, 5..7)]] {
        let (mut flat, mut positions, mut slots) = (Vec::new(), Vec::new(), Vec::new());
        for (row, range) in chunk {
            for p in range {
                flat.push((sc.flat_start(row) + p) as u32);
                positions.push(p as u32);
                slots.push(sc.slot(row, p));
            }
        }
        let flat = Tensor::from_vec(flat.clone(), flat.len(), &Device::Cpu).unwrap();
        model.materialize(&sc.taps, &flat, &positions, &slots, &kv).unwrap();
    }
    let n = model.block_size();
    let mut batch = ForwardBatch { block_size: KV_BLOCK, ..Default::default() };
    for row in 0..2 {
        let a = sc.ctx[row];
        batch.input_ids.push(sc.anchors[row]);
        batch.input_ids.extend(std::iter::repeat_n(model.mask_token_id(), n - 1));
        batch.positions.extend((a..a + n).map(|p| p as u32));
        batch.slot_mapping.extend((a..a + n).map(|p| sc.slot(row, p)));
        batch.rows.push(BatchRow {
            query_start: row * n,
            query_len: n,
            context_len: a + n,
            block_table_start: row * 4,
            block_table_len: 4,
        });
        batch.block_tables.extend_from_slice(&sc.tables[row]);
    }
    let hidden = model.forward_block(&batch, &kv).unwrap();
    let offset = usize::from(!model.samples_from_anchor());
    let idx: Vec<u32> = (0..2).flat_map(|r| (r * n + offset..r * n + n).map(|i| i as u32)).collect();
    let drafting = hidden.index_select(&Tensor::from_vec(idx.clone(), idx.len(), &Device::Cpu).unwrap(), 0).unwrap();
    let drafts = model.head(&drafting, &sc.anchors, &mut Argmax).unwrap();
    ((0..2).map(|r| hidden.narrow(0, r * n, n).unwrap()).collect(), drafts)
}

// ---------------------------------------------------------------------------------------------
// The reference: one row at a time, the context's keys and values concatenated with the
// block's, an explicit mask, no paging.

fn linear(x: &Tensor, w: &Tensor) -> Tensor {
    x.matmul(&w.t().unwrap()).unwrap()
}

fn rms(x: &Tensor, w: &Tensor, eps: f64) -> Tensor {
    let ms = x.sqr().unwrap().mean_keepdim(D::Minus1).unwrap();
    x.broadcast_div(&(ms + eps).unwrap().sqrt().unwrap()).unwrap().broadcast_mul(w).unwrap()
}

/// Rotate-half RoPE of `x [T, heads, d]` at `positions`.
fn rope(x: &Tensor, positions: &[usize], theta: f64) -> Tensor {
    let (t, heads, d) = x.dims3().unwrap();
    let half = d / 2;
    let (mut cos, mut sin) = (Vec::new(), Vec::new());
    for &p in positions {
        for i in 0..half {
            let angle = p as f64 * theta.powf(-2.0 * i as f64 / d as f64);
            cos.push(angle.cos() as f32);
            sin.push(angle.sin() as f32);
        }
    }
    let cos = Tensor::from_vec(cos, (t, 1, half), &Device::Cpu).unwrap();
    let sin = Tensor::from_vec(sin, (t, 1, half), &Device::Cpu).unwrap();
    let x1 = x.narrow(2, 0, half).unwrap();
    let x2 = x.narrow(2, half, half).unwrap();
    let a = (x1.broadcast_mul(&cos).unwrap() - x2.broadcast_mul(&sin).unwrap()).unwrap();
    let b = (x2.broadcast_mul(&cos).unwrap() + x1.broadcast_mul(&sin).unwrap()).unwrap();
    let out = Tensor::cat(&[a, b], 2).unwrap();
    assert_eq!(out.dims(), &[t, heads, d]);
    out
}

/// What the reference needs to know about a drafter.
struct Spec {
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    layers: usize,
    eps: f64,
    theta: f64,
    embed_scale: f64,
    attention: Vec<LayerAttention>,
    /// DFlash2 convolutions: (taps, group size).
    conv: Option<(usize, usize)>,
}

fn spec(attention: Vec<LayerAttention>) -> Spec {
    Spec {
        heads: B.heads,
        kv_heads: B.kv_heads,
        head_dim: B.head_dim,
        layers: B.layers,
        eps: 1e-6,
        theta: 1_000_000.0,
        embed_scale: 1.0,
        attention,
        conv: None,
    }
}

fn full(n: usize) -> Vec<LayerAttention> {
    vec![LayerAttention { causal: false, sliding_window: None }; n]
}

fn host(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

/// One side of a DFlash2 convolution: `y_t = Σ_{j ≤ t} (base[j] + δ_t[j, group]) ⊙ x_{t−j}`.
fn conv_side(x: &Tensor, delta: &[f32], base: &Tensor, taps: usize, group: usize) -> Tensor {
    let (t, h) = x.dims2().unwrap();
    let groups = h / group;
    let (x, base) = (host(x), host(base));
    let mut y = vec![0f32; t * h];
    for tt in 0..t {
        for c in 0..h {
            for j in 0..taps.min(tt + 1) {
                let coefficient = base[j * h + c] + delta[(tt * taps + j) * groups + c / group];
                y[tt * h + c] += coefficient * x[(tt - j) * h + c];
            }
        }
    }
    Tensor::from_vec(y, (t, h), &Device::Cpu).unwrap()
}

/// `f` wrapped in the layer's convolution `prefix` (when the drafter has them).
fn convolved(
    raw: &HashMap<String, Tensor>,
    spec: &Spec,
    prefix: &str,
    u: &Tensor,
    f: impl Fn(&Tensor) -> Tensor,
) -> Tensor {
    let Some((taps, group)) = spec.conv else { return f(u) };
    let t = u.dim(0).unwrap();
    let groups = S.hidden / group;
    let proj = host(&linear(u, &raw[&format!("{prefix}.kernel_projection.weight")]));
    // [T, 2, taps, G] split by side.
    let side = |s: usize| -> Vec<f32> {
        (0..t).flat_map(|tt| proj[(tt * 2 + s) * taps * groups..(tt * 2 + s + 1) * taps * groups].to_vec()).collect()
    };
    let base = &raw[&format!("{prefix}.base_kernel")];
    let pre = conv_side(u, &side(0), &base.get(0).unwrap(), taps, group);
    conv_side(&f(&pre), &side(1), &base.get(1).unwrap(), taps, group)
}

/// Attention of block queries over `[context ; block]` keys with the layer's mask.
fn attend(q: &Tensor, k: &Tensor, v: &Tensor, ctx: usize, at: LayerAttention, spec: &Spec) -> Tensor {
    let n = q.dim(0).unwrap();
    let keys = k.dim(0).unwrap();
    let group = spec.heads / spec.kv_heads;
    let mut mask = vec![0f32; n * keys];
    for j in 0..n {
        for i in 0..keys {
            let (q_pos, k_pos) = (ctx + j, i);
            let causal_ok = !at.causal || k_pos <= q_pos;
            let window_ok = at.sliding_window.is_none_or(|w| q_pos - k_pos.min(q_pos) < w);
            let in_block_or_ctx = i < ctx + n;
            if !(causal_ok && window_ok && in_block_or_ctx) {
                mask[j * keys + i] = f32::NEG_INFINITY;
            }
        }
    }
    let mask = Tensor::from_vec(mask, (n, keys), &Device::Cpu).unwrap();
    let mut heads = Vec::new();
    for h in 0..spec.heads {
        let qh = q.narrow(1, h, 1).unwrap().squeeze(1).unwrap();
        let kh = k.narrow(1, h / group, 1).unwrap().squeeze(1).unwrap();
        let vh = v.narrow(1, h / group, 1).unwrap().squeeze(1).unwrap();
        let scores = (qh.matmul(&kh.t().unwrap()).unwrap() / (spec.head_dim as f64).sqrt()).unwrap();
        let p = candle_nn::ops::softmax_last_dim(&(scores + &mask).unwrap()).unwrap();
        heads.push(p.matmul(&vh).unwrap());
    }
    Tensor::cat(&heads, 1).unwrap()
}

/// The reference block forward of row `row`: its block's final normed hidden states `[S, H]`.
fn reference_block(
    raw: &HashMap<String, Tensor>,
    target: &HashMap<String, Tensor>,
    spec: &Spec,
    sc: &Scenario,
    row: usize,
    block: usize,
) -> Tensor {
    let (ctx, h, d) = (sc.ctx[row], S.hidden, spec.head_dim);
    let r = |name: &str| raw[name].clone();
    // Context features c = hidden_norm(fc(taps)).
    let taps: Vec<Tensor> = sc.taps.iter().map(|t| t.narrow(0, sc.flat_start(row), ctx).unwrap()).collect();
    let c = rms(&linear(&Tensor::cat(&taps, 1).unwrap(), &r("fc.weight")), &r("hidden_norm.weight"), spec.eps);
    // Block embeddings: the target's table, the mask embedding where the draft has one.
    let embed = &target["model.embed_tokens.weight"];
    let ids = [sc.anchors[row]].into_iter().chain(std::iter::repeat_n(MASK, block - 1));
    let rows: Vec<Tensor> = ids
        .map(|id| match raw.get("mask_embedding") {
            Some(m) if id == MASK => m.clone(),
            _ => embed.get(id as usize).unwrap(),
        })
        .collect();
    let mut x = (Tensor::stack(&rows, 0).unwrap() * spec.embed_scale).unwrap();
    let ctx_pos: Vec<usize> = (0..ctx).collect();
    let blk_pos: Vec<usize> = (ctx..ctx + block).collect();
    for l in 0..spec.layers {
        let p = format!("layers.{l}");
        let w = |n: &str| r(&format!("{p}.{n}"));
        let heads = |t: &Tensor, n: usize| t.reshape((t.dim(0).unwrap(), n, d)).unwrap();
        let keys = |src: &Tensor, pos: &[usize]| {
            let k = heads(&linear(src, &w("self_attn.k_proj.weight")), spec.kv_heads);
            rope(&rms(&k, &w("self_attn.k_norm.weight"), spec.eps), pos, spec.theta)
        };
        let values = |src: &Tensor| heads(&linear(src, &w("self_attn.v_proj.weight")), spec.kv_heads);
        let u = rms(&x, &w("input_layernorm.weight"), spec.eps);
        let attn = convolved(raw, spec, &format!("{p}.attention_conv"), &u, |u| {
            let q = heads(&linear(u, &w("self_attn.q_proj.weight")), spec.heads);
            let q = rope(&rms(&q, &w("self_attn.q_norm.weight"), spec.eps), &blk_pos, spec.theta);
            let k = Tensor::cat(&[keys(&c, &ctx_pos), keys(u, &blk_pos)], 0).unwrap();
            let v = Tensor::cat(&[values(&c), values(u)], 0).unwrap();
            linear(&attend(&q, &k, &v, ctx, spec.attention[l], spec), &w("self_attn.o_proj.weight"))
        });
        x = (x + attn).unwrap();
        let u = rms(&x, &w("post_attention_layernorm.weight"), spec.eps);
        let mlp = convolved(raw, spec, &format!("{p}.mlp_conv"), &u, |u| {
            let gate = candle_nn::ops::silu(&linear(u, &w("mlp.gate_proj.weight"))).unwrap();
            let up = linear(u, &w("mlp.up_proj.weight"));
            linear(&(gate * up).unwrap(), &w("mlp.down_proj.weight"))
        });
        x = (x + mlp).unwrap();
        assert_eq!(x.dims(), &[block, h]);
    }
    rms(&x, &r("norm.weight"), spec.eps)
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    specrs_models::testing::max_abs_diff(a, b).unwrap()
}

fn assert_blocks_match(
    got: &[Tensor],
    raw: &HashMap<String, Tensor>,
    target: &Target,
    spec: &Spec,
    sc: &Scenario,
    block: usize,
) {
    for (row, got) in got.iter().enumerate() {
        let want = reference_block(raw, &target.tensors, spec, sc, row, block);
        let diff = max_diff(got, &want);
        assert!(diff < 1e-4, "row {row}: block hidden states differ from the reference by {diff}");
    }
}

/// The rows' drafting-slot hidden states, `[W, H]` each.
fn drafting(block: &Tensor, samples_from_anchor: bool) -> Tensor {
    let n = block.dim(0).unwrap();
    let offset = usize::from(!samples_from_anchor);
    block.narrow(0, offset, n - offset).unwrap()
}

/// Independent per-slot argmax of `lm_head(h)`, mapped through `d2t` when present.
fn reference_argmax(h: &Tensor, lm_head: &Tensor, d2t: Option<&Tensor>) -> Vec<u32> {
    let logits = linear(h, lm_head);
    let map = d2t.map(|t| t.to_vec1::<i64>().unwrap());
    (0..logits.dim(0).unwrap())
        .map(|i| {
            let j = argmax(&logits.get(i).unwrap().to_vec1::<f32>().unwrap());
            map.as_ref().map_or(j, |m| (j as i64 + m[j as usize]) as u32)
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Forward matches the reference.

#[test]
fn dflash_zlab_block_matches_reference() {
    let t = target();
    let (cfg, tensors) = testing::dflash_zlab(&S, &B, &[0, 2], 40).unwrap();
    let dir = t.root.join("dflash");
    let raw = write(&dir, &cfg, &tensors);
    let model = DFlashDraft::load(&dir, &t.model, &Device::Cpu, ModelDType::F32).unwrap();
    // Output-of-layer ids 0 and 2 are hidden states 1 and 3.
    assert_eq!(model.inputs().taps, vec![1, 3]);
    assert_eq!((model.block_size(), model.trained_width(), model.samples_from_anchor()), (5, 4, false));
    let sc = scenario(2);
    let (blocks, drafts) = run(&model, &sc);
    assert_blocks_match(&blocks, &raw, &t, &spec(full(B.layers)), &sc, 5);
    for row in 0..2 {
        // Slots 1..B-1 draft with the target's lm_head.
        let want = reference_argmax(&drafting(&blocks[row], false), &t.tensors["lm_head.weight"], None);
        assert_eq!(drafts[row], want, "row {row}");
        assert_eq!(drafts[row].len(), 4);
    }
}

#[test]
fn dflash_sliding_layers_are_causal_and_windowed() {
    let t = target();
    let (mut cfg, tensors) = testing::dflash_zlab(&S, &B, &[0, 2], 41).unwrap();
    cfg["layer_types"] = json!(["sliding_attention", "full_attention"]);
    cfg["sliding_window"] = json!(4);
    let dir = t.root.join("dflash-swa");
    let raw = write(&dir, &cfg, &tensors);
    let model = DFlashDraft::load(&dir, &t.model, &Device::Cpu, ModelDType::F32).unwrap();
    let attention = model.backbone().config().attention.clone();
    assert_eq!(
        attention,
        vec![
            LayerAttention { causal: true, sliding_window: Some(4) },
            LayerAttention { causal: false, sliding_window: None }
        ]
    );
    let sc = scenario(2);
    let (blocks, _) = run(&model, &sc);
    assert_blocks_match(&blocks, &raw, &t, &spec(attention), &sc, 5);

    // use_swa windows every layer without making it causal; dflash_config.causal overrides.
    let dims = TargetDims::from(t.model.config());
    let mut cfg2 = testing::dflash_zlab(&S, &B, &[0, 2], 41).unwrap().0;
    cfg2["dflash_config"]["use_swa"] = json!(true);
    cfg2["dflash_config"]["swa_window_size"] = json!(6);
    let (_, c) = dflash_config(&cfg2, &dims).unwrap();
    assert!(c.attention.iter().all(|a| *a == LayerAttention { causal: false, sliding_window: Some(6) }));
    cfg2["dflash_config"]["causal"] = json!(true);
    let (_, c) = dflash_config(&cfg2, &dims).unwrap();
    assert!(c.attention.iter().all(|a| a.causal));
}

#[test]
fn dflash_speculators_reduced_vocab_matches_reference() {
    let t = target();
    let (cfg, mut tensors) = testing::dflash_speculators(&S, &B, &[1, 3], 24, &t.tensors, 42).unwrap();
    tensors.insert("mask_embedding".into(), testing::random_tensor(&[S.hidden], 1.0, 9).unwrap());
    let dir = t.root.join("dflash-speculators");
    let raw = write(&dir, &cfg, &tensors);
    let model = DFlashDraft::load(&dir, &t.model, &Device::Cpu, ModelDType::F32).unwrap();
    // speculators ids are hidden-state indices already.
    assert_eq!(model.inputs().taps, vec![1, 3]);
    let sc = scenario(2);
    let (blocks, drafts) = run(&model, &sc);
    assert_blocks_match(&blocks, &raw, &t, &spec(full(B.layers)), &sc, 5);
    for row in 0..2 {
        let want = reference_argmax(&drafting(&blocks[row], false), &raw["lm_head.weight"], Some(&raw["d2t"]));
        assert_eq!(drafts[row], want, "row {row}");
        // The reduced vocabulary holds even target ids only.
        assert!(drafts[row].iter().all(|d| d % 2 == 0), "{:?}", drafts[row]);
    }
}

#[test]
fn dflash2_convolutions_and_selector_match_reference() {
    let t = target();
    let (cfg, tensors) = testing::dflash2_zlab(&S, &B, &[1, 2], 43).unwrap();
    let dir = t.root.join("dflash2");
    let raw = write(&dir, &cfg, &tensors);
    let model = DFlash2Draft::load(&dir, &t.model, &Device::Cpu, ModelDType::F32).unwrap();
    assert_eq!(model.inputs().taps, vec![2, 3]);
    let sc = scenario(2);
    let (blocks, drafts) = run(&model, &sc);
    let (taps, group, rank, top_k) = testing::TINY_DFLASH2;
    let spec = Spec { embed_scale: 1.5, conv: Some((taps, group)), ..spec(full(B.layers)) };
    assert_blocks_match(&blocks, &raw, &t, &spec, &sc, 5);
    // The selector walk, from the checkpoint's tensors and dflash_config (multiplier 0.8, cap 4).
    for row in 0..2 {
        let h = drafting(&blocks[row], false);
        let logits = linear(&h, &t.tensors["lm_head.weight"]);
        let projected = host(&linear(&h, &raw["candidate_selector.hidden_projection.weight"]));
        let (pred, succ) =
            (&raw["candidate_selector.predecessor_codebook"], &raw["candidate_selector.successor_codebook"]);
        let mut previous = sc.anchors[row];
        let mut want = Vec::new();
        for slot in 0..4 {
            let l = logits.get(slot).unwrap().to_vec1::<f32>().unwrap();
            let mut order: Vec<usize> = (0..l.len()).collect();
            order.sort_by(|&a, &b| l[b].total_cmp(&l[a]));
            let p = pred.get(previous as usize).unwrap().to_vec1::<f32>().unwrap();
            let hp = &projected[slot * rank..(slot + 1) * rank];
            let score = |c: usize| {
                let s = succ.get(c).unwrap().to_vec1::<f32>().unwrap();
                let unary = 4.0 * ((0.8 * l[c]) / 4.0).tanh();
                unary + (0..rank).map(|i| p[i] * hp[i] * s[i]).sum::<f32>()
            };
            let best = order[..top_k].iter().copied().fold(order[0], |b, c| if score(c) > score(b) { c } else { b });
            want.push(best as u32);
            previous = best as u32;
        }
        assert_eq!(drafts[row], want, "row {row}");
    }
}

/// The DSpark Markov chain: slot `k` takes `argmax(lm_head(h_k) + w2 · w1[prev])`.
fn reference_markov(
    h: &Tensor,
    lm_head: &Tensor,
    raw: &HashMap<String, Tensor>,
    anchor: u32,
    d2t: Option<&Tensor>,
) -> Vec<u32> {
    let base = linear(h, lm_head);
    let (w1, w2) = (&raw["markov_head.markov_w1.weight"], &raw["markov_head.markov_w2.weight"]);
    let map = d2t.map(|t| t.to_vec1::<i64>().unwrap());
    let mut previous = anchor;
    (0..base.dim(0).unwrap())
        .map(|k| {
            let bias = linear(&w1.get(previous as usize).unwrap().unsqueeze(0).unwrap(), w2).squeeze(0).unwrap();
            let logits = (base.get(k).unwrap() + bias).unwrap().to_vec1::<f32>().unwrap();
            let j = argmax(&logits);
            previous = map.as_ref().map_or(j, |m| (j as i64 + m[j as usize]) as u32);
            previous
        })
        .collect()
}

#[test]
fn dspark_deepspec_block_and_markov_head_match_reference() {
    let t = target();
    let (cfg, tensors) = testing::dspark_deepspec(&S, &B, &[-1, 1], 6, &t.tensors, 44).unwrap();
    let dir = t.root.join("dspark");
    let raw = write(&dir, &cfg, &tensors);
    let model = DSparkDraft::load(&dir, &t.model, &Device::Cpu, ModelDType::F32).unwrap();
    // -1 is the embeddings (hidden state 0); layer 1's output is hidden state 2.
    assert_eq!(model.inputs().taps, vec![0, 2]);
    // Every slot drafts, the anchor's included.
    assert_eq!((model.block_size(), model.trained_width(), model.samples_from_anchor()), (5, 5, true));
    let sc = scenario(2);
    let (blocks, drafts) = run(&model, &sc);
    assert_blocks_match(&blocks, &raw, &t, &spec(full(B.layers)), &sc, 5);
    for row in 0..2 {
        let want = reference_markov(&drafting(&blocks[row], true), &raw["lm_head.weight"], &raw, sc.anchors[row], None);
        assert_eq!(drafts[row], want, "row {row}");
        // The Markov head matters: without it some slot would draft differently.
        assert_ne!(drafts[row], reference_argmax(&drafting(&blocks[row], true), &raw["lm_head.weight"], None));
    }
}

#[test]
fn dspark_speculators_reduced_vocab_matches_reference() {
    let t = target();
    let (cfg, tensors) = testing::dspark_speculators(&S, &B, &[1, 4], 24, 6, &t.tensors, 45).unwrap();
    let dir = t.root.join("dspark-speculators");
    let raw = write(&dir, &cfg, &tensors);
    let model = DSparkDraft::load(&dir, &t.model, &Device::Cpu, ModelDType::F32).unwrap();
    assert_eq!(model.inputs().taps, vec![1, 4]);
    let sc = scenario(2);
    let (blocks, drafts) = run(&model, &sc);
    assert_blocks_match(&blocks, &raw, &t, &spec(full(B.layers)), &sc, 5);
    for row in 0..2 {
        let h = drafting(&blocks[row], true);
        let want = reference_markov(&h, &raw["lm_head.weight"], &raw, sc.anchors[row], Some(&raw["d2t"]));
        assert_eq!(drafts[row], want, "row {row}");
        assert!(drafts[row].iter().all(|d| d % 2 == 0));
    }
}

// ---------------------------------------------------------------------------------------------
// Config rules.

fn key_of<T: std::fmt::Debug>(r: Result<T, ModelError>) -> String {
    match r {
        Err(ModelError::Config { key, .. }) => key,
        other => panic!("expected a config error, got {other:?}"),
    }
}

fn dims() -> TargetDims {
    TargetDims { vocab_size: S.vocab, hidden_size: Some(S.hidden), num_hidden_layers: Some(S.layers) }
}

#[test]
fn dspark_config_rules_fail_naming_their_key() {
    let target = testing::random_target(specrs_models::Architecture::Qwen3, &S, false, 5).unwrap();
    let (valid, _) = testing::dspark_speculators(&S, &B, &[1, 4], 24, 6, &target, 1).unwrap();
    let cfg = dspark_config(&valid, &dims()).unwrap();
    assert_eq!((cfg.block.trained_width(), cfg.markov_rank, cfg.block.draft_vocab_size), (5, 6, 24));
    let broken = |edit: &dyn Fn(&mut Value)| {
        let mut v = valid.clone();
        edit(&mut v);
        key_of(dspark_config(&v, &dims()))
    };
    assert_eq!(broken(&|v| v["block_size"] = json!(1)), "block_size");
    // A corrupt width, refused by its key (it used to surface as num_speculative_tokens).
    assert_eq!(broken(&|v| v["block_size"] = json!(1u64 << 21)), "block_size");
    assert_eq!(broken(&|v| v["mask_token_id"] = json!(48)), "mask_token_id");
    // Past u32: refused, not wrapped into the vocabulary (2^32 + 3 used to read as 3).
    assert_eq!(broken(&|v| v["mask_token_id"] = json!((1u64 << 32) + 3)), "mask_token_id");
    assert_eq!(broken(&|v| v["draft_vocab_size"] = json!(0)), "draft_vocab_size");
    assert_eq!(broken(&|v| v["draft_vocab_size"] = json!(49)), "draft_vocab_size");
    for ids in [json!([]), json!([0, 2]), json!([3, 1]), json!([2, 2]), json!([1, 5])] {
        assert_eq!(broken(&|v| v["aux_hidden_state_layer_ids"] = ids.clone()), "aux_hidden_state_layer_ids", "{ids}");
    }
    assert_eq!(
        broken(&|v| v["transformer_layer_config"]["layer_types"] = json!(["sliding_attention", "full_attention"])),
        "layer_types"
    );
    assert_eq!(
        broken(&|v| v["transformer_layer_config"]["layer_types"] = json!(["sliding_attention", "sliding_attention"])),
        "sliding_window"
    );
    assert_eq!(broken(&|v| v["sliding_window_non_causal"] = json!(true)), "sliding_window_non_causal");
    assert_eq!(broken(&|v| v["markov_head_type"] = json!("gated")), "markov_head_type");
    assert_eq!(broken(&|v| v["markov_rank"] = json!(0)), "markov_rank");
    assert_eq!(
        broken(&|v| v["transformer_layer_config"]["rope_scaling"] = json!({"rope_type": "linear", "factor": 2.0})),
        "rope_scaling"
    );
    assert_eq!(
        broken(&|v| v["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = json!(4)),
        "speculators_config.proposal_methods[0].speculative_tokens"
    );
    assert_eq!(broken(&|v| v["speculators_model_type"] = json!("dflash")), "speculators_model_type");

    // All sliding with a window: causal; an explicit `causal` overrides.
    let mut v = valid.clone();
    v["transformer_layer_config"]["layer_types"] = json!(["sliding_attention", "sliding_attention"]);
    v["transformer_layer_config"]["sliding_window"] = json!(8);
    let c = dspark_config(&v, &dims()).unwrap();
    assert!(c.block.attention.iter().all(|a| a.causal && a.sliding_window == Some(8)));
    v["causal"] = json!(false);
    assert!(dspark_config(&v, &dims()).unwrap().block.attention.iter().all(|a| !a.causal));

    // Anchor-less blocks draft one fewer token and must declare that width.
    let mut v = valid.clone();
    v["sample_from_anchor"] = json!(false);
    assert_eq!(broken(&|x| *x = v.clone()), "speculators_config.proposal_methods[0].speculative_tokens");
    v["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = json!(4);
    assert_eq!(dspark_config(&v, &dims()).unwrap().block.trained_width(), 4);

    // DeepSpec: layer ids from -1, a Markov head required.
    let (deepspec, _) = testing::dspark_deepspec(&S, &B, &[-1, 1], 6, &target, 1).unwrap();
    let mut v = deepspec.clone();
    v["target_layer_ids"] = json!([-2, 1]);
    assert_eq!(key_of(dspark_config(&v, &dims())), "target_layer_ids");
    let mut v = deepspec.clone();
    v.as_object_mut().unwrap().remove("markov_rank");
    assert_eq!(key_of(dspark_config(&v, &dims())), "markov_rank");
    let mut v = deepspec;
    v["architectures"] = json!(["LlamaForCausalLM"]);
    assert!(matches!(dspark_config(&v, &dims()), Err(ModelError::UnknownArchitecture { .. })));
}

#[test]
fn dflash_config_errors_name_their_key() {
    let (valid, _) = testing::dflash_zlab(&S, &B, &[0, 2], 1).unwrap();
    assert_eq!(dflash_config(&valid, &dims()).unwrap().1.trained_width(), 4);
    let broken = |edit: &dyn Fn(&mut Value)| {
        let mut v = valid.clone();
        edit(&mut v);
        key_of(dflash_config(&v, &dims()))
    };
    assert_eq!(broken(&|v| drop(v.as_object_mut().unwrap().remove("dflash_config"))), "dflash_config");
    assert_eq!(
        broken(&|v| drop(v["dflash_config"].as_object_mut().unwrap().remove("mask_token_id"))),
        "dflash_config.mask_token_id"
    );
    assert_eq!(broken(&|v| v["dflash_config"]["mask_token_id"] = json!(48)), "mask_token_id");
    assert_eq!(broken(&|v| v["dflash_config"]["mask_token_id"] = json!((1u64 << 32) + 3)), "mask_token_id");
    assert_eq!(
        broken(&|v| drop(v["dflash_config"].as_object_mut().unwrap().remove("target_layer_ids"))),
        "dflash_config.target_layer_ids"
    );
    // Output of layer 4 would be hidden state 5 of a 4-layer target.
    assert_eq!(broken(&|v| v["dflash_config"]["target_layer_ids"] = json!([0, 4])), "dflash_config.target_layer_ids");
    assert_eq!(broken(&|v| drop(v.as_object_mut().unwrap().remove("block_size"))), "block_size");
    assert_eq!(broken(&|v| v["block_size"] = json!(1)), "block_size");
    assert_eq!(broken(&|v| v["block_size"] = json!(1u64 << 21)), "block_size");
    assert_eq!(broken(&|v| v["target_hidden_size"] = json!(128)), "target_hidden_size");
    assert_eq!(broken(&|v| v["layer_types"] = json!(["full_attention"])), "layer_types");
    let mut v = valid.clone();
    v["architectures"] = json!(["DFlash2DraftModel"]);
    assert!(matches!(dflash_config(&v, &dims()), Err(ModelError::UnknownArchitecture { .. })));
    // block_size may sit in dflash_config.
    let mut v = valid.clone();
    v.as_object_mut().unwrap().remove("block_size");
    v["dflash_config"]["block_size"] = json!(9);
    assert_eq!(dflash_config(&v, &dims()).unwrap().1.trained_width(), 8);

    let (v2, _) = testing::dflash2_zlab(&S, &B, &[0, 2], 1).unwrap();
    let (c, p) = dflash2_config(&v2, &dims()).unwrap();
    assert_eq!((c.trained_width(), p.selector_top_k, c.input_embedding_scale), (4, 4, 1.5));
    for (k, bad) in [("conv_group_size", json!(24)), ("selector_top_k", json!(0)), ("conv_kernel_size", json!(0))] {
        let mut v = v2.clone();
        v["dflash_config"][k] = bad;
        assert_eq!(key_of(dflash2_config(&v, &dims())), format!("dflash_config.{k}"));
    }
}
