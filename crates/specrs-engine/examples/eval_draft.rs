//! Acceptance of a draft on a JSON list of prompts: `cargo run -p specrs-engine --example
//! eval_draft -- <draft_dir> <prompts.json> [max_tokens] [widths,...] [--by-confidence]`.
//!
//! `--by-confidence` adds the first drafts' acceptance bucketed by the target's own
//! probability of the token it chose there.

fn main() -> anyhow::Result<()> {
    let all: Vec<String> = std::env::args().collect();
    let by_confidence = all.iter().any(|a| a == "--by-confidence");
    let args: Vec<String> = all.into_iter().filter(|a| !a.starts_with("--")).collect();
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
    if by_confidence {
        let buckets = specrs_engine::train::evaluate_first_drafts_by_confidence(
            specrs_core::model_alias::DEFAULT_MODEL_ALIAS,
            &draft,
            specrs_models::ModelDType::Auto,
            &prompts,
            max_tokens,
            &[0.0, 0.3, 0.6, 0.9, 1.0],
        )?;
        let total: usize = buckets.iter().map(|b| b.drafts).sum();
        println!("first drafts by the target's probability of its token:");
        for b in buckets {
            println!(
                "  [{:.1}, {:.1}): {:.0}% of drafts, accepted {:.2}",
                b.lower,
                b.upper,
                100.0 * b.drafts as f64 / total.max(1) as f64,
                b.accepted as f64 / b.drafts.max(1) as f64
            );
        }
    }
    Ok(())
}
