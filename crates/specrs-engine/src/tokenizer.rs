//! Text ↔ token ids: a `tokenizer.json` (+ `tokenizer_config.json`, `generation_config.json`,
//! `chat_template.jinja`, or a processor's `chat_template.json`) beside a checkpoint, or the tokenizer embedded in a GGUF file
//! (llama.cpp's `gpt2` byte-level BPE: tokens and merges; or its `llama` SentencePiece BPE:
//! pieces and scores; with token types and special ids).

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::Value as GgufValue;
use serde_json::Value;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::prepend::Prepend;
use tokenizers::normalizers::replace::Replace;
use tokenizers::normalizers::unicode::NFC;
use tokenizers::normalizers::utils::Sequence as NormalizerSequence;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::punctuation::Punctuation;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{
    AddedToken, DecoderWrapper, NormalizerWrapper, PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer,
};

use crate::chat_template::{ChatEnding, ChatMessage, ChatTemplate, Conversation, TemplateVars, text_messages};
use crate::error::{EngineError, Result};

/// Reasoning-span markers looked up in the vocabulary (relaxed acceptance for thinking).
const THINKING_MARKERS: &[(&str, &str)] = &[
    ("<think>", "</think>"),
    ("<|channel>", "<channel|>"),
    ("<seed:think>", "</seed:think>"),
    // Magistral's control tokens.
    ("[THINK]", "[/THINK]"),
];

pub struct TextTokenizer {
    tokenizer: Tokenizer,
    bos_token: Option<String>,
    eos_token: Option<String>,
    bos_token_id: Option<u32>,
    eos_token_ids: Vec<u32>,
    add_bos_token: bool,
    chat_template: Option<ChatTemplate>,
    thinking_token_ids: Option<(u32, u32)>,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("eos_token_ids", &self.eos_token_ids)
            .field("has_chat_template", &self.chat_template.is_some())
            .finish()
    }
}

/// GPT-2's byte-level alphabet backwards: printable Latin-1 bytes stand for themselves, the
/// other 68 bytes for the characters from U+0100 up, in byte order.
fn gpt2_char_to_byte() -> &'static HashMap<char, u8> {
    static TABLE: std::sync::OnceLock<HashMap<char, u8>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let mut next = 0x100u32;
        (0..=255u8)
            .map(|b| {
                if printable(b) {
                    (char::from(b), b)
                } else {
                    let c = char::from_u32(next).expect("U+0100.. are characters");
                    next += 1;
                    (c, b)
                }
            })
            .collect()
    })
}

/// Spells tokens as the bytes they append to the text, under one vocabulary's conventions.
pub struct TokenSpeller<'a> {
    tokenizer: &'a Tokenizer,
    /// Byte-level BPE: each byte written as one printable character (GPT-2's table).
    byte_level: bool,
    special: std::collections::HashSet<u32>,
}

impl TokenSpeller<'_> {
    /// What token `id` appends to the output text, as bytes; `None` for special tokens and ids
    /// outside the vocabulary.
    pub fn bytes_of(&self, id: u32) -> Option<Vec<u8>> {
        if self.special.contains(&id) {
            return None;
        }
        let text = self.tokenizer.id_to_token(id)?;
        Some(if self.byte_level {
            let byte_of_char = gpt2_char_to_byte();
            text.chars()
                .flat_map(|c| match byte_of_char.get(&c) {
                    Some(&b) => vec![b],
                    None => c.to_string().into_bytes(),
                })
                .collect()
        } else if let Some(hex) = text.strip_prefix("<0x").and_then(|h| h.strip_suffix('>'))
            && let Ok(byte) = u8::from_str_radix(hex, 16)
        {
            vec![byte]
        } else {
            text.replace('\u{2581}', " ").into_bytes()
        })
    }
}

fn tok_err(context: &str, e: impl std::fmt::Display) -> EngineError {
    EngineError::Tokenizer(format!("{context}: {e}"))
}

fn gguf_str(meta: &HashMap<String, GgufValue>, key: &str) -> Option<String> {
    match meta.get(key) {
        Some(GgufValue::String(s)) => Some(s.clone()),
        _ => None,
    }
}

