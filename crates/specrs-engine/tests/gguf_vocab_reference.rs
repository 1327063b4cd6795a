//! The tokenizers built from GGUF metadata give, on llama.cpp's tokenizer test texts, exactly
//! the ids Hugging Face's tokenizer gives (the `.out` files beside each `ggml-vocab-*.gguf`):
//! SentencePiece vocabularies (Llama 2, Phi-3) and byte-level BPE ones (GPT-2, Llama 3, Qwen2,
//! Qwen 3.5, StarCoder, Refact, Command-R, DeepSeek LLM and Coder, Falcon, MPT). The fixtures come from llama-cpp-python's PyPI source release through
//! `scripts/fetch-vocab-fixtures.py`, which `scripts/test.sh` runs.

use std::path::PathBuf;

use candle_core::quantized::gguf_file;
use specrs_engine::{OutputState, TextTokenizer};

fn fixture_dir() -> PathBuf {
    let dir = match std::env::var_os("SPECRS_VOCAB_FIXTURES") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").expect("HOME is set")).join(".cache/spec-rs/vocab-fixtures"),
    };
    assert!(
        dir.join("ggml-vocab-llama-spm.gguf").is_file(),
        "the GGUF vocabulary fixtures are not in {}: run `python3 scripts/fetch-vocab-fixtures.py`",
        dir.display()
    );
    dir
}

/// The tokenizer of `ggml-vocab-<name>.gguf` and its (text, Hugging Face ids) cases.
fn vocab(name: &str) -> (TextTokenizer, Vec<(String, Vec<u32>)>) {
    let dir = fixture_dir();
    let gguf = dir.join(format!("ggml-vocab-{name}.gguf"));
    // Vocabulary-only files: their architectures need not be ones spec-rs runs.
    let content = gguf_file::Content::read(&mut std::fs::File::open(&gguf).unwrap()).unwrap();
    let tokenizer = TextTokenizer::from_gguf(&content.metadata).unwrap();
    let inputs = std::fs::read_to_string(dir.join(format!("ggml-vocab-{name}.gguf.inp"))).unwrap();
    let outputs = std::fs::read_to_string(dir.join(format!("ggml-vocab-{name}.gguf.out"))).unwrap();
    let texts: Vec<String> = inputs.split("\n__ggml_vocab_test__\n").map(str::to_string).collect();
    let ids: Vec<Vec<u32>> =
        outputs.lines().map(|line| line.split_whitespace().map(|id| id.parse().unwrap()).collect()).collect();
    // The input file ends with a separator, leaving one empty piece after the last text.
    let texts = &texts[..ids.len()];
    assert!(ids.len() >= 30, "{name}: only {} cases", ids.len());
    (tokenizer, texts.iter().cloned().zip(ids).collect())
}

/// Every case encodes to Hugging Face's ids, decodes back to its text, and streams as the same
/// text token by token.
fn check(name: &str) {
    let (tokenizer, cases) = vocab(name);
    let mut mismatches = Vec::new();
    for (text, expected) in &cases {
        let ids = tokenizer.encode(text, false).unwrap();
        if &ids != expected {
            mismatches.push(format!("{text:?}\n   ours: {ids:?}\n     HF: {expected:?}"));
            continue;
        }
        let decoded = tokenizer.decode(&ids, false).unwrap();
        assert_eq!(&decoded, text, "{name}: {text:?} does not decode back to itself");
        let mut state = OutputState::new(&Default::default(), &[], usize::MAX);
        let mut streamed = String::new();
        for &id in &ids {
            state.commit(&tokenizer, &[id]).unwrap();
            streamed.push_str(&state.take_delta(false));
        }
        streamed.push_str(&state.take_delta(true));
        assert_eq!(&streamed, text, "{name}: {text:?} streams differently");
    }
    assert!(
        mismatches.is_empty(),
        "{name}: {} of {} cases differ:\n{}",
        mismatches.len(),
        cases.len(),
        mismatches.join("\n")
    );
}

#[test]
fn llama_sentencepiece_vocabulary_tokenizes_like_hugging_face() {
    check("llama-spm");
}

#[test]
fn phi3_sentencepiece_vocabulary_tokenizes_like_hugging_face() {
    check("phi-3");
}

#[test]
fn gpt2_vocabulary_tokenizes_like_hugging_face() {
    check("gpt-2");
}

#[test]
fn llama3_vocabulary_tokenizes_like_hugging_face() {
    check("llama-bpe");
}

#[test]
fn qwen2_vocabulary_tokenizes_like_hugging_face() {
    check("qwen2");
}

#[test]
fn starcoder_vocabulary_tokenizes_like_hugging_face() {
    check("starcoder");
}

