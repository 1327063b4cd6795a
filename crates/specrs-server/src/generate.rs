//! `spec-rs generate`: one request, text streamed to stdout as it is committed, acceptance
//! statistics live on stderr.

use std::io::Write;

use specrs_engine::{ChatMessage, EngineHandle, FinishReason, GenerationRequest, Prompt};

use crate::cli::GenerateArgs;

pub fn run(handle: &EngineHandle, args: &GenerateArgs) -> Result<(), String> {
    let params = args.sampling_params();
    let prompt = if args.chat && handle.tokenizer().has_chat_template() {
        Prompt::Chat(vec![ChatMessage::new("user", args.prompt.clone())].into())
    } else {
        Prompt::Text(args.prompt.clone())
    };
    let mut request = GenerationRequest::new(prompt, params);
    request.trace = args.trace;
    let (_, mut stream) = handle.submit(request).map_err(|e| e.to_string())?;
    let speculative = handle.info().pipeline.as_ref().is_some_and(|p| p.method.is_some());
    let mut stdout = std::io::stdout();
    let mut stderr = std::io::stderr();
    let (mut tokens, mut steps, mut accepted, mut drafted) = (0usize, 0usize, 0usize, 0usize);
    let started = std::time::Instant::now();
    let mut trace = Vec::new();
    while let Some(out) = stream.blocking_recv() {
        let _ = write!(stdout, "{}", out.text);
        let _ = stdout.flush();
        tokens += out.token_ids.len();
        for t in &out.trace {
            steps += 1;
            accepted += t.num_accepted;
            drafted += t.drafted.len();
        }
        trace.extend(out.trace.iter().cloned());
        if let Some(reason) = out.finish_reason {
            let _ = writeln!(stdout);
            let secs = started.elapsed().as_secs_f64();
            if let Some(m) = &out.metrics {
                let mut line = format!(
                    "[{tokens} tokens in {secs:.2}s, {:.1} tok/s, finish: {}]",
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
                return Err(out.error.unwrap_or_else(|| "generation failed".into()));
            }
            break;
        }
        if speculative && args.trace {
            let _ = write!(stderr, "\r[{steps} steps, {accepted}/{drafted} drafts accepted]");
        }
    }
    if args.trace {
        let _ = writeln!(stderr, "draft trace (position: drafted | target | accepted):");
        for t in trace {
            let _ = writeln!(stderr, "  {}: {:?} | {:?} | {}", t.position, t.drafted, t.target, t.num_accepted);
        }
    }
    Ok(())
}
