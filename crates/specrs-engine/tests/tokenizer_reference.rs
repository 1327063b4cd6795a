//! The tokenizer and chat template embedded in the default model's GGUF reproduce what
//! transformers produced: the chat-formatted prompt ids of every reference case, the decoded
//! text of every reference continuation, and the same text when streamed token by token; and
//! a conversation renders ending in a new turn, closed, or open for its final message.

use std::path::PathBuf;

use serde_json::Value;
use specrs_core::model_alias::{DEFAULT_MODEL_ALIAS, find_alias, resolve_alias};
use specrs_core::sampling::SamplingParams;
use specrs_engine::{ChatEnding, ChatMessage, Conversation, OutputState, TextTokenizer};
use specrs_models::weights::GgufSource;

fn tokenizer() -> TextTokenizer {
    let path = resolve_alias(find_alias(DEFAULT_MODEL_ALIAS).unwrap()).expect("default model installed");
    TextTokenizer::from_gguf(GgufSource::open(&path).unwrap().metadata()).unwrap()
}

fn reference() -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/smollm2_transformers.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

#[test]
fn chat_prompts_tokenize_exactly_like_transformers() {
    let tok = tokenizer();
    for case in reference()["cases"].as_array().unwrap() {
        let text =
            tok.apply_chat_template(&[ChatMessage::new("user", case["prompt"].as_str().unwrap())], true).unwrap();
        assert_eq!(tok.encode(&text, true).unwrap(), ids(&case["input_ids"]), "{}", case["prompt"]);
    }
}

#[test]
fn continuations_decode_to_the_reference_text_whole_and_streamed() {
    let tok = tokenizer();
    let eos = tok.eos_token_ids().to_vec();
    for case in reference()["cases"].as_array().unwrap() {
        let out = ids(&case["greedy_ids"]);
        // The reference text was decoded keeping special tokens (a final <|im_end|>); users
        // see the text without them.
        assert_eq!(tok.decode(&out, false).unwrap(), case["greedy_text"].as_str().unwrap());
        let expected = case["greedy_text"].as_str().unwrap().trim_end_matches("<|im_end|>");
        let mut state = OutputState::new(&SamplingParams::default(), &eos, 1000);
        let mut streamed = String::new();
        for &t in &out {
            let outcome = state.commit(&tok, &[t]).unwrap();
            let finished = outcome.finish.is_some();
            let delta = state.take_delta(finished);
            // Every chunk is whole characters: it is valid UTF-8 and has no replacement char.
            assert!(!delta.contains('\u{FFFD}'));
            streamed.push_str(&delta);
            if finished {
                break;
            }
        }
        assert_eq!(streamed, expected, "{}", case["prompt"]);
    }
}

#[test]
fn stop_strings_cut_the_text_and_hold_back_partial_matches() {
    let tok = tokenizer();
    let text = "Hello world. Goodbye world.";
    let ids = tok.encode(text, false).unwrap();
    let params = SamplingParams { stop: vec!["Goodbye".into()], ..SamplingParams::default() };
    let mut state = OutputState::new(&params, tok.eos_token_ids(), 1000);
    let mut streamed = String::new();
    let mut finish = None;
    for &t in &ids {
        let o = state.commit(&tok, &[t]).unwrap();
        finish = o.finish;
        streamed.push_str(&state.take_delta(finish.is_some()));
        assert!(!streamed.contains("Good"), "a partial stop string was streamed: {streamed:?}");
        if finish.is_some() {
            break;
        }
    }
    assert_eq!(finish, Some(specrs_engine::FinishReason::Stop));
    assert_eq!(streamed, "Hello world. ");
}

/// Stop strings count from `min_tokens` on, as in vLLM: one that appeared in the text before
/// (here "here" inside " there", token 2 of 2) is passed over, and the first later occurrence
/// stops the output, cutting it where the streamed deltas left off.
#[test]
fn stop_strings_inside_the_min_tokens_text_are_passed_over() {
    let tok = tokenizer();
    let ids = tok.encode("Hello there! I'm here to help.", false).unwrap();
    let params = SamplingParams { stop: vec!["here".into()], min_tokens: 2, ..SamplingParams::default() };
    let mut state = OutputState::new(&params, tok.eos_token_ids(), 1000);
    let mut streamed = String::new();
    let mut finish = None;
    for &t in &ids {
        finish = state.commit(&tok, &[t]).unwrap().finish;
        streamed.push_str(&state.take_delta(finish.is_some()));
        if finish.is_some() {
            break;
        }
    }
    assert_eq!(finish, Some(specrs_engine::FinishReason::Stop));
    assert_eq!(streamed, "Hello there! I'm ");
}