#[test]
fn refact_vocabulary_tokenizes_like_hugging_face() {
    check("refact");
}

#[test]
fn phi3_special_tokens_eat_the_whitespace_after_them_and_llama_2_ones_do_not() {
    let (phi3, _) = vocab("phi-3");
    let id = |t: &TextTokenizer, token: &str| t.token_to_id(token).unwrap();
    let prompt = "<|user|>\nHello<|end|>\n<|assistant|>\n";
    assert_eq!(
        phi3.encode(prompt, false).unwrap(),
        [id(&phi3, "<|user|>"), id(&phi3, "▁Hello"), id(&phi3, "<|end|>"), id(&phi3, "<|assistant|>")]
    );
    // `<s>` keeps what follows it, as in Phi-3's tokenizer.json.
    assert_eq!(phi3.encode("<s> Hi", false).unwrap(), [id(&phi3, "<s>"), id(&phi3, "▁"), id(&phi3, "▁Hi")]);
    let (llama2, _) = vocab("llama-spm");
    assert_eq!(
        llama2.encode("</s>\nHello", false).unwrap(),
        [id(&llama2, "</s>"), id(&llama2, "▁"), id(&llama2, "<0x0A>"), id(&llama2, "Hello")]
    );
}

#[test]
fn a_vocabulary_without_add_bos_token_starts_text_with_bos_as_llama_cpp_defaults_it() {
    // Neither fixture has the key. Llama 3's byte-level BPE ("llama-bpe") starts text with
    // `<|begin_of_text|>`, as llama.cpp does; GPT-2's does not.
    let (llama3, _) = vocab("llama-bpe");
    let text = llama3.encode("Hello", false).unwrap();
    let bos = llama3.token_to_id("<|begin_of_text|>").unwrap();
    assert_eq!(llama3.encode("Hello", true).unwrap(), [&[bos][..], &text].concat());
    let (gpt2, _) = vocab("gpt-2");
    assert_eq!(gpt2.encode("Hello", true).unwrap(), gpt2.encode("Hello", false).unwrap());
}

#[test]
fn a_chat_prompt_gets_one_bos_whether_or_not_its_template_wrote_it() {
    // Llama 2's vocabulary sets `add_bos_token`.
    let (tok, _) = vocab("llama-spm");
    let bos = tok.bos_token_id().unwrap();
    let bos_text = tok.decode(&[bos], false).unwrap();
    let text = tok.encode("Hello", false).unwrap();
    assert_eq!(tok.encode("Hello", true).unwrap(), [&[bos][..], &text].concat(), "a text prompt gets the BOS");
    let templated = tok.encode_chat(&format!("{bos_text}Hello")).unwrap();
    assert_eq!(templated, [&[bos][..], &text].concat(), "the template's BOS, and no second");
    assert_eq!(tok.encode_chat("Hello").unwrap(), templated, "a BOS the template did not write");
}

#[test]
fn command_r_vocabulary_tokenizes_like_hugging_face() {
    check("command-r");
}

#[test]
fn deepseek_coder_vocabulary_tokenizes_like_hugging_face() {
    check("deepseek-coder");
}

#[test]
fn deepseek_llm_vocabulary_tokenizes_like_hugging_face() {
    check("deepseek-llm");
}

#[test]
fn falcon_vocabulary_tokenizes_like_hugging_face() {
    check("falcon");
}

#[test]
fn mpt_vocabulary_tokenizes_like_hugging_face() {
    check("mpt");
}

#[test]
fn qwen35_vocabulary_tokenizes_like_hugging_face() {
    check("qwen35");
}

#[test]
fn user_defined_tokens_are_text_unless_they_read_as_markers() {
    // GPT-NeoX's runs of spaces are user-defined tokens that decode to their spaces.
    let (mpt, _) = vocab("mpt");
    let spaces = mpt.token_to_id("    ").unwrap();
    assert_eq!(mpt.encode("a    b", false).unwrap()[1], spaces);
    assert_eq!(mpt.decode(&[spaces], true).unwrap(), "    ");
    // Command-R's turn markers are user-defined too, and skipped like control tokens.
    let (command_r, _) = vocab("command-r");
    let turn = command_r.token_to_id("<|START_OF_TURN_TOKEN|>").unwrap();
    let ids = command_r.encode("<|START_OF_TURN_TOKEN|>Hi", false).unwrap();
    assert_eq!(ids[0], turn);
    assert_eq!(command_r.decode(&ids, true).unwrap(), "Hi");
    assert_eq!(command_r.decode(&ids, false).unwrap(), "<|START_OF_TURN_TOKEN|>Hi");
}
