//! Request-level behaviour of the engine on a tiny bigram target: stop conditions and
//! `min_tokens`, prompt logprobs, admission, and requests with several choices (`n`),
//! independent of any drafter.

use candle_core::{Device, Tensor};
use specrs_core::sampling::SamplingParams;
use specrs_engine::{
    EngineConfig, EngineHandle, FinishReason, GenerationRequest, PipelineConfig, Prompt, StopReason, build_engine,
};
use specrs_models::ModelDType;
use specrs_models::config::Architecture;
use specrs_models::testing::{self, TinyShape};

const SHAPE: TinyShape =
    TinyShape { vocab: 48, hidden: 64, layers: 2, heads: 4, kv_heads: 2, head_dim: 16, intermediate: 64 };
const EOS: u32 = 47;

/// A bigram target whose successor of token 5 is EOS.
fn engine(dir: &std::path::Path) -> EngineHandle {
    engine_with(
        dir,
        EngineConfig { max_num_seqs: 4, kv_cache_bytes: 16 << 20, block_size: 4, ..EngineConfig::default() },
    )
}

/// The successor the target of [`engine`] predicts after `token`.
fn successor(token: u32) -> u32 {
    if token == 5 { EOS } else { testing::bigram_successor(SHAPE.vocab)[token as usize] }
}

fn engine_with(dir: &std::path::Path, engine_cfg: EngineConfig) -> EngineHandle {
    let mut t = testing::bigram_target(Architecture::Llama, &SHAPE).unwrap();
    let next = testing::bigram_successor(SHAPE.vocab);
    let mut head = t["lm_head.weight"].to_vec2::<f32>().unwrap();
    head[next[5] as usize][5] = 0.0;
    head[EOS as usize][5] = 1.0;
    t.insert("lm_head.weight".into(), Tensor::new(head, &Device::Cpu).unwrap());
    testing::write_checkpoint(dir, &testing::target_config(Architecture::Llama, &SHAPE, false), &t).unwrap();
    let mut cfg = PipelineConfig::new(dir.to_str().unwrap());
    cfg.dtype = ModelDType::F32;
    cfg.engine = engine_cfg;
    let (engine, info) = build_engine(&cfg).unwrap();
    EngineHandle::spawn(engine, Some(info))
}

fn run(h: &EngineHandle, params: SamplingParams) -> specrs_engine::FinalOutput {
    h.generate(vec![GenerationRequest::new(Prompt::Tokens(vec![1, 5]), params)]).unwrap().remove(0)
}

#[test]
fn eos_stops_and_min_tokens_keeps_it_from_ending_early() {
    let dir = tempfile::tempdir().unwrap();
    let h = engine(dir.path());
    let greedy = SamplingParams { temperature: 0.0, max_tokens: Some(10), ..SamplingParams::default() };
    let out = run(&h, greedy.clone());
    assert_eq!(out.token_ids, vec![EOS]);
    assert_eq!(out.finish_reason, FinishReason::Stop);
    let out = run(&h, SamplingParams { min_tokens: 3, ..greedy.clone() });
    assert!(out.token_ids.len() >= 3, "{:?}", out.token_ids);
    assert!(!out.token_ids[..3].contains(&EOS), "EOS before min_tokens: {:?}", out.token_ids);
    let out = run(&h, SamplingParams { ignore_eos: true, ..greedy.clone() });
    assert_eq!((out.token_ids.len(), out.finish_reason), (10, FinishReason::Length));
    let out = run(&h, SamplingParams { stop_token_ids: vec![out.token_ids[2]], ignore_eos: true, ..greedy });
    assert_eq!((out.token_ids.len(), out.finish_reason), (3, FinishReason::Stop));
    let (free, total) = h.kv_blocks().unwrap();
    assert_eq!(free, total);
}

