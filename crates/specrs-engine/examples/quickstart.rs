//! The README's Rust example: generate with the default model and an n-gram drafter.
//!
//! `cargo run --release -p specrs-engine --example quickstart`

use specrs_core::{SpeculativeConfig, SpeculativeMethod, sampling::SamplingParams};
use specrs_engine::{EngineHandle, GenerationRequest, PipelineConfig, Prompt, build_engine};

fn main() -> specrs_engine::Result<()> {
    let mut cfg = PipelineConfig::new("smollm2-135m-instruct");
    cfg.speculative = SpeculativeConfig { speculative_method: Some(SpeculativeMethod::Ngram), ..Default::default() };
    let (engine, info) = build_engine(&cfg)?;
    let handle = EngineHandle::spawn(engine, Some(info));
    let out = handle.generate(vec![GenerationRequest::new(
        Prompt::Text("def fibonacci(n):".into()),
        SamplingParams { temperature: 0.0, max_tokens: Some(64), ..Default::default() },
    )])?;
    println!("{} (acceptance length {:.2})", out[0].text, out[0].metrics.acceptance_length);
    Ok(())
}
