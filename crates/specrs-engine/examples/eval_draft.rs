//! Acceptance of a draft on a JSON list of prompts: `cargo run -p specrs-engine --example
//! eval_draft -- <draft_dir> <prompts.json> [max_tokens] [widths,...]`.

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let draft = std::path::PathBuf::from(&args[1]);
    let prompts: Vec<String> = serde_json::from_str(&std::fs::read_to_string(&args[2])?)?;
    let max_tokens = args.get(3).map_or(Ok(64), |s| s.parse())?;
    let widths: Vec<usize> =
        args.get(4).map_or("3".into(), |s| s.clone()).split(',').map(|w| w.parse()).collect::<Result<_, _>>()?;
    let results = specrs_engine::train::evaluate_draft(
        specrs_core::model_alias::DEFAULT_MODEL_ALIAS,
        &draft,
        specrs_models::ModelDType::Auto,
        &widths,
        &prompts,
        max_tokens,
    )?;
    for (k, len, pp) in results {
        println!("K={k}: acceptance length {len:.3}, per position {pp:.3?}");
    }
    Ok(())
}