#[test]
fn prompt_logprobs_score_each_prompt_token_against_its_context_across_prefill_chunks() {
    // Follows the bigram chain except at position 4, where the prompt takes another token.
    let mut prompt = vec![1u32];
    for i in 1..10 {
        let expected = successor(prompt[i - 1]);
        prompt.push(if i == 4 { (expected + 1) % EOS } else { expected });
    }
    let params =
        SamplingParams { temperature: 0.0, max_tokens: Some(2), prompt_logprobs: Some(1), ..SamplingParams::default() };
    let score = |h: &EngineHandle| {
        h.generate(vec![GenerationRequest::new(Prompt::Tokens(prompt.clone()), params.clone())]).unwrap().remove(0)
    };
    let dir = tempfile::tempdir().unwrap();
    let whole = score(&engine(dir.path()));
    assert_eq!(whole.prompt_logprobs.len(), prompt.len());
    assert_eq!(whole.prompt_logprobs[0], None, "nothing predicts the first prompt token");
    for (k, lp) in whole.prompt_logprobs.iter().enumerate().skip(1) {
        let lp = lp.as_ref().unwrap();
        assert_eq!(lp.token, prompt[k]);
        assert_eq!(lp.top.len(), 1);
        assert_eq!(lp.top[0].0, successor(prompt[k - 1]), "position {k}");
        assert_eq!(lp.top[0].0 == lp.token, k != 4, "position {k}: {lp:?}");
        assert_eq!(lp.rank == 1, k != 4, "only the off-chain token is not the most likely: {lp:?}");
    }
    // Three tokens a step: the prompt arrives in four chunks and is scored the same.
    let small = EngineConfig {
        max_num_seqs: 4,
        kv_cache_bytes: 16 << 20,
        block_size: 4,
        max_num_batched_tokens: 3,
        ..EngineConfig::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let h = engine_with(dir.path(), small);
    let chunked = score(&h);
    assert_eq!(chunked.token_ids, whole.token_ids);
    assert_eq!(chunked.prompt_logprobs.len(), prompt.len());
    for (a, b) in chunked.prompt_logprobs.iter().zip(&whole.prompt_logprobs).skip(1) {
        let (a, b) = (a.as_ref().unwrap(), b.as_ref().unwrap());
        assert_eq!((a.token, a.top[0].0), (b.token, b.top[0].0));
        assert!((a.logprob - b.logprob).abs() < 1e-4, "{a:?} vs {b:?}");
    }
    let (free, total) = h.kv_blocks().unwrap();
    assert_eq!(free, total);
}

#[test]
fn a_zero_prefill_chunk_is_refused_naming_it_rather_than_stalling_every_request() {
    let dir = tempfile::tempdir().unwrap();
    let t = testing::bigram_target(Architecture::Llama, &SHAPE).unwrap();
    testing::write_checkpoint(dir.path(), &testing::target_config(Architecture::Llama, &SHAPE, false), &t).unwrap();
    let mut cfg = PipelineConfig::new(dir.path().to_str().unwrap());
    cfg.dtype = ModelDType::F32;
    cfg.engine = EngineConfig { max_prefill_chunk: 0, kv_cache_bytes: 16 << 20, ..EngineConfig::default() };
    let Err(specrs_engine::EngineError::Config(e)) = build_engine(&cfg) else {
        panic!("built an engine that never prefills")
    };
    assert_eq!(e.field.as_deref(), Some("max_prefill_chunk"));
}

#[test]
fn prompt_logprobs_are_one_per_prompt_token_after_preemption_and_for_a_one_token_prompt() {
    let params = SamplingParams {
        temperature: 0.0,
        max_tokens: Some(20),
        ignore_eos: true,
        prompt_logprobs: Some(1),
        ..SamplingParams::default()
    };
    let prompts: Vec<Vec<u32>> = (0..4u32).map(|i| (0..6).map(|t| (i * 5 + t) % 40 + 1).collect()).collect();
    let requests = || -> Vec<GenerationRequest> {
        prompts.iter().map(|p| GenerationRequest::new(Prompt::Tokens(p.clone()), params.clone())).collect()
    };
    let roomy_dir = tempfile::tempdir().unwrap();
    let roomy = engine(roomy_dir.path()).generate(requests()).unwrap();
    // K and V, f32, per token of the target's layers; 10 blocks of 4 tokens hold one
    // 32-token sequence, so four growing to 26 tokens each preempt one another.
    let per_token = 2 * SHAPE.kv_heads * SHAPE.head_dim * 4 * SHAPE.layers;
    let tight = EngineConfig {
        max_num_seqs: 4,
        block_size: 4,
        max_model_len: Some(32),
        kv_cache_bytes: (per_token * 4 * 10) as u64,
        enable_prefix_caching: false,
        ..EngineConfig::default()
    };
    let tight_dir = tempfile::tempdir().unwrap();
    let h = engine_with(tight_dir.path(), tight);
    let pressed = h.generate(requests()).unwrap();
    assert!(h.metrics().num_preemptions.load(std::sync::atomic::Ordering::Relaxed) > 0, "the pool was under pressure");
    for (i, (a, b)) in pressed.iter().zip(&roomy).enumerate() {
        assert_eq!(a.token_ids, b.token_ids, "request {i}");
        assert_eq!(a.prompt_logprobs.len(), prompts[i].len(), "request {i}: scored once, output never");
        assert_eq!(a.prompt_logprobs[0], None);
        for (x, y) in a.prompt_logprobs.iter().zip(&b.prompt_logprobs).skip(1) {
            let (x, y) = (x.as_ref().unwrap(), y.as_ref().unwrap());
            assert_eq!((x.token, x.top[0].0), (y.token, y.top[0].0), "request {i}");
            assert!((x.logprob - y.logprob).abs() < 1e-4, "request {i}: scored in its own context: {x:?} vs {y:?}");
        }
    }
    let one = h.generate(vec![GenerationRequest::new(Prompt::Tokens(vec![3]), params)]).unwrap().remove(0);
    assert_eq!(one.prompt_logprobs, vec![None], "a one-token prompt has its one unpredicted entry");
}

#[test]
fn one_generate_call_starts_all_its_requests_in_the_same_step() {
    let dir = tempfile::tempdir().unwrap();
    let h = engine(dir.path());
    let params =
        SamplingParams { temperature: 0.0, max_tokens: Some(5), ignore_eos: true, ..SamplingParams::default() };
    let requests: Vec<_> =
        (0..4).map(|i| GenerationRequest::new(Prompt::Tokens(vec![1, 2 + i]), params.clone())).collect();
    let outs = h.generate(requests).unwrap();
    assert!(outs.iter().all(|o| o.token_ids.len() == 5), "{outs:?}");
    // One step prefills all four prompts and samples their first tokens; four decode steps
    // follow. Admitted one by one, each request would have waited a step for the previous.
    // (The outputs arrive before the engine counts the last step; a command waits for it.)
    h.kv_blocks().unwrap();
    assert_eq!(h.metrics().steps.load(std::sync::atomic::Ordering::Relaxed), 5);
}

#[test]
fn a_refused_request_fails_its_generate_call_and_aborts_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let h = engine(dir.path());
    let params =
        SamplingParams { temperature: 0.0, max_tokens: Some(50), ignore_eos: true, ..SamplingParams::default() };
    let requests = vec![
        GenerationRequest::new(Prompt::Tokens(vec![1, 2]), params.clone()),
        GenerationRequest::new(Prompt::Tokens(vec![1, SHAPE.vocab as u32]), params.clone()),
    ];
    let err = h.generate(requests).unwrap_err().to_string();
    assert!(err.contains("outside the vocabulary"), "{err}");
    let (free, total) = h.kv_blocks().unwrap();
    assert_eq!(free, total, "the admitted request was aborted and its KV freed");
    let out = h.generate(vec![GenerationRequest::new(Prompt::Tokens(vec![1, 2]), params)]).unwrap();
    assert_eq!(out[0].token_ids.len(), 50, "the engine keeps serving");
}

