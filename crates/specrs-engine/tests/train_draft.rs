//! `train_draft` end to end on the default model, kept tiny: it generates self-distilled
//! answers through the engine, extracts features, trains a few steps, writes a speculators
//! EAGLE-3 draft that the normal loader runs losslessly, and resumes from its work directory.

use specrs_core::SpeculativeConfig;
use specrs_core::config::SpeculativeMethod;
use specrs_core::sampling::SamplingParams;
use specrs_engine::train::{TrainDraftConfig, train_draft};
use specrs_engine::{EngineHandle, GenerationRequest, PipelineConfig, Prompt, build_engine};
use specrs_models::ModelDType;

fn engine(draft: Option<&std::path::Path>) -> EngineHandle {
    let mut cfg = PipelineConfig::new("smollm2-135m-instruct");
    cfg.dtype = ModelDType::F32;
    if let Some(draft) = draft {
        cfg.draft_model = Some(draft.to_string_lossy().into_owned());
        cfg.speculative = SpeculativeConfig {
            speculative_method: Some(SpeculativeMethod::Eagle),
            num_speculative_tokens: Some(2),
            ..SpeculativeConfig::default()
        };
    }
    let (engine, info) = build_engine(&cfg).unwrap();
    EngineHandle::spawn(engine, Some(info))
}