#[test]
fn a_conversation_ends_in_a_new_turn_closed_or_open_for_its_final_message_to_continue() {
    let tok = tokenizer();
    let messages = [ChatMessage::new("user", "Name a colour."), ChatMessage::new("assistant", "My favourite is")];
    let conversation =
        |messages: &[ChatMessage], ending| Conversation { messages: messages.to_vec(), ending, ..Default::default() };
    let render = |ending| tok.render_conversation(&conversation(&messages, ending)).unwrap();
    let closed = render(ChatEnding::Closed);
    assert_eq!(closed, tok.apply_chat_template(&messages, false).unwrap());
    assert_eq!(render(ChatEnding::GenerationPrompt), tok.apply_chat_template(&messages, true).unwrap());
    // Continuing: the closed rendering cut right after the final message's text, so the
    // model's next token follows "My favourite is" instead of an end-of-turn marker.
    let open = render(ChatEnding::ContinueFinalMessage);
    assert!(open.ends_with("My favourite is"), "{open:?}");
    assert!(closed.starts_with(&open) && closed.len() > open.len(), "{closed:?}");
    let empty = [ChatMessage::new("user", "Hi"), ChatMessage::new("assistant", "")];
    let err = tok.render_conversation(&conversation(&empty, ChatEnding::ContinueFinalMessage)).unwrap_err().to_string();
    assert!(err.contains("a final message with text to continue"), "{err}");
    assert_eq!(ChatEnding::from_flags(true, false), Ok(ChatEnding::GenerationPrompt));
    assert_eq!(ChatEnding::from_flags(false, true), Ok(ChatEnding::ContinueFinalMessage));
    assert_eq!(ChatEnding::from_flags(false, false), Ok(ChatEnding::Closed));
    assert!(ChatEnding::from_flags(true, true).unwrap_err().contains("set add_generation_prompt to false"));
}

#[test]
fn token_bytes_spell_exactly_the_text_the_tokens_encode() {
    let tok = tokenizer();
    let bytes = tok.token_bytes();
    assert_eq!(bytes.len(), tok.vocab_size());
    let text = "Héllo, wörld! 日本語 {\"k\": [1, 2]}\n\tdef f(x):\n    return x  # ✓";
    let ids = tok.encode(text, false).unwrap();
    let spelled: Vec<u8> = ids.iter().flat_map(|&id| bytes[id as usize].clone().expect("a text token")).collect();
    assert_eq!(String::from_utf8(spelled).unwrap(), text);
    for &eos in tok.eos_token_ids() {
        assert!(bytes[eos as usize].is_none(), "special tokens have no bytes");
    }
    let im_start = tok.token_to_id("<|im_start|>").unwrap();
    assert!(bytes[im_start as usize].is_none());
    // One token at a time (logprobs' `bytes`): a token holding part of a character decodes to
    // U+FFFD alone, but its bytes with its neighbours' spell the character.
    let party = tok.encode("🎉", false).unwrap();
    assert!(party.len() > 1, "the emoji spans several tokens: {party:?}");
    assert!(tok.decode(&party[..1], false).unwrap().contains('\u{FFFD}'));
    let speller = tok.speller();
    let spelled: Vec<u8> = party.iter().flat_map(|&id| speller.bytes_of(id).unwrap()).collect();
    assert_eq!(spelled, "🎉".as_bytes());
    assert_eq!(speller.bytes_of(tok.vocab_size() as u32), None, "past the vocabulary");
    // Every printable ASCII byte, newline and tab is a token of its own (byte-level BPE).
    let singles: std::collections::BTreeSet<u8> =
        bytes.iter().flatten().filter(|b| b.len() == 1).map(|b| b[0]).collect();
    assert!((b' '..=b'~').chain([b'\n', b'\t']).all(|b| singles.contains(&b)));
}