/// Sampled hot enough that the bigram target's choices diverge (its successor logit leads
/// the others by 8, so temperature 2 leaves it about half the mass).
fn sampled(n: usize, max_tokens: usize) -> SamplingParams {
    SamplingParams {
        temperature: 2.0,
        seed: Some(11),
        n,
        max_tokens: Some(max_tokens),
        ignore_eos: true,
        ..SamplingParams::default()
    }
}

#[test]
fn a_request_with_n_choices_returns_them_in_index_order_and_its_first_equals_the_single_choice_run() {
    let dir = tempfile::tempdir().unwrap();
    let h = engine(dir.path());
    let request = |n| GenerationRequest::new(Prompt::Tokens(vec![1, 2]), sampled(n, 12));
    let outs = h.generate(vec![request(3), request(1)]).unwrap();
    assert_eq!(outs.len(), 4, "three choices, then the single-choice request");
    assert_eq!(outs.iter().map(|o| o.index).collect::<Vec<_>>(), [0, 1, 2, 0]);
    assert!(outs[..3].iter().all(|o| o.request_id == outs[0].request_id));
    assert_ne!(outs[3].request_id, outs[0].request_id);
    assert!(outs.iter().all(|o| o.token_ids.len() == 12 && o.finish_reason == FinishReason::Length));
    assert!(outs.iter().all(|o| o.prompt_token_ids == [1, 2]), "every choice names its prompt");
    assert_eq!(outs[0].token_ids, outs[3].token_ids, "choice 0 runs with the request's own seed");
    assert!(
        outs[1].token_ids != outs[0].token_ids && outs[2].token_ids != outs[1].token_ids,
        "choices are independent samples: {outs:?}"
    );
    let again = h.generate(vec![request(3)]).unwrap();
    for (a, b) in again.iter().zip(&outs) {
        assert_eq!(a.token_ids, b.token_ids, "a seeded request's choices are reproducible");
    }
    let (free, total) = h.kv_blocks().unwrap();
    assert_eq!(free, total);
}

