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
    // it writes back are the ones it started from.
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
        assert_eq!(diff, 0.0, "{name} changed by {diff} with a vanishing learning rate");
    }
    let warm_config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(warm.output.join("config.json")).unwrap()).unwrap();
    assert_eq!(warm_config["draft_vocab_size"], config["draft_vocab_size"]);
    assert_eq!(warm_config["eagle_aux_hidden_state_layer_ids"], config["eagle_aux_hidden_state_layer_ids"]);

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
