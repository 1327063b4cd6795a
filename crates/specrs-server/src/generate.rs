//! `spec-rs generate`: one request, text streamed to stdout as it is committed (with `--n`,
//! each choice printed when it finishes), acceptance statistics live on stderr.

use std::io::Write;

use specrs_engine::{ChatMessage, EngineHandle, FinishReason, GenerationRequest, Prompt, TraceStep};

use crate::cli::GenerateArgs;

/// One choice's output so far.
#[derive(Default)]
struct Choice {
    text: String,
    tokens: usize,
    trace: Vec<TraceStep>,
}

pub fn run(handle: &EngineHandle, args: &GenerateArgs) -> Result<(), String> {
    let params = args.sampling_params();
    let prompt = if args.chat && handle.tokenizer().has_chat_template() {
        Prompt::Chat(vec![ChatMessage::new("user", args.prompt.clone())].into())
    } else {
        Prompt::Text(args.prompt.clone())
    };
    let n = params.n.max(1);
    let mut request = GenerationRequest::new(prompt, params);
    request.trace = args.trace;
    let (_, mut stream) = handle.submit(request).map_err(|e| e.to_string())?;
    let speculative = handle.info().pipeline.as_ref().is_some_and(|p| p.method.is_some());
    let mut stdout = std::io::stdout();
    let mut stderr = std::io::stderr();
    let (mut steps, mut accepted, mut drafted) = (0usize, 0usize, 0usize);
    let started = std::time::Instant::now();
    // One choice streams as it is committed; several are printed each when it finishes.
    let mut choices: Vec<Choice> = (0..n).map(|_| Choice::default()).collect();
    while let Some(out) = stream.blocking_recv() {
        let Some(choice) = choices.get_mut(out.index) else { continue };
        if n == 1 {
            let _ = write!(stdout, "{}", out.text);
            let _ = stdout.flush();
        } else {
            choice.text.push_str(&out.text);
        }
        choice.tokens += out.token_ids.len();
        for t in &out.trace {
            steps += 1;
            accepted += t.num_accepted;
            drafted += t.drafted.len();
        }
        choice.trace.extend(out.trace.iter().cloned());
        if let Some(reason) = out.finish_reason {
            let label = if n == 1 { String::new() } else { format!("choice {}: ", out.index) };
            if n > 1 {
                let _ = write!(stdout, "[choice {}]\n{}", out.index, choice.text);
            }
            let _ = writeln!(stdout);
            let secs = started.elapsed().as_secs_f64();
            if let Some(m) = &out.metrics {
                let tokens = choice.tokens;
                let mut line = format!(
                    "[{label}{tokens} tokens in {secs:.2}s, {:.1} tok/s, finish: {}]",
                    tokens as f64 / secs.max(1e-9),
                    reason.as_str()
                );
                if speculative {
                    line.push_str(&format!(
                        " drafts accepted {}/{} ({:.0}%), acceptance length {:.2}, per position {:?}",
                        m.num_accepted_tokens,
                        m.num_draft_tokens,
                        100.0 * m.num_accepted_tokens as f64 / (m.num_draft_tokens.max(1)) as f64,
                        m.acceptance_length,
                        m.accepted_per_position
                    ));
                }
                let _ = writeln!(stderr, "{line}");
            }
            if reason == FinishReason::Error {
                return Err(out.error.map_or_else(|| "generation failed".into(), |failure| failure.message));
            }
        }
        if out.is_finished() {
            break;
        }
        if speculative && args.trace {
            let _ = write!(stderr, "\r[{steps} steps, {accepted}/{drafted} drafts accepted]");
        }
    }
    if args.trace {
        let _ = writeln!(stderr, "draft trace (position: drafted | target | accepted):");
        for (index, choice) in choices.iter().enumerate() {
            if n > 1 {
                let _ = writeln!(stderr, " choice {index}:");
            }
            for t in &choice.trace {
                let _ = writeln!(stderr, "  {}: {:?} | {:?} | {}", t.position, t.drafted, t.target, t.num_accepted);
            }
        }
    }
    Ok(())
}