#[test]
fn a_streamed_request_ends_once_every_choice_has_and_an_abort_cancels_every_choice() {
    let dir = tempfile::tempdir().unwrap();
    let h = engine(dir.path());
    let (id, mut stream) = h.submit(GenerationRequest::new(Prompt::Tokens(vec![1, 2]), sampled(2, 6))).unwrap();
    let mut outs = Vec::new();
    while let Some(o) = stream.blocking_recv() {
        let done = o.is_finished();
        outs.push(o);
        if done {
            break;
        }
    }
    assert!(outs.iter().all(|o| o.request_id == id));
    for index in 0..2 {
        let mine: Vec<_> = outs.iter().filter(|o| o.index == index).collect();
        assert_eq!(mine[0].prompt_token_ids, [1, 2], "a choice's first output names its prompt");
        assert!(mine[1..].iter().all(|o| o.prompt_token_ids.is_empty()), "and only its first");
    }
    assert_eq!(outs.iter().filter(|o| o.finished).count(), 1, "only the last output ends the request");
    assert!(outs.last().unwrap().finished);
    for index in 0..2 {
        let reasons: Vec<_> = outs.iter().filter(|o| o.index == index).filter_map(|o| o.finish_reason).collect();
        assert_eq!(reasons, [FinishReason::Length], "choice {index} finishes once");
        let tokens: usize = outs.iter().filter(|o| o.index == index).map(|o| o.token_ids.len()).sum();
        assert_eq!(tokens, 6);
    }

    let (id, mut stream) = h.submit(GenerationRequest::new(Prompt::Tokens(vec![1, 2]), sampled(3, 10_000))).unwrap();
    stream.blocking_recv().unwrap();
    h.abort(id);
    let mut aborted = std::collections::BTreeSet::new();
    while let Some(o) = stream.blocking_recv() {
        if o.finish_reason == Some(FinishReason::Abort) {
            aborted.insert(o.index);
        }
        if o.is_finished() {
            break;
        }
    }
    assert_eq!(aborted.into_iter().collect::<Vec<_>>(), [0, 1, 2]);
    let (free, total) = h.kv_blocks().unwrap();
    assert_eq!(free, total, "every choice's KV blocks are freed");
}