/// Pre-tokenizers of byte-level BPE vocabularies whose text starts with BOS when the GGUF does
/// not say (`tokenizer.ggml.add_bos_token` came after many conversions): Llama 3's family,
/// Mistral's Tekken and Chameleon, as llama.cpp's vocabulary loader defaults them.
const BPE_PRE_TOKENIZERS_ADDING_BOS: &[&str] =
    &["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "tekken", "chameleon"];

/// Whether text prompts start with BOS: the GGUF's `tokenizer.ggml.add_bos_token` when it has
/// one, else llama.cpp's default for the vocabulary (SentencePiece yes, byte-level BPE only for
/// [`BPE_PRE_TOKENIZERS_ADDING_BOS`]), so a Llama 3 GGUF converted before the key existed
/// still gets the `<|begin_of_text|>` its model was trained with.
fn gguf_adds_bos(meta: &HashMap<String, GgufValue>, model: &str) -> bool {
    if let Some(GgufValue::Bool(adds)) = meta.get("tokenizer.ggml.add_bos_token") {
        return *adds;
    }
    match model {
        "llama" => true,
        "gpt2" => gguf_str(meta, "tokenizer.ggml.pre")
            .is_some_and(|pre| BPE_PRE_TOKENIZERS_ADDING_BOS.contains(&pre.as_str())),
        _ => false,
    }
}

fn gguf_u32(meta: &HashMap<String, GgufValue>, key: &str) -> Option<u32> {
    match meta.get(key)? {
        GgufValue::U32(x) => Some(*x),
        GgufValue::I32(x) => u32::try_from(*x).ok(),
        GgufValue::U64(x) => u32::try_from(*x).ok(),
        GgufValue::I64(x) => u32::try_from(*x).ok(),
        GgufValue::U16(x) => Some(*x as u32),
        GgufValue::U8(x) => Some(*x as u32),
        _ => None,
    }
}

fn gguf_strings(meta: &HashMap<String, GgufValue>, key: &str) -> Result<Vec<String>> {
    match meta.get(key) {
        Some(GgufValue::Array(a)) => a
            .iter()
            .map(|v| match v {
                GgufValue::String(s) => Ok(s.clone()),
                other => Err(EngineError::Tokenizer(format!("{key}: expected strings, found {other:?}"))),
            })
            .collect(),
        _ => Err(EngineError::Tokenizer(format!("GGUF metadata lacks {key}"))),
    }
}

/// llama.cpp's pre-tokenizer names (`tokenizer.ggml.pre`) → the Hugging Face pipeline
/// (normalizer, pre-tokenizer) of the `tokenizer.json` the GGUF was converted from.
fn gguf_pre_tokenizer(pre: &str) -> Result<(Option<NFC>, PreTokenizerWrapper)> {
    const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    // Qwen 3.5 keeps combining marks with the letters they mark.
    const QWEN35: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    // DeepSeek LLM: newlines, Latin/Greek/Cyrillic/... words, ASCII and full-width
    // punctuation, trailing spaces, CJK runs and digit runs, each split off in turn.
    const DEEPSEEK_LLM: &[&str] = &[
        r"[\r\n]",
        r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\x{1F7D}ᾀ-ᾴᾶ-ᾼ\x{1FBE}ῂ-ῄῆ-ῌῐ-\x{1FD3}ῖ-\x{1FDB}ῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\x{2126}ℨ\x{212A}-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
        r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
        r"\s+$",
        r"[一-龥ࠀ-一가-퟿]+",
        r"\p{N}+",
    ];
    // Mistral's tekken (NeMo, Small 3.x) and OpenAI's o200k (`gpt-4o`: Phi-4-mini, Llama 4,
    // MiniMax-M2) split words at case changes; o200k keeps contractions on their word and digits in threes.
    const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const O200K: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const DEEPSEEK_CODER: &[&str] = &[r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", r"[一-龥ࠀ-一가-퟿]+", r"\p{N}"];
    // DeepSeek-V3 / R1: digits in threes, then CJK and kana runs, then words (an ASCII
    // punctuation mark leading a Latin run keeps it), punctuation and space runs.
    const DEEPSEEK_V3: &[&str] = &[
        r"\p{N}{1,3}",
        r"[一-龥぀-ゟ゠-ヿ]+",
        r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
    ];
    // Kimi K2 (tiktoken): Han runs apart, then o200k's case-split words over letters other
    // than Han, digits in threes, punctuation and space runs.
    const KIMI_K2: &str = r"\p{Han}+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    let isolated = |re: &str| -> Result<PreTokenizerWrapper> {
        Ok(Split::new(SplitPattern::Regex(re.to_string()), SplitDelimiterBehavior::Isolated, false)
            .map_err(|e| tok_err("pre-tokenizer regex", e))?
            .into())
    };
    // GPT-2's byte mapping after splits of the vocabulary's own.
    let splits_then_bytes = |regexes: &[&str]| -> Result<PreTokenizerWrapper> {
        let mut steps = regexes.iter().map(|re| isolated(re)).collect::<Result<Vec<_>>>()?;
        steps.push(ByteLevel::new(false, false, false).into());
        Ok(Sequence::new(steps).into())
    };
    // GPT-2's own word regex with its byte mapping.
    let gpt2_bytes = || -> PreTokenizerWrapper { ByteLevel::new(false, true, true).into() };
    Ok(match pre {
        "gpt-2" | "gpt2" | "default" => (None, gpt2_bytes()),
        // GPT-NeoX's vocabulary (MPT) normalises to NFC first.
        "mpt" => (Some(NFC), gpt2_bytes()),
        // StarCoder-family vocabularies (SmolLM, SmolLM2): one digit per token, then GPT-2 bytes.
        "smollm" | "starcoder" | "refact" => (None, Sequence::new(vec![Digits::new(true).into(), gpt2_bytes()]).into()),
        "command-r" => (Some(NFC), Sequence::new(vec![Digits::new(true).into(), gpt2_bytes()]).into()),
        // Falcon: punctuation runs first, then GPT-2's split and bytes, digit runs, and digit
        // runs cut into threes.
        "falcon" => (
            None,
            Sequence::new(vec![
                Punctuation::new(SplitDelimiterBehavior::Contiguous).into(),
                gpt2_bytes(),
                Digits::new(false).into(),
                isolated("[0-9][0-9][0-9]")?,
            ])
            .into(),
        ),
        "qwen2" | "deepseek-r1-qwen" => (Some(NFC), splits_then_bytes(&[QWEN2])?),
        "qwen35" => (None, splits_then_bytes(&[QWEN35])?),
        // Hunyuan-A13B and StableLM 2 (Arcade100k): Qwen2's regex, as llama.cpp runs it (no
        // normalizer).
        "hunyuan" | "stablelm2" => (None, splits_then_bytes(&[QWEN2])?),
        // GLM-4's and DBRX's (OLMo 2's) cl100k-style vocabularies split as Llama 3's.
        "llama3" | "llama-bpe" | "smaug-bpe" | "dbrx" | "glm4" | "chatglm-bpe" => (None, splits_then_bytes(&[LLAMA3])?),
        "tekken" => (None, splits_then_bytes(&[TEKKEN])?),
        // BLOOM's (and GPT-3 Finnish's): an optional space and a run of anything but space,
        // brackets, bars and the listed punctuation; what lies between runs stays as it is.
        "bloom" | "gpt3-finnish" => (None, splits_then_bytes(&[r" ?[^(\s|.,!?…。，、।۔،)]+"])?),
        "gpt-4o" | "llama4" | "minimax-m2" => (None, splits_then_bytes(&[O200K])?),
        "deepseek-llm" => (None, splits_then_bytes(DEEPSEEK_LLM)?),
        "deepseek-coder" => (None, splits_then_bytes(DEEPSEEK_CODER)?),
        "deepseek-v3" | "hunyuan-dense" => (None, splits_then_bytes(DEEPSEEK_V3)?),
        "kimi-k2" => (None, splits_then_bytes(&[KIMI_K2])?),
        other => {
            return Err(EngineError::Tokenizer(format!(
                "GGUF pre-tokenizer '{other}' is not supported (supported: {}); \
                 load the model from a directory with tokenizer.json instead (`--tokenizer DIR`)",
                GGUF_PRE_TOKENIZERS.join(", ")
            )));
        }
    })
}

/// The `tokenizer.ggml.pre` names [`gguf_pre_tokenizer`] builds.
const GGUF_PRE_TOKENIZERS: &[&str] = &[
    "gpt2",
    "gpt-2",
    "default",
    "mpt",
    "smollm",
    "starcoder",
    "refact",
    "command-r",
    "falcon",
    "qwen2",
    "deepseek-r1-qwen",
    "qwen35",
    "hunyuan",
    "stablelm2",
    "llama3",
    "llama-bpe",
    "smaug-bpe",
    "dbrx",
    "glm4",
    "chatglm-bpe",
    "tekken",
    "bloom",
    "gpt3-finnish",
    "gpt-4o",
    "llama4",
    "minimax-m2",
    "deepseek-llm",
    "deepseek-coder",
    "deepseek-v3",
    "hunyuan-dense",
    "kimi-k2",
];

/// Whether a user-defined token reads as a marker (`<|im_start|>`, `</s>`, `[PAD7]`) rather
/// than text: the rule llama.cpp's converter uses to tell control tokens apart.
fn looks_like_marker(token: &str) -> bool {
    (token.starts_with('<') && token.ends_with('>')) || (token.starts_with('[') && token.ends_with(']'))
}

/// llama.cpp's token types (`tokenizer.ggml.token_type`).
mod token_type {
    pub const NORMAL: i64 = 1;
    pub const CONTROL: i64 = 3;
    pub const USER_DEFINED: i64 = 4;
}

fn gguf_token_types(meta: &HashMap<String, GgufValue>, len: usize) -> Result<Option<Vec<i64>>> {
    let Some(GgufValue::Array(types)) = meta.get("tokenizer.ggml.token_type") else { return Ok(None) };
    let types: Vec<i64> = types
        .iter()
        .map(|t| match t {
            GgufValue::I32(x) => Ok(*x as i64),
            GgufValue::U32(x) => Ok(*x as i64),
            other => {
                Err(EngineError::Tokenizer(format!("tokenizer.ggml.token_type: expected integers, found {other:?}")))
            }
        })
        .collect::<Result<_>>()?;
    if types.len() != len {
        return Err(EngineError::Tokenizer(format!(
            "tokenizer.ggml.token_type has {} entries for {len} tokens",
            types.len()
        )));
    }
    Ok(Some(types))
}

/// A byte-level BPE (llama.cpp's `gpt2` model): GPT-2, Llama 3, Qwen, SmolLM vocabularies.
fn byte_level_bpe(meta: &HashMap<String, GgufValue>, tokens: &[String]) -> Result<Tokenizer> {
    let merges: Vec<(String, String)> = gguf_strings(meta, "tokenizer.ggml.merges")?
        .into_iter()
        .map(|m| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| EngineError::Tokenizer(format!("invalid merge '{m}'")))
        })
        .collect::<Result<_>>()?;
    let vocab: tokenizers::models::bpe::Vocab = tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
    let pre = gguf_str(meta, "tokenizer.ggml.pre").unwrap_or_else(|| "gpt2".into());
    // Llama 3 and tekken take a pre-tokenized word that is itself a token whole, before any
    // merge (llama.cpp's `ignore_merges` for the same names).
    let ignore_merges = matches!(pre.as_str(), "llama3" | "llama-bpe" | "smaug-bpe" | "tekken");
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(ignore_merges)
        .build()
        .map_err(|e| tok_err("building BPE", e))?;
    let mut tokenizer = Tokenizer::new(bpe);
    let (normalizer, pre_tokenizer) = gguf_pre_tokenizer(&pre)?;
    if let Some(n) = normalizer {
        tokenizer.with_normalizer(Some(n)).map_err(|e| tok_err("setting the normalizer", e))?;
    }
    tokenizer.with_pre_tokenizer(Some(pre_tokenizer));
    tokenizer.with_decoder(Some(ByteLevelDecoder::default()));
    Ok(tokenizer)
}