#[test]
fn trains_exports_a_lossless_draft_and_resumes_from_its_work_dir() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = TrainDraftConfig {
        dtype: ModelDType::F32,
        output: dir.path().join("draft"),
        work_dir: dir.path().join("work"),
        num_prompts: 4,
        max_new_tokens: 8,
        draft_vocab_size: 256,
        intermediate_size: Some(64),
        ttt_steps: 2,
        epochs: 1.0,
        batch_size: 2,
        num_speculative_tokens: 2,
        generation_batch: 4,
        ..TrainDraftConfig::default()
    };
    let stages = std::sync::Mutex::new(Vec::<String>::new());
    let progress = |stage: &str, _: usize, _: usize, _: &str| {
        let mut seen = stages.lock().unwrap();
        if seen.last().map(String::as_str) != Some(stage) {
            seen.push(stage.to_string());
        }
    };
    let report = train_draft(&cfg, &progress).unwrap();
    assert_eq!(stages.lock().unwrap().clone(), ["generate", "features", "train"]);
    assert_eq!(report.samples, 4);
    assert!(report.response_tokens > 4 && report.response_tokens <= 4 * 8, "{} answer tokens", report.response_tokens);
    assert_eq!(report.steps, 2, "4 samples in batches of 2, one epoch");
    assert!(report.final_loss.is_finite() && report.final_loss > 0.0, "loss {}", report.final_loss);
    assert_eq!(report.top1_per_step.len(), 2);

    // The export is the speculators EAGLE-3 format, and the engine's loader runs it losslessly.
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(cfg.output.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["speculators_model_type"], "eagle3");
    // The draft vocabulary is the most frequent answer tokens, at most the size asked for.
    let draft_vocab = config["draft_vocab_size"].as_u64().unwrap();
    assert!(draft_vocab > 1 && draft_vocab <= 256, "draft vocabulary of {draft_vocab}");
    assert!(cfg.output.join("model.safetensors").exists());
    let prompts = [vec![1u32, 504, 3458, 282, 4195, 314], vec![1, 9690, 198, 2683, 359, 253]];
    let requests = || {
        prompts
            .iter()
            .map(|p| {
                GenerationRequest::new(
                    Prompt::Tokens(p.clone()),
                    SamplingParams { temperature: 0.0, max_tokens: Some(12), ..SamplingParams::default() },
                )
            })
            .collect::<Vec<_>>()
    };
    let plain = engine(None).generate(requests()).unwrap();
    let spec = engine(Some(&cfg.output)).generate(requests()).unwrap();
    for (p, s) in plain.iter().zip(&spec) {
        assert_eq!(p.token_ids, s.token_ids, "a freshly trained draft changes nothing in greedy output");
        assert!(s.metrics.num_drafts > 0, "the trained draft was used");
    }

    // A second run with more epochs keeps the samples and features and trains on from step 2.
    cfg.epochs = 2.0;
    stages.lock().unwrap().clear();
    let resumed = train_draft(&cfg, &progress).unwrap();
    assert_eq!(resumed.samples, 4);
    assert_eq!(resumed.response_tokens, report.response_tokens, "cached samples, not regenerated");
    assert_eq!(resumed.steps, 4);

    // Warm start: a new run continues the exported draft, keeping its taps and vocabulary
    // even when asked for another vocabulary size. With a vanishing learning rate the weights
    // it writes back are the ones it started from (to 1e-9: an update of ~1e-12 still shows
    // in the last bits of a weight near 1e-5; a wrong or missing tensor differs by far more).
    let warm = TrainDraftConfig {
        output: dir.path().join("warm"),
        work_dir: dir.path().join("warm-work"),
        init_from: Some(cfg.output.clone()),
        draft_vocab_size: 64,
        intermediate_size: None,
        learning_rate: 1e-12,
        epochs: 1.0,
        ..cfg.clone()
    };
    std::fs::create_dir_all(&warm.work_dir).unwrap();
    std::fs::copy(cfg.work_dir.join("samples.jsonl"), warm.work_dir.join("samples.jsonl")).unwrap();
    train_draft(&warm, &progress).unwrap();
    let read = |dir: &std::path::Path| {
        candle_core::safetensors::load(dir.join("model.safetensors"), &candle_core::Device::Cpu).unwrap()
    };
    let (before, after) = (read(&cfg.output), read(&warm.output));
    assert_eq!(before.len(), after.len());
    for (name, b) in &before {
        let a = &after[name];
        assert_eq!(a.dims(), b.dims(), "{name}");
        let diff = specrs_models::testing::max_abs_diff(a, b).unwrap();
        assert!(diff < 1e-9, "{name} changed by {diff} with a vanishing learning rate");
    }
    let warm_config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(warm.output.join("config.json")).unwrap()).unwrap();
    assert_eq!(warm_config["draft_vocab_size"], config["draft_vocab_size"]);
    assert_eq!(warm_config["eagle_aux_hidden_state_layer_ids"], config["eagle_aux_hidden_state_layer_ids"]);

    // Growing a second layer: it starts as an identity (zero output projections), so the grown
    // draft proposes exactly what the draft it grew from proposes, through the engine's loader.
    let grown = TrainDraftConfig {
        output: dir.path().join("grown"),
        work_dir: dir.path().join("grown-work"),
        init_from: Some(cfg.output.clone()),
        num_layers: Some(2),
        intermediate_size: None,
        learning_rate: 1e-12,
        epochs: 1.0,
        ..cfg.clone()
    };
    std::fs::create_dir_all(&grown.work_dir).unwrap();
    std::fs::copy(cfg.work_dir.join("samples.jsonl"), grown.work_dir.join("samples.jsonl")).unwrap();
    train_draft(&grown, &progress).unwrap();
    let grown_config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(grown.output.join("config.json")).unwrap()).unwrap();
    assert_eq!(grown_config["transformer_layer_config"]["num_hidden_layers"], 2);
    let grown_weights = read(&grown.output);
    for name in ["layers.1.self_attn.o_proj.weight", "layers.1.mlp.down_proj.weight"] {
        let w = grown_weights[name].to_dtype(candle_core::DType::F32).unwrap();
        let largest = w.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        assert!(largest < 1e-9, "{name} starts at zero (the vanishing learning rate moved it {largest})");
    }
    let traced = || {
        let mut rs = requests();
        for r in &mut rs {
            r.trace = true;
        }
        rs
    };
    let before = engine(Some(&cfg.output)).generate(traced()).unwrap();
    let after = engine(Some(&grown.output)).generate(traced()).unwrap();
    for (b, a) in before.iter().zip(&after) {
        assert!(!a.trace.is_empty(), "the grown draft was used");
        assert_eq!(a.trace, b.trace, "a grown draft proposes what it grew from");
    }
    let shrink = TrainDraftConfig {
        init_from: Some(grown.output.clone()),
        num_layers: Some(1),
        output: dir.path().join("shrink"),
        ..grown.clone()
    };
    let err = train_draft(&shrink, &progress).unwrap_err().to_string();
    assert!(err.contains("--draft-layers 1 is fewer than") && err.contains("2 layers"), "{err}");

    // Growing the vocabulary: a draft of 8 tokens continued with room for 64 keeps its 8
    // (with their trained rows) and adds the most frequent answer tokens it lacked; the
    // engine's loader runs the result losslessly.
    let narrow = TrainDraftConfig {
        output: dir.path().join("narrow"),
        work_dir: dir.path().join("narrow-work"),
        draft_vocab_size: 8,
        ..cfg.clone()
    };
    std::fs::create_dir_all(&narrow.work_dir).unwrap();
    std::fs::copy(cfg.work_dir.join("samples.jsonl"), narrow.work_dir.join("samples.jsonl")).unwrap();
    train_draft(&narrow, &progress).unwrap();
    let wide = TrainDraftConfig {
        output: dir.path().join("wide"),
        work_dir: dir.path().join("wide-work"),
        init_from: Some(narrow.output.clone()),
        draft_vocab_size: 64,
        intermediate_size: None,
        learning_rate: 1e-12,
        epochs: 1.0,
        ..cfg.clone()
    };
    std::fs::create_dir_all(&wide.work_dir).unwrap();
    std::fs::copy(cfg.work_dir.join("samples.jsonl"), wide.work_dir.join("samples.jsonl")).unwrap();
    train_draft(&wide, &progress).unwrap();
    let vocab_of = |weights: &std::collections::HashMap<String, candle_core::Tensor>| -> Vec<u32> {
        let d2t = weights["d2t"].to_vec1::<i64>().unwrap();
        d2t.iter().enumerate().map(|(i, off)| (i as i64 + off) as u32).collect()
    };
    let (narrow_weights, wide_weights) = (read(&narrow.output), read(&wide.output));
    let (narrow_vocab, wide_vocab) = (vocab_of(&narrow_weights), vocab_of(&wide_weights));
    assert_eq!(narrow_vocab.len(), 8);
    assert!(wide_vocab.len() > 8, "the vocabulary grew ({} tokens)", wide_vocab.len());
    let head = |w: &std::collections::HashMap<String, candle_core::Tensor>| {
        w["lm_head.weight"].to_dtype(candle_core::DType::F32).unwrap().to_vec2::<f32>().unwrap()
    };
    let (narrow_head, wide_head) = (head(&narrow_weights), head(&wide_weights));
    for (i, t) in narrow_vocab.iter().enumerate() {
        let j = wide_vocab.binary_search(t).unwrap_or_else(|_| panic!("token {t} left the grown vocabulary"));
        assert_eq!(wide_head[j], narrow_head[i], "token {t} kept its trained row");
    }
    let plain = engine(None).generate(requests()).unwrap();
    let widened = engine(Some(&wide.output)).generate(requests()).unwrap();
    for (p, w) in plain.iter().zip(&widened) {
        assert_eq!(p.token_ids, w.token_ids, "a grown draft changes nothing in greedy output");
        assert!(w.metrics.num_drafts > 0, "the grown draft was used");
    }

    // Taps other than the draft's are refused with a message naming both.
    let clash = TrainDraftConfig { taps: Some(vec![1, 2, 3]), output: dir.path().join("clash"), ..warm.clone() };
    let err = train_draft(&clash, &progress).unwrap_err().to_string();
    assert!(err.contains("--taps [1, 2, 3]") && err.contains("--init-from"), "{err}");
    let missing = TrainDraftConfig { init_from: Some(dir.path().join("nowhere")), ..warm };
    let err = train_draft(&missing, &progress).unwrap_err().to_string();
    assert!(err.contains("nowhere") && err.contains("config.json"), "{err}");
}