#[test]
fn greedy_requests_and_more_choices_than_the_engine_runs_at_once_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let h = engine(dir.path());
    let greedy = SamplingParams { n: 2, ..SamplingParams::greedy() };
    let err = h.generate(vec![GenerationRequest::new(Prompt::Tokens(vec![1, 2]), greedy)]).unwrap_err().to_string();
    assert!(err.contains("n must be 1 when decoding greedily"), "{err}");
    let err =
        h.generate(vec![GenerationRequest::new(Prompt::Tokens(vec![1, 2]), sampled(5, 4))]).unwrap_err().to_string();
    assert!(err.contains("n = 5 choices exceed max_num_seqs = 4"), "{err}");
    assert_eq!(h.generate(vec![GenerationRequest::new(Prompt::Tokens(vec![1, 2]), sampled(4, 4))]).unwrap().len(), 4);
}

#[test]
fn allowed_token_ids_confine_greedy_and_sampled_choices_to_their_set() {
    let dir = tempfile::tempdir().unwrap();
    let h = engine(dir.path());
    let allowed = Some(vec![9, 10]);
    let greedy = SamplingParams {
        temperature: 0.0,
        max_tokens: Some(8),
        allowed_token_ids: allowed.clone(),
        ..SamplingParams::default()
    };
    let out = run(&h, greedy);
    assert_eq!(out.token_ids.len(), 8, "EOS is not allowed, so nothing stops early");
    assert!(out.token_ids.iter().all(|t| [9, 10].contains(t)), "{:?}", out.token_ids);
    let sampled = run(&h, SamplingParams { allowed_token_ids: allowed, ..sampled(1, 24) });
    assert!(sampled.token_ids.iter().all(|t| [9, 10].contains(t)), "{:?}", sampled.token_ids);
    assert!(sampled.token_ids.contains(&9) && sampled.token_ids.contains(&10), "both are drawn at temperature 2");
}

#[test]
fn bad_words_never_appear_in_greedy_or_sampled_output() {
    let dir = tempfile::tempdir().unwrap();
    let h = engine(dir.path());
    let greedy =
        SamplingParams { temperature: 0.0, max_tokens: Some(12), ignore_eos: true, ..SamplingParams::default() };
    let free = h.generate(vec![GenerationRequest::new(Prompt::Tokens(vec![1, 2]), greedy.clone())]).unwrap().remove(0);
    // A two-token word the free output contains, and a one-token one.
    let words = vec![
        h.tokenizer().decode(&free.token_ids[3..5], true).unwrap(),
        h.tokenizer().decode(&free.token_ids[8..9], true).unwrap(),
    ];
    let banned = specrs_core::sampling::bad_word_token_ids(&words, |w| h.tokenizer().encode(w, false)).unwrap();
    let contains = |out: &[u32], seq: &[u32]| out.windows(seq.len()).any(|w| w == seq);
    assert!(banned.iter().any(|seq| contains(&free.token_ids, seq)), "{words:?} -> {banned:?} in {:?}", free.token_ids);
    let with_bad_words = |params: SamplingParams| {
        let params = SamplingParams { bad_words: words.clone(), ..params };
        h.generate(vec![GenerationRequest::new(Prompt::Tokens(vec![1, 2]), params)]).unwrap().remove(0)
    };
    let restricted = with_bad_words(greedy.clone());
    assert_eq!(restricted.token_ids.len(), 12);
    assert_eq!(restricted.token_ids[..3], free.token_ids[..3], "the output is free until a word would complete");
    let sampled = with_bad_words(SamplingParams { ignore_eos: true, ..sampled(1, 24) });
    for out in [&restricted.token_ids, &sampled.token_ids] {
        assert!(banned.iter().all(|seq| !contains(out, seq)), "{banned:?} in {out:?}");
    }
    let err = h
        .generate(vec![GenerationRequest::new(
            Prompt::Tokens(vec![1, 2]),
            SamplingParams { bad_words: vec![" ".into()], ..greedy },
        )])
        .unwrap_err()
        .to_string();
    assert!(err.contains("bad_words entries must not be empty"), "{err}");
}