/// A SentencePiece BPE vocabulary (llama.cpp's `llama` model: Llama 2, Mistral, Mixtral,
/// Phi-3, Gemma), as Hugging Face's converted `tokenizer.json` runs it: spaces written `▁` (and
/// one put before the text unless `add_space_prefix` is false), pieces merged highest score
/// first, characters outside the vocabulary spelled as `<0xNN>` byte tokens.
///
/// GGUF stores pieces and scores, not merges. SentencePiece merges the adjacent pair whose
/// concatenation is the best-scored piece; a BPE with one merge per way of splitting each
/// piece in two, ranked by the piece's score, makes the same choices.
fn sentencepiece_bpe(meta: &HashMap<String, GgufValue>, tokens: &[String], types: Option<&[i64]>) -> Result<Tokenizer> {
    let scores: Vec<f32> = match meta.get("tokenizer.ggml.scores") {
        Some(GgufValue::Array(a)) => a
            .iter()
            .map(|v| match v {
                GgufValue::F32(x) => Ok(*x),
                other => Err(EngineError::Tokenizer(format!("tokenizer.ggml.scores: expected f32, found {other:?}"))),
            })
            .collect::<Result<_>>()?,
        _ => return Err(EngineError::Tokenizer("GGUF metadata lacks tokenizer.ggml.scores".into())),
    };
    if scores.len() != tokens.len() {
        return Err(EngineError::Tokenizer(format!(
            "tokenizer.ggml.scores has {} entries for {} tokens",
            scores.len(),
            tokens.len()
        )));
    }
    let mergeable = |id: usize| types.is_none_or(|t| t[id] == token_type::NORMAL);
    let vocab: tokenizers::models::bpe::Vocab = tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
    let mut ranked: Vec<(f32, u32, u32, u32)> = Vec::new();
    for (id, piece) in tokens.iter().enumerate().filter(|&(id, _)| mergeable(id)) {
        for (split, _) in piece.char_indices().skip(1) {
            let (left, right) = piece.split_at(split);
            if let (Some(&l), Some(&r)) = (vocab.get(left), vocab.get(right))
                && mergeable(l as usize)
                && mergeable(r as usize)
            {
                ranked.push((scores[id], id as u32, l, r));
            }
        }
    }
    // Best score first; among equals, the earlier piece (SentencePiece orders by frequency).
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let merges =
        ranked.into_iter().map(|(_, _, l, r)| (tokens[l as usize].clone(), tokens[r as usize].clone())).collect();
    let mut builder = BPE::builder().vocab_and_merges(vocab, merges).byte_fallback(true).fuse_unk(true);
    if let Some(unk) = gguf_u32(meta, "tokenizer.ggml.unknown_token_id").and_then(|id| tokens.get(id as usize)) {
        builder = builder.unk_token(unk.clone());
    }
    let bpe = builder.build().map_err(|e| tok_err("building the SentencePiece BPE", e))?;
    let mut tokenizer = Tokenizer::new(bpe);
    let add_space_prefix = !matches!(meta.get("tokenizer.ggml.add_space_prefix"), Some(GgufValue::Bool(false)));
    let spaces = Replace::new(" ", "\u{2581}").map_err(|e| tok_err("space normalizer", e))?;
    let mut normalizers: Vec<NormalizerWrapper> = Vec::new();
    if add_space_prefix {
        normalizers.push(Prepend::new("\u{2581}".into()).into());
    }
    normalizers.push(spaces.into());
    tokenizer
        .with_normalizer(Some(NormalizerSequence::new(normalizers)))
        .map_err(|e| tok_err("setting the normalizer", e))?;
    let mut decoders: Vec<DecoderWrapper> = vec![
        Replace::new("\u{2581}", " ").map_err(|e| tok_err("space decoder", e))?.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if add_space_prefix {
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    tokenizer.with_decoder(Some(DecoderSequence::new(decoders)));
    Ok(tokenizer)
}

/// Phi-3's SentencePiece vocabulary eats the whitespace after its special tokens (its
/// `tokenizer.json` marks them `rstrip`), so `<|user|>\nHi` tokenizes as `<|user|>` `▁Hi`.
/// GGUF does not store the flag; llama.cpp recognises the vocabulary by the model's name and
/// exempts `<unk>`, `<s>` and `<|endoftext|>`, and so does this.
fn phi3_strips_after(meta: &HashMap<String, GgufValue>, sentencepiece: bool) -> impl Fn(&str) -> bool {
    let name = gguf_str(meta, "general.name").unwrap_or_default().to_lowercase();
    let phi3 = sentencepiece && (name.contains("phi-3") || name.contains("phi3"));
    move |token| phi3 && !matches!(token, "<unk>" | "<s>" | "<|endoftext|>")
}

impl TextTokenizer {
    /// Builds the tokenizer stored in GGUF metadata.
    pub fn from_gguf(meta: &HashMap<String, GgufValue>) -> Result<Self> {
        let tokens = gguf_strings(meta, "tokenizer.ggml.tokens")?;
        let types = gguf_token_types(meta, tokens.len())?;
        let model = gguf_str(meta, "tokenizer.ggml.model").unwrap_or_default();
        let sentencepiece = model == "llama";
        let mut tokenizer = match model.as_str() {
            "gpt2" => byte_level_bpe(meta, &tokens)?,
            "llama" => sentencepiece_bpe(meta, &tokens, types.as_deref())?,
            other => {
                return Err(EngineError::Tokenizer(format!(
                    "GGUF tokenizer model '{other}' is not supported (supported: 'gpt2' byte-level BPE, 'llama' \
                     SentencePiece BPE); pass the checkpoint's tokenizer.json with --tokenizer / tokenizer=, or load \
                     the model from a directory with tokenizer.json"
                )));
            }
        };
        // Control and user-defined tokens are matched whole; control tokens, marker-like
        // user-defined ones (`<|...|>`, `[PAD1]`) and SentencePiece's unknown piece, as Hugging
        // Face's converted tokenizers list it, are special: skipped when decoding. Other
        // user-defined tokens are text (GPT-NeoX's runs of spaces).
        let unknown = gguf_u32(meta, "tokenizer.ggml.unknown_token_id").filter(|_| sentencepiece);
        let strips_after = phi3_strips_after(meta, sentencepiece);
        let mut specials = Vec::new();
        let mut added = Vec::new();
        for (id, (t, token)) in types.unwrap_or_default().into_iter().zip(&tokens).enumerate() {
            let is_unknown = unknown == Some(id as u32);
            if t == token_type::CONTROL || is_unknown || (t == token_type::USER_DEFINED && looks_like_marker(token)) {
                specials.push(AddedToken::from(token.clone(), true).rstrip(strips_after(token)));
            } else if t == token_type::USER_DEFINED {
                added.push(AddedToken::from(token.clone(), false));
            }
        }
        tokenizer.add_special_tokens(specials).map_err(|e| tok_err("adding special tokens", e))?;
        tokenizer.add_tokens(added).map_err(|e| tok_err("adding user-defined tokens", e))?;
        let bos_token_id = gguf_u32(meta, "tokenizer.ggml.bos_token_id");
        let eos_id = gguf_u32(meta, "tokenizer.ggml.eos_token_id");
        let mut eos_token_ids: Vec<u32> = eos_id.into_iter().collect();
        if let Some(eot) = gguf_u32(meta, "tokenizer.ggml.eot_token_id")
            && !eos_token_ids.contains(&eot)
        {
            eos_token_ids.push(eot);
        }
        let name_of = |id: Option<u32>| id.and_then(|i| tokens.get(i as usize).cloned());
        let chat_template = gguf_str(meta, "tokenizer.chat_template").map(ChatTemplate::new).transpose()?;
        let mut tok = Self {
            bos_token: name_of(bos_token_id),
            eos_token: name_of(eos_id),
            bos_token_id,
            eos_token_ids,
            add_bos_token: gguf_adds_bos(meta, &model),
            chat_template,
            thinking_token_ids: None,
            tokenizer,
        };
        tok.thinking_token_ids = tok.find_thinking_tokens();
        Ok(tok)
    }

    /// Loads `tokenizer.json` and its companions from a checkpoint directory.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let tokenizer_path = dir.join("tokenizer.json");
        let tokenizer = Tokenizer::from_file(&tokenizer_path)
            .map_err(|e| EngineError::Tokenizer(format!("{}: {e}", tokenizer_path.display())))?;
        let read_json = |name: &str| -> Result<Option<Value>> {
            let p = dir.join(name);
            if !p.is_file() {
                return Ok(None);
            }
            let text =
                std::fs::read_to_string(&p).map_err(|e| EngineError::Tokenizer(format!("{}: {e}", p.display())))?;
            serde_json::from_str(&text)
                .map(Some)
                .map_err(|e| EngineError::Tokenizer(format!("{}: invalid JSON: {e}", p.display())))
        };
        let config = read_json("tokenizer_config.json")?.unwrap_or(Value::Null);
        let generation = read_json("generation_config.json")?.unwrap_or(Value::Null);
        let model_config = read_json("config.json")?.unwrap_or(Value::Null);
        let token_text = |v: Option<&Value>| -> Option<String> {
            match v? {
                Value::String(s) => Some(s.clone()),
                Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_string),
                _ => None,
            }
        };
        let bos_token = token_text(config.get("bos_token"));
        let eos_token = token_text(config.get("eos_token"));
        let ids = |v: Option<&Value>| -> Vec<u32> {
            match v {
                Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
                Some(Value::Array(a)) => a.iter().filter_map(Value::as_u64).map(|x| x as u32).collect(),
                _ => Vec::new(),
            }
        };
        let mut eos_token_ids = ids(generation.get("eos_token_id"));
        if eos_token_ids.is_empty() {
            eos_token_ids = ids(model_config.get("eos_token_id"));
        }
        if let Some(id) = eos_token.as_deref().and_then(|t| tokenizer.token_to_id(t))
            && !eos_token_ids.contains(&id)
        {
            eos_token_ids.push(id);
        }
        let bos_token_id = bos_token.as_deref().and_then(|t| tokenizer.token_to_id(t));
        // `chat_template.jinja`, else `tokenizer_config.json`'s, else the processor's
        // `chat_template.json` (image-text checkpoints such as Gemma 3 4B-27B).
        let processor = read_json("chat_template.json")?.unwrap_or(Value::Null);
        let template_text = match std::fs::read_to_string(dir.join("chat_template.jinja")) {
            Ok(t) => Some(t),
            Err(_) => match config.get("chat_template").or_else(|| processor.get("chat_template")) {
                Some(Value::String(s)) => Some(s.clone()),
                // A list of named templates: use "default".
                Some(Value::Array(list)) => list
                    .iter()
                    .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                    .and_then(|t| t.get("template"))
                    .and_then(Value::as_str)
                    .map(str::to_string),
                _ => None,
            },
        };
        let mut tok = Self {
            tokenizer,
            bos_token,
            eos_token,
            bos_token_id,
            eos_token_ids,
            add_bos_token: false,
            chat_template: template_text.map(ChatTemplate::new).transpose()?,
            thinking_token_ids: None,
        };
        tok.thinking_token_ids = tok.find_thinking_tokens();
        Ok(tok)
    }

    fn find_thinking_tokens(&self) -> Option<(u32, u32)> {
        THINKING_MARKERS
            .iter()
            .find_map(|(start, end)| Some((self.tokenizer.token_to_id(start)?, self.tokenizer.token_to_id(end)?)))
    }

    pub fn inner(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn vocab_size(&self) -> usize {
        self.tokenizer.get_vocab_size(true)
    }

    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }

    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos_token_id
    }

    /// `<think>`/`</think>` (or an equivalent pair) when the vocabulary has them.
    pub fn thinking_token_ids(&self) -> Option<(u32, u32)> {
        self.thinking_token_ids
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.tokenizer.token_to_id(token)
    }

    pub fn has_chat_template(&self) -> bool {
        self.chat_template.is_some()
    }

    /// Encodes text. Special tokens written in the text (e.g. `<|im_start|>`) are recognised;
    /// `add_special_tokens` adds what transformers' `tokenizer(text)` adds: an HF tokenizer's
    /// post-processor (Llama 3's `<|begin_of_text|>`, Gemma's `<bos>`), or the BOS a GGUF
    /// vocabulary's `add_bos_token` asks for (as llama.cpp adds it).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let enc = self.tokenizer.encode(text, add_special_tokens).map_err(|e| tok_err("encoding", e))?;
        let mut ids = Vec::with_capacity(enc.len() + 1);
        if add_special_tokens
            && self.add_bos_token
            && let Some(bos) = self.bos_token_id
        {
            ids.push(bos);
        }
        ids.extend_from_slice(enc.get_ids());
        Ok(ids)
    }

    /// Encodes a rendered chat prompt. The template writes the special tokens it wants
    /// (transformers' `apply_chat_template` and vLLM's chat encode with
    /// `add_special_tokens=False`); only a GGUF vocabulary whose `add_bos_token` asks for a BOS
    /// the template did not write gets one, as llama.cpp's chat does. Never a second BOS.
    pub fn encode_chat(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = self.encode(text, false)?;
        if self.add_bos_token
            && let Some(bos) = self.bos_token_id
            && ids.first() != Some(&bos)
        {
            ids.insert(0, bos);
        }
        Ok(ids)
    }

    /// What each token appends to the output text, as bytes (`None` for special tokens), for
    /// structured outputs. Byte-level BPE vocabularies (GPT-2's, Llama 3's, SmolLM's) spell
    /// bytes as printable characters; SentencePiece ones write spaces as `▁` and unknown
    /// bytes as `<0xNN>` tokens.
    pub fn token_bytes(&self) -> Vec<Option<Vec<u8>>> {
        let speller = self.speller();
        (0..self.vocab_size() as u32).map(|id| speller.bytes_of(id)).collect()
    }

    /// Spells single tokens as [`Self::token_bytes`] does (build one per response: it reads
    /// the vocabulary's conventions once).
    pub fn speller(&self) -> TokenSpeller<'_> {
        let byte_level = match self.tokenizer.get_decoder() {
            Some(DecoderWrapper::ByteLevel(_)) => true,
            Some(DecoderWrapper::Sequence(seq)) => {
                seq.get_decoders().iter().any(|d| matches!(d, DecoderWrapper::ByteLevel(_)))
            }
            _ => false,
        };
        let special = self
            .tokenizer
            .get_added_tokens_decoder()
            .into_iter()
            .filter_map(|(id, token)| token.special.then_some(id))
            .collect();
        TokenSpeller { tokenizer: &self.tokenizer, byte_level, special }
    }

    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.tokenizer.decode(ids, skip_special_tokens).map_err(|e| tok_err("decoding", e))
    }

    /// Renders a conversation: its messages checked and flattened ([`crate::text_messages`]),
    /// with its own template or the model's, its tools and template variables, ending as
    /// `conversation.ending` says. Continuing the final message renders the closed conversation
    /// and cuts it right after that message's text, as vLLM does.
    pub fn render_conversation(&self, conversation: &Conversation) -> Result<String> {
        let messages = text_messages(&conversation.messages).map_err(|e| EngineError::Request(e.to_string()))?;
        let own;
        let template = match &conversation.chat_template {
            Some(source) => {
                own = ChatTemplate::new(source.clone())?;
                &own
            }
            None => self.chat_template.as_ref().ok_or_else(|| {
                EngineError::Request(
                    "this model has no chat template; send a plain completion prompt, or a chat_template to render \
                     the messages with"
                        .into(),
                )
            })?,
        };
        let vars = TemplateVars {
            bos_token: self.bos_token.as_deref().unwrap_or(""),
            eos_token: self.eos_token.as_deref().unwrap_or(""),
            tools: conversation.tools.as_deref(),
            extra: Some(&conversation.chat_template_kwargs),
        };
        match conversation.ending {
            ChatEnding::GenerationPrompt => template.render(&messages, true, vars),
            ChatEnding::Closed => template.render(&messages, false, vars),
            ChatEnding::ContinueFinalMessage => {
                let rendered = template.render(&messages, false, vars)?;
                let last = messages.last().and_then(|m| m.content.as_str()).unwrap_or_default();
                if last.is_empty() {
                    return Err(EngineError::Request(
                        "continue_final_message needs a final message with text to continue".into(),
                    ));
                }
                let at = rendered.rfind(last).ok_or_else(|| {
                    EngineError::Request(
                        "continue_final_message: the chat template does not reproduce the final message's text, \
                         so there is no place to continue it from"
                            .into(),
                    )
                })?;
                Ok(rendered[..at + last.len()].to_string())
            }
        }
    }

    /// Renders plain messages with the model's chat template.
    pub fn apply_chat_template(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let ending = if add_generation_prompt { ChatEnding::GenerationPrompt } else { ChatEnding::Closed };
        self.render_conversation(&Conversation { messages: messages.to_vec(), ending, ..Default::default() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

    /// The words `pre` splits `text` into, in GPT-2's byte alphabet (`Ġ` for a space).
    fn words(pre: &str, text: &str) -> Vec<String> {
        let (_, pre_tokenizer) = gguf_pre_tokenizer(pre).unwrap();
        let mut pretokenized = PreTokenizedString::from(text);
        pre_tokenizer.pre_tokenize(&mut pretokenized).unwrap();
        pretokenized
            .get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(word, _, _)| word.to_string())
            .collect()
    }

    #[test]
    fn case_splitting_vocabularies_cut_words_at_capitals_and_differ_on_digits_and_contractions() {
        // tekken (Mistral NeMo / Small 3): a capital starts a word, digits go one by one, a
        // slash stays on the punctuation before it. No upstream fixture exists for it here, so
        // these pin the regex llama.cpp runs.
        assert_eq!(
            words("tekken", "HelloWorld's 2024 a+/b\n\nOK"),
            ["Hello", "World", "'s", "Ġ", "2", "0", "2", "4", "Ġa", "+/", "b", "ĊĊ", "OK"]
        );
        // o200k (`gpt-4o`): the contraction stays on its word, digits in threes.
        assert_eq!(
            words("gpt-4o", "HelloWorld's 2024 a+/b\n\nOK"),
            ["Hello", "World's", "Ġ", "202", "4", "Ġa", "+/", "b", "ĊĊ", "OK"]
        );
        // Llama 3's regex (GLM-4, DBRX) keeps a word whole across case changes.
        assert_eq!(words("glm4", "HelloWorld's 2024"), ["HelloWorld", "'s", "Ġ", "202", "4"]);
    }

    #[test]
    fn bloom_splits_runs_between_spaces_brackets_and_its_punctuation() {
        // BLOOM's Split regex (no upstream fixture here): a run keeps one leading space; a
        // comma, a bang, a bracket with the space before it stand apart; digits stay whole.
        assert_eq!(words("bloom", "Hello, world! 2024 (ok)"), ["Hello", ",", "Ġworld", "!", "Ġ2024", "Ġ(", "ok", ")"]);
        assert_eq!(words("bloom", "你好，世界。"), ["ä½łå¥½", "ï¼Į", "ä¸ĸçķĮ", "ãĢĤ"]);
    }

    #[test]
    fn kimi_k2_keeps_han_runs_apart_and_cuts_other_words_at_capitals() {
        // Kimi K2's tiktoken pattern (llama.cpp implements it by hand; no fixture here): a Han
        // run ends the Latin word before it, capitals start words, the contraction stays.
        assert_eq!(
            words("kimi-k2", "Hello世界WORLD's 12345 x!\n"),
            ["Hello", "ä¸ĸçķĮ", "WORLD's", "Ġ", "123", "45", "Ġx", "!Ċ"]
        );
    }

    #[test]
    fn hunyuan_and_stablelm2_split_as_qwen2_digit_by_digit_without_normalising() {
        // Hunyuan-A13B's `hunyuan` and StableLM 2's `stablelm2` (no upstream fixture here):
        // Qwen2's regex, one digit a word, a mark before a letter run kept on it; a decomposed
        // é stays decomposed.
        for pre in ["hunyuan", "stablelm2"] {
            assert_eq!(words(pre, "Hi 2024 (ok)\n"), ["Hi", "Ġ", "2", "0", "2", "4", "Ġ(", "ok", ")Ċ"], "{pre}");
            let (normalizer, _) = gguf_pre_tokenizer(pre).unwrap();
            assert!(normalizer.is_none(), "{pre}");
        }
    }

    #[test]
    fn deepseek_v3_splits_digits_in_threes_then_cjk_runs_then_words() {
        // DeepSeek-V3's regexes as llama.cpp runs them (no upstream fixture here): digits in
        // threes, the CJK / kana run isolated before words, an ASCII mark kept on the Latin
        // run after it, a punctuation run taking the newlines after it.
        assert_eq!(
            words("deepseek-v3", "Hello 2024年の東京 a+b!\n\nOK"),
            ["Hello", "Ġ", "202", "4", "å¹´ãģ®æĿ±äº¬", "Ġa", "+b", "!ĊĊ", "OK"]
        );
    }

    #[test]
    fn text_prompts_get_the_hf_post_processors_bos_and_chat_prompts_only_the_templates() {
        // Llama 3's tokenizer.json adds `<|begin_of_text|>` in its post-processor, which
        // transformers' `tokenizer(text)` runs and `apply_chat_template` does not.
        let dir = tempfile::tempdir().unwrap();
        let words = ["<s>", "hello", "world"].map(String::from);
        specrs_models::testing::write_word_tokenizer(dir.path(), words).unwrap();
        let path = dir.path().join("tokenizer.json");
        let mut json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        json["post_processor"] = serde_json::json!({
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]}}
        });
        std::fs::write(&path, json.to_string()).unwrap();
        let tok = TextTokenizer::from_dir(dir.path()).unwrap();
        assert_eq!(tok.encode("hello world", true).unwrap(), [0, 1, 2], "a text prompt gets the BOS");
        assert_eq!(tok.encode("hello world", false).unwrap(), [1, 2]);
        assert_eq!(tok.encode_chat("hello world").unwrap(), [1, 2], "a chat prompt is the template's alone");
    }

    #[test]
    fn the_chat_template_comes_from_the_jinja_file_then_the_tokenizer_config_then_the_processor() {
        let dir = tempfile::tempdir().unwrap();
        specrs_models::testing::write_tokenizer(dir.path(), 16).unwrap();
        let write = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
        let render = || {
            let tok = TextTokenizer::from_dir(dir.path()).unwrap();
            tok.apply_chat_template(&[ChatMessage::new("user", "hi")], false).unwrap()
        };
        write("chat_template.json", r#"{"chat_template": "processor {{ messages[0].content }}"}"#);
        assert_eq!(render(), "processor hi");
        write("tokenizer_config.json", r#"{"chat_template": "config {{ messages[0].content }}"}"#);
        assert_eq!(render(), "config hi");
        write("chat_template.jinja", "jinja {{ messages[0].content }}");
        assert_eq!(render(), "jinja hi");
    }
}