#[test]
fn trains_on_the_prompts_of_a_users_file() {
    let dir = tempfile::tempdir().unwrap();
    let mine = ["Name three colours of the rainbow.", "What is two plus two?"];
    let held_out = specrs_engine::train::prompts::held_out_prompts()[0].clone();
    let file = dir.path().join("prompts.jsonl");
    let lines: Vec<String> =
        [mine[0], held_out.as_str(), mine[1]].iter().map(|p| serde_json::json!({ "prompt": p }).to_string()).collect();
    std::fs::write(&file, lines.join("\n")).unwrap();
    let cfg = TrainDraftConfig {
        dtype: ModelDType::F32,
        output: dir.path().join("draft"),
        work_dir: dir.path().join("work"),
        prompts_file: Some(file),
        max_new_tokens: 8,
        draft_vocab_size: 128,
        intermediate_size: Some(64),
        ttt_steps: 1,
        epochs: 1.0,
        batch_size: 2,
        generation_batch: 4,
        ..TrainDraftConfig::default()
    };
    let report = train_draft(&cfg, &|_, _, _, _| {}).unwrap();
    assert_eq!(report.samples, 2, "the file's two prompts, its held-out one left out");
    let answered: Vec<String> = std::fs::read_to_string(cfg.work_dir.join("samples.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["prompt"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(answered, mine, "the target answered exactly the file's prompts");
    assert!(cfg.output.join("model.safetensors").exists());
}

/// The training forward (TTT step 0, every anchor) and the engine's loader run the same
/// function of the exported weights, second layer included: the trained head is what serves.
#[test]
fn a_deep_heads_training_forward_is_what_the_engine_loads() {
    use candle_core::{DType, Device, Tensor};
    use candle_nn::{VarBuilder, VarMap};
    use specrs_engine::train::eagle3::{Eagle3Shape, TrainableEagle3};
    use specrs_models::config::Architecture;
    use specrs_models::drafters::SequentialDraftModel;
    use specrs_models::drafters::eagle::EagleDraft;
    use specrs_models::testing::{self, TinyShape};
    use specrs_models::{BatchRow, ForwardBatch};

    const SHAPE: TinyShape =
        TinyShape { vocab: 48, hidden: 64, layers: 4, heads: 4, kv_heads: 2, head_dim: 16, intermediate: 64 };
    let dir = tempfile::tempdir().unwrap();
    let target_dir = dir.path().join("target");
    testing::write_checkpoint(
        &target_dir,
        &testing::target_config(Architecture::Llama, &SHAPE, true),
        &testing::random_target(Architecture::Llama, &SHAPE, true, 9).unwrap(),
    )
    .unwrap();
    let (target, _) = specrs_models::load_causal_lm(&target_dir, &Device::Cpu, ModelDType::F32).unwrap();
    let tc = target.config().clone();
    let shape = Eagle3Shape {
        hidden: SHAPE.hidden,
        num_taps: 3,
        heads: SHAPE.heads,
        kv_heads: SHAPE.kv_heads,
        head_dim: SHAPE.head_dim,
        intermediate: SHAPE.intermediate,
        num_layers: 2,
        draft_vocab: SHAPE.vocab,
        rms_norm_eps: tc.rms_norm_eps,
        rope_theta: tc.rope_theta,
        max_positions: tc.max_position_embeddings,
    };
    // Random weights everywhere, the second layer's output projections included, rounded to
    // bf16 as the export stores them.
    let varmap = VarMap::new();
    TrainableEagle3::new(VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu), shape.clone()).unwrap();
    for (i, var) in varmap.data().lock().unwrap().values().enumerate() {
        let w = testing::random_tensor(var.dims(), 0.2, 1000 + i as u64).unwrap();
        var.set(&w.to_dtype(DType::BF16).unwrap().to_dtype(DType::F32).unwrap()).unwrap();
    }
    let head = TrainableEagle3::new(VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu), shape.clone()).unwrap();
    let draft_dir = dir.path().join("draft");
    let vocab: Vec<u32> = (0..SHAPE.vocab as u32).collect();
    specrs_engine::train::export::write_speculators_eagle3(
        &draft_dir,
        &varmap,
        &shape,
        &[1, 2, 3],
        &vocab,
        &tc,
        2,
        "tiny",
    )
    .unwrap();

    let n = 9;
    let tokens: Vec<u32> = (0..n as u32).map(|i| (i * 5 + 2) % SHAPE.vocab as u32).collect();
    let taps: Vec<Tensor> =
        (0..3).map(|i| testing::random_tensor(&[n, SHAPE.hidden], 1.0, 50 + i as u64).unwrap()).collect();
    let embed = target.embed(&Tensor::arange(0u32, SHAPE.vocab as u32, &Device::Cpu).unwrap()).unwrap();
    let trained = head.forward_ttt(&Tensor::cat(&taps, 1).unwrap(), &tokens, &embed, 1, 0).unwrap().remove(0);

    // The engine: position t pairs the hidden state of t with the token at t + 1, all at once.
    let draft = EagleDraft::load(&draft_dir, &target, &Device::Cpu, ModelDType::F32).unwrap();
    let block_size = 16;
    let kv = draft.new_kv_cache(1, block_size).unwrap();
    let batch = ForwardBatch {
        input_ids: tokens[1..].to_vec(),
        positions: (0..n as u32 - 1).collect(),
        rows: vec![BatchRow {
            query_start: 0,
            query_len: n - 1,
            context_len: n - 1,
            block_table_start: 0,
            block_table_len: 1,
        }],
        slot_mapping: (0..n as u32 - 1).collect(),
        block_tables: vec![0],
        block_size,
        logits_indices: (0..n as u32 - 1).collect(),
        ..ForwardBatch::default()
    };
    let flat = Tensor::arange(0u32, n as u32 - 1, &Device::Cpu).unwrap();
    let hidden = draft.first_hidden(&draft.first_inputs(&taps, None, &flat).unwrap()).unwrap();
    let (_, logits) = draft.forward(&hidden, &batch, &kv).unwrap();
    assert_eq!(logits.logits.dims(), trained.dims());
    let diff = testing::max_abs_diff(&logits.logits, &trained).unwrap();
    let scale = trained.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
    assert!(diff < 1e-3 * scale.max(1.0), "engine and training logits differ by {diff} (largest {scale})");
}