#[test]
fn stop_strings_and_stop_tokens_stay_in_the_text_only_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let h = engine(dir.path());
    let greedy =
        SamplingParams { temperature: 0.0, max_tokens: Some(6), ignore_eos: true, ..SamplingParams::default() };
    let full = h.generate(vec![GenerationRequest::new(Prompt::Tokens(vec![1, 2]), greedy.clone())]).unwrap().remove(0);
    let stop = h.tokenizer().decode(&full.token_ids[2..3], true).unwrap();
    let at = full.text.find(&stop).unwrap();
    let stopped = |include| {
        let params = SamplingParams { stop: vec![stop.clone()], include_stop_str_in_output: include, ..greedy.clone() };
        h.generate(vec![GenerationRequest::new(Prompt::Tokens(vec![1, 2]), params)]).unwrap().remove(0)
    };
    let (left_out, kept) = (stopped(false), stopped(true));
    assert_eq!(left_out.text, full.text[..at]);
    assert_eq!(kept.text, full.text[..at + stop.len()]);
    assert_eq!((left_out.finish_reason, kept.finish_reason), (FinishReason::Stop, FinishReason::Stop));
    assert_eq!(kept.token_ids, left_out.token_ids);
    // vLLM's stop_reason: the string or token id that stopped it; none for a length limit.
    assert_eq!(left_out.stop_reason, Some(StopReason::Text(stop.clone())));
    assert_eq!(full.stop_reason, None);
    let by_token = SamplingParams { stop_token_ids: vec![full.token_ids[3]], ..greedy.clone() };
    let by_token = h.generate(vec![GenerationRequest::new(Prompt::Tokens(vec![1, 2]), by_token)]).unwrap().remove(0);
    assert_eq!(by_token.stop_reason, Some(StopReason::Token(full.token_ids[3])));

    // Token 5's successor is EOS (`</s>`, a special token): its text shows only when special
    // tokens are kept, and, as the token that stopped the output, only with the stop included.
    let eos = |ignore_eos, include, skip| {
        let params = SamplingParams {
            temperature: 0.0,
            max_tokens: Some(2),
            ignore_eos,
            include_stop_str_in_output: include,
            skip_special_tokens: skip,
            ..SamplingParams::default()
        };
        h.generate(vec![GenerationRequest::new(Prompt::Tokens(vec![1, 5]), params)]).unwrap().remove(0).text
    };
    assert!(!eos(true, false, true).contains("</s>"));
    assert!(eos(true, false, false).starts_with("</s>"));
    assert_eq!(eos(false, false, false), "");
    assert_eq!(eos(false, true, false), "</s>");
    assert_eq!(eos(false, true, true), "");
    let params = SamplingParams { temperature: 0.0, max_tokens: Some(2), ..SamplingParams::default() };
    let at_eos = h.generate(vec![GenerationRequest::new(Prompt::Tokens(vec![1, 5]), params)]).unwrap().remove(0);
    assert_eq!((at_eos.finish_reason, at_eos.stop_reason), (FinishReason::Stop, None), "EOS stops without a reason");
}

#[test]
fn truncate_prompt_tokens_keeps_the_latest_prompt_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let h = engine(dir.path());
    let greedy =
        SamplingParams { temperature: 0.0, max_tokens: Some(4), ignore_eos: true, ..SamplingParams::default() };
    let truncated = SamplingParams { truncate_prompt_tokens: Some(2), ..greedy.clone() };
    let outs = h
        .generate(vec![
            GenerationRequest::new(Prompt::Tokens(vec![1, 2, 3, 4, 6, 7]), truncated.clone()),
            GenerationRequest::new(Prompt::Tokens(vec![6, 7]), greedy),
            GenerationRequest::new(Prompt::Tokens(vec![7]), truncated),
        ])
        .unwrap();
    assert_eq!((outs[0].num_prompt_tokens, outs[0].prompt_token_ids.as_slice()), (2, &[6, 7][..]));
    assert_eq!(outs[0].token_ids, outs[1].token_ids);
    assert_eq!(outs[2].prompt_token_ids, [7], "a shorter prompt is kept whole");
}
