//! Reasoning models' thinking, split from their answer (vLLM's `--reasoning-parser`): the text
//! inside `<think>...</think>` (Seed-OSS: `<seed:think>...</seed:think>`) becomes the message's
//! `reasoning_content`, the rest its content. Hunyuan-A13B and ERNIE 4.5 wrap their answer in
//! `<answer>...</answer>` / `<response>...</response>` too, which the content leaves out.
//! Magistral marks its thought with the control tokens `[THINK]` / `[/THINK]`, kept in the text
//! for the splitter. GLM-4.5's rule depends on the prompt: GLM-4.7's template opens `<think>`
//! itself ([`ReasoningParser::for_prompt`]).
//! gpt-oss's harmony channels are read by [`crate::tools::harmony`], which splits them the same
//! way.

/// How a model marks its reasoning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningParser {
    /// Reasoning is the output up to `</think>`; the chat template opened `<think>` in the
    /// prompt, so the model may not write it (DeepSeek-R1, QwQ, Qwen3 2507 thinking models;
    /// MiniMax-M2 and OLMo 3 Think under vLLM's names `minimax_m2` and `olmo3`: an OLMo 3
    /// thought cut before `</think>` stays reasoning, as vLLM streams it).
    DeepseekR1,
    /// Reasoning is there only when the output opens with `<think>` (Qwen3, whose template
    /// skips thinking with `enable_thinking: false`).
    Qwen3,
    /// gpt-oss: the `analysis` channel of its harmony messages is reasoning, `final` the answer
    /// (`openai_gptoss`).
    GptOss,
    /// Seed-OSS: DeepSeek-R1's rule over `<seed:think>` and `</seed:think>` (`seed_oss`).
    SeedOss,
    /// Hunyuan-A13B (`hunyuan_a13b`): `<think>\n...\n</think>\n<answer>\n...\n</answer>`, as
    /// vLLM reads it: reasoning only when the output opens with `<think>\n`, one newline inside
    /// each tag dropped, and the `<answer>` wrapper kept out of the content.
    HunyuanA13b,
    /// ERNIE 4.5 thinking (`ernie45`): DeepSeek-R1's rule, the answer's leading newlines and its
    /// `<response>...</response>` wrapper kept out of the content, as vLLM reads it.
    Ernie45,
    /// GLM-4.5 / 4.6 / 4.7 (`glm45`): Qwen3's rule, unless the prompt's last assistant turn
    /// opened `<think>` without closing it (GLM-4.7's template with thinking on), where
    /// DeepSeek-R1's holds ([`Self::for_prompt`]). A template that closed the thought already
    /// (thinking off) leaves nothing to open it, so the whole output is the answer.
    Glm45,
    /// Magistral and the Ministral reasoning models (`mistral`): Qwen3's rule over the control
    /// tokens `[THINK]` and `[/THINK]`, which the output's text keeps
    /// ([`Self::keeps_special_tokens`]).
    Mistral,
}

impl ReasoningParser {
    pub const NAMES: [&str; 10] = [
        "deepseek_r1",
        "minimax_m2",
        "olmo3",
        "qwen3",
        "openai_gptoss",
        "seed_oss",
        "hunyuan_a13b",
        "ernie45",
        "glm45",
        "mistral",
    ];

    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            "deepseek_r1" | "minimax_m2" | "olmo3" => Ok(Self::DeepseekR1),
            "qwen3" => Ok(Self::Qwen3),
            "openai_gptoss" => Ok(Self::GptOss),
            "seed_oss" => Ok(Self::SeedOss),
            "hunyuan_a13b" => Ok(Self::HunyuanA13b),
            "ernie45" => Ok(Self::Ernie45),
            "glm45" => Ok(Self::Glm45),
            "mistral" => Ok(Self::Mistral),
            other => Err(format!("unknown reasoning parser '{other}'; available: {}", Self::NAMES.join(", "))),
        }
    }

    /// Whether an output under a constraint (a tool choice, a structured output) is split too.
    /// Where the vocabulary has the reasoning markers (`thinks_first`), the constraint waits
    /// for `</think>` and the output splits as any other. Without them the constraint holds
    /// from the first token, so such an output thinks only where the constraint itself writes
    /// a `<think>` block: Qwen3's rule finds exactly that, while DeepSeek-R1's would take the
    /// whole constrained answer for unfinished thought.
    pub fn splits_constrained_output(self, thinks_first: bool) -> bool {
        match self {
            // The harmony reader takes text that opens no header for content, so a constrained
            // output (plain JSON) reads as content and a constraint that writes channels splits.
            Self::GptOss => true,
            Self::DeepseekR1 | Self::SeedOss | Self::Ernie45 => thinks_first,
            Self::Qwen3 | Self::HunyuanA13b | Self::Glm45 | Self::Mistral => true,
        }
    }

    /// Whether the rule depends on the rendered prompt ([`Self::for_prompt`]).
    pub fn reads_prompt(self) -> bool {
        self == Self::Glm45
    }

    /// The parser for one request whose rendered prompt is `prompt`: GLM-4.7's template opens
    /// `<think>` after the last `<|assistant|>` when thinking is on, so the output starts
    /// inside the thought (DeepSeek-R1's rule); every other parser reads any prompt alike.
    pub fn for_prompt(self, prompt: &str) -> Self {
        match self {
            Self::Glm45 => {
                let turn = prompt.rsplit("<|assistant|>").next().unwrap_or(prompt);
                if turn.contains("<think>") && !turn.contains("</think>") { Self::DeepseekR1 } else { self }
            }
            other => other,
        }
    }

    /// Whether the output's text keeps special tokens for this parser (gpt-oss's harmony
    /// markers, Magistral's `[THINK]` / `[/THINK]`), unless the request says otherwise.
    pub fn keeps_special_tokens(self) -> bool {
        matches!(self, Self::GptOss | Self::Mistral)
    }

    /// The tags that open and close a thought.
    fn markers(self) -> (&'static str, &'static str) {
        match self {
            Self::SeedOss => ("<seed:think>", "</seed:think>"),
            Self::HunyuanA13b => ("<think>\n", "</think>"),
            Self::Mistral => ("[THINK]", "[/THINK]"),
            Self::DeepseekR1 | Self::Qwen3 | Self::GptOss | Self::Ernie45 | Self::Glm45 => ("<think>", "</think>"),
        }
    }

    /// Whether the output is harmony messages (gpt-oss), whose markers are special tokens the
    /// text must keep for the reader.
    pub fn reads_harmony(self) -> bool {
        self == Self::GptOss
    }
}

/// A piece of output text: reasoning or answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    Reasoning(String),
    Answer(String),
}

/// Splits an output into reasoning and answer as it is written. Text that could still be the
/// start of a marker is held back until it cannot.
#[derive(Debug)]
pub struct ReasoningSplitter {
    parser: ReasoningParser,
    phase: Phase,
    buffer: String,
    /// Hunyuan-A13B's `<answer>` or ERNIE 4.5's `<response>` wrapper, taken off the answer.
    answer_tags: Option<AnswerTags>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Before the first text that says whether (or how) the output reasons.
    Start,
    Reasoning,
    Answer,
}

impl ReasoningSplitter {
    pub fn new(parser: ReasoningParser) -> Self {
        let answer_tags = match parser {
            ReasoningParser::HunyuanA13b => Some(AnswerTags::new(AnswerTags::HUNYUAN)),
            ReasoningParser::Ernie45 => Some(AnswerTags::new(AnswerTags::ERNIE)),
            _ => None,
        };
        Self { parser, phase: Phase::Start, buffer: String::new(), answer_tags }
    }

    pub fn push(&mut self, text: &str) -> Vec<Part> {
        let parts = self.split(text);
        self.unwrap_answers(parts, false)
    }

    /// `parts` with the answer's wrapper taken off (Hunyuan-A13B, ERNIE 4.5), empty parts
    /// dropped; `finish` releases what the wrapper held back.
    fn unwrap_answers(&mut self, parts: Vec<Part>, finish: bool) -> Vec<Part> {
        let Some(tags) = self.answer_tags.as_mut() else { return parts };
        let mut out = Vec::new();
        for part in parts {
            match part {
                Part::Answer(text) => send(&mut out, Part::Answer(tags.push(&text))),
                reasoning => out.push(reasoning),
            }
        }
        if finish {
            send(&mut out, Part::Answer(tags.finish()));
        }
        out
    }

    fn split(&mut self, text: &str) -> Vec<Part> {
        let mut out = Vec::new();
        if self.phase == Phase::Answer {
            if !text.is_empty() {
                out.push(Part::Answer(text.to_string()));
            }
            return out;
        }
        self.buffer.push_str(text);
        let (open, close) = self.parser.markers();
        if self.phase == Phase::Start {
            let start = self.buffer.trim_start();
            if open.starts_with(start) && start.len() < open.len() {
                return out;
            }
            match (start.strip_prefix(open), self.parser) {
                (Some(rest), _) => self.buffer = rest.to_string(),
                (None, ReasoningParser::DeepseekR1 | ReasoningParser::SeedOss | ReasoningParser::Ernie45) => {}
                (
                    None,
                    ReasoningParser::Qwen3
                    | ReasoningParser::GptOss
                    | ReasoningParser::HunyuanA13b
                    | ReasoningParser::Glm45
                    | ReasoningParser::Mistral,
                ) => {
                    self.phase = Phase::Answer;
                    out.push(Part::Answer(std::mem::take(&mut self.buffer)));
                    return out;
                }
            }
            self.phase = Phase::Reasoning;
        }
        // Hunyuan-A13B's thought ends `\n</think>`: the newline is the tag's, held until known.
        let hunyuan = self.parser == ReasoningParser::HunyuanA13b;
        match self.buffer.find(close) {
            Some(end) => {
                let rest = self.buffer.split_off(end + close.len());
                self.buffer.truncate(end);
                if hunyuan && self.buffer.ends_with('\n') {
                    self.buffer.pop();
                }
                send(&mut out, Part::Reasoning(std::mem::take(&mut self.buffer)));
                self.phase = Phase::Answer;
                send(&mut out, Part::Answer(rest));
            }
            None => {
                let held = |marker| crate::message::held_prefix_len(&self.buffer, marker);
                let keep = if hunyuan { held(close).max(held("\n</think>")) } else { held(close) };
                let thought: String = self.buffer.drain(..self.buffer.len() - keep).collect();
                send(&mut out, Part::Reasoning(thought));
            }
        }
        out
    }

    /// What was held back once the output is complete: an unclosed thought stays reasoning
    /// (the output was cut while thinking), an undecided start is what the parser assumes.
    pub fn finish(&mut self) -> Vec<Part> {
        let rest = std::mem::take(&mut self.buffer);
        let mut out = Vec::new();
        match (self.phase, self.parser) {
            (Phase::Answer, _)
            | (
                Phase::Start,
                ReasoningParser::Qwen3
                | ReasoningParser::GptOss
                | ReasoningParser::HunyuanA13b
                | ReasoningParser::Glm45
                | ReasoningParser::Mistral,
            ) => send(&mut out, Part::Answer(rest)),
            _ => send(&mut out, Part::Reasoning(rest)),
        }
        self.unwrap_answers(out, true)
    }
}

/// An answer's wrapper (Hunyuan-A13B's `<answer>\n...\n</answer>`, ERNIE 4.5's
/// `<response>...</response>`), taken off the answer as it is written; an answer that does not
/// open with the wrapper passes as it is (ERNIE's without its leading newlines).
#[derive(Debug)]
struct AnswerTags {
    wrapper: Wrapper,
    state: TagState,
    buffer: String,
}

/// The tags around an answer and what goes with them.
#[derive(Debug, Clone, Copy)]
struct Wrapper {
    open: &'static str,
    /// Includes the newline before the closing tag where the model writes one (Hunyuan).
    close: &'static str,
    /// One newline after the opening tag belongs to the tag (Hunyuan).
    newline_after_open: bool,
    /// Newlines before the answer (after `</think>`) and after the closing tag are dropped,
    /// wrapper or not (ERNIE).
    trim_leading_newlines: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TagState {
    /// Before the first text that says whether the answer is wrapped.
    Opening,
    /// Inside the wrapper, watching for its closing tag.
    Inside,
    /// Just past the closing tag, dropping the newlines after it (ERNIE).
    Closed,
    /// Past the wrapper, or never in one.
    Plain,
}

impl AnswerTags {
    const HUNYUAN: Wrapper =
        Wrapper { open: "<answer>", close: "\n</answer>", newline_after_open: true, trim_leading_newlines: false };
    const ERNIE: Wrapper =
        Wrapper { open: "<response>", close: "</response>", newline_after_open: false, trim_leading_newlines: true };

    fn new(wrapper: Wrapper) -> Self {
        Self { wrapper, state: TagState::Opening, buffer: String::new() }
    }

    /// The content `text` adds.
    fn push(&mut self, text: &str) -> String {
        let Wrapper { open, close, newline_after_open, trim_leading_newlines } = self.wrapper;
        self.buffer.push_str(text);
        if self.state == TagState::Opening {
            let start = self.buffer.trim_start();
            // Whether the opening tag (and its newline) opens the answer is not known yet.
            if open.starts_with(start) || (newline_after_open && start == open) {
                return String::new();
            }
            match start.strip_prefix(open) {
                Some(rest) => {
                    let rest = if newline_after_open { rest.strip_prefix('\n').unwrap_or(rest) } else { rest };
                    self.buffer = rest.to_string();
                    self.state = TagState::Inside;
                }
                None => {
                    if trim_leading_newlines {
                        self.buffer = self.buffer.trim_start_matches('\n').to_string();
                    }
                    self.state = TagState::Plain;
                }
            }
        }
        if self.state == TagState::Inside {
            if let Some(end) = self.buffer.find(close) {
                let rest = self.buffer.split_off(end + close.len());
                self.buffer.truncate(end);
                let answer = std::mem::take(&mut self.buffer);
                self.state = if trim_leading_newlines { TagState::Closed } else { TagState::Plain };
                return answer + &self.push(&rest);
            }
            let keep = crate::message::held_prefix_len(&self.buffer, close);
            return self.buffer.drain(..self.buffer.len() - keep).collect();
        }
        if self.state == TagState::Closed {
            self.buffer = self.buffer.trim_start_matches('\n').to_string();
            if self.buffer.is_empty() {
                return String::new();
            }
            self.state = TagState::Plain;
        }
        std::mem::take(&mut self.buffer)
    }

    /// What was held back when the output ends: a lone opening tag is the wrapper, the rest
    /// content.
    fn finish(&mut self) -> String {
        let rest = std::mem::take(&mut self.buffer);
        match self.state {
            TagState::Opening if rest.trim() == self.wrapper.open => String::new(),
            TagState::Opening if self.wrapper.trim_leading_newlines => rest.trim_start_matches('\n').to_string(),
            _ => rest,
        }
    }
}

fn send(out: &mut Vec<Part>, part: Part) {
    match &part {
        Part::Reasoning(t) | Part::Answer(t) if t.is_empty() => {}
        _ => out.push(part),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `text` in pieces of `size` characters; the joined reasoning and answer.
    fn split(parser: ReasoningParser, text: &str, size: usize) -> (String, String) {
        let mut splitter = ReasoningSplitter::new(parser);
        let chars: Vec<char> = text.chars().collect();
        let mut parts: Vec<Part> = Vec::new();
        for piece in chars.chunks(size) {
            parts.extend(splitter.push(&piece.iter().collect::<String>()));
        }
        parts.extend(splitter.finish());
        let (mut reasoning, mut answer) = (String::new(), String::new());
        for p in parts {
            match p {
                Part::Reasoning(t) => reasoning.push_str(&t),
                Part::Answer(t) => answer.push_str(&t),
            }
        }
        (reasoning, answer)
    }

    #[test]
    fn qwen3_reasons_only_inside_an_opening_think_block() {
        for size in [1, 2, 5, 1000] {
            let thought = split(ReasoningParser::Qwen3, "<think>\n2 + 2 is 4 < 5.\n</think>\n\nIt is 4.", size);
            assert_eq!(thought, ("\n2 + 2 is 4 < 5.\n".into(), "\n\nIt is 4.".into()), "pieces of {size}");
            let direct = split(ReasoningParser::Qwen3, "It is <b>4</b>.", size);
            assert_eq!(direct, (String::new(), "It is <b>4</b>.".into()));
        }
        assert_eq!(split(ReasoningParser::Qwen3, "<thi", 1), (String::new(), "<thi".into()));
        assert_eq!(split(ReasoningParser::Qwen3, "<think>cut mid-thou", 3), ("cut mid-thou".into(), String::new()));
    }

    #[test]
    fn glm45_reads_as_qwen3_unless_the_prompt_opened_the_thought() {
        let thinking = "[gMASK]<sop><|user|>\nHi<|assistant|><think>";
        let off = "[gMASK]<sop><|user|>\nHi<|assistant|></think>";
        let glm45_style = "[gMASK]<sop><|user|>\nHi<|assistant|>";
        // An earlier turn's closed thought does not count: only the last assistant turn.
        let earlier = "<|assistant|><think>a</think>b<|user|>\nMore<|assistant|><think>";
        assert_eq!(ReasoningParser::Glm45.for_prompt(thinking), ReasoningParser::DeepseekR1);
        assert_eq!(ReasoningParser::Glm45.for_prompt(earlier), ReasoningParser::DeepseekR1);
        for prompt in [off, glm45_style] {
            assert_eq!(ReasoningParser::Glm45.for_prompt(prompt), ReasoningParser::Glm45, "{prompt}");
        }
        assert_eq!(ReasoningParser::Qwen3.for_prompt(thinking), ReasoningParser::Qwen3);
        for size in [1, 4, 1000] {
            let opened = split(ReasoningParser::Glm45, "<think>Add.</think>Two.", size);
            assert_eq!(opened, ("Add.".into(), "Two.".into()), "pieces of {size}");
            assert_eq!(split(ReasoningParser::Glm45, "Two.", size), (String::new(), "Two.".into()));
            let continued = split(ReasoningParser::Glm45.for_prompt(thinking), "Add.</think>Two.", size);
            assert_eq!(continued, ("Add.".into(), "Two.".into()));
        }
    }

    #[test]
    fn mistral_reasons_inside_think_control_tokens_and_keeps_them_in_the_text() {
        assert_eq!(ReasoningParser::parse("mistral"), Ok(ReasoningParser::Mistral));
        assert!(ReasoningParser::Mistral.keeps_special_tokens() && !ReasoningParser::Qwen3.keeps_special_tokens());
        for size in [1, 3, 1000] {
            let thought = split(ReasoningParser::Mistral, "[THINK]1 + 1 = 2[/THINK]It is 2.", size);
            assert_eq!(thought, ("1 + 1 = 2".into(), "It is 2.".into()), "pieces of {size}");
            // A Markdown link opening the answer is not a thought.
            let direct = split(ReasoningParser::Mistral, "[THE](x) answer", size);
            assert_eq!(direct, (String::new(), "[THE](x) answer".into()));
        }
    }

    #[test]
    fn minimax_m2_and_olmo3_name_deepseek_r1s_rule() {
        assert_eq!(ReasoningParser::parse("minimax_m2"), Ok(ReasoningParser::DeepseekR1));
        assert_eq!(ReasoningParser::parse("olmo3"), Ok(ReasoningParser::DeepseekR1));
        assert!(ReasoningParser::parse("minimax").unwrap_err().contains("minimax_m2"));
    }

    #[test]
    fn deepseek_r1_reasons_from_the_start_until_the_closing_tag() {
        for size in [1, 3, 1000] {
            let opened_in_prompt = split(ReasoningParser::DeepseekR1, "Compare.\n</think>\n\nNine.", size);
            assert_eq!(opened_in_prompt, ("Compare.\n".into(), "\n\nNine.".into()), "pieces of {size}");
            let opened_by_model = split(ReasoningParser::DeepseekR1, "<think>Compare.</think>Nine.", size);
            assert_eq!(opened_by_model, ("Compare.".into(), "Nine.".into()));
        }
        assert_eq!(split(ReasoningParser::DeepseekR1, "never closed", 4), ("never closed".into(), String::new()));
    }

    #[test]
    fn seed_oss_reasons_as_deepseek_r1_between_its_own_tags() {
        for size in [1, 4, 1000] {
            let opened = split(ReasoningParser::SeedOss, "<seed:think>Budget: 512.</seed:think>Nine.", size);
            assert_eq!(opened, ("Budget: 512.".into(), "Nine.".into()), "pieces of {size}");
            // DeepSeek-R1's tags are text to Seed-OSS.
            let other = split(ReasoningParser::SeedOss, "a</think>b</seed:think>c", size);
            assert_eq!(other, ("a</think>b".into(), "c".into()));
        }
    }

    #[test]
    fn hunyuan_a13b_drops_the_tags_newlines_and_its_answer_wrapper() {
        let out = "<think>\nCount: 3.\n</think>\n<answer>\nThree.\n</answer>";
        for size in [1, 2, 5, 1000] {
            let thought = split(ReasoningParser::HunyuanA13b, out, size);
            assert_eq!(thought, ("Count: 3.".into(), "Three.".into()), "pieces of {size}");
            // Fast thinking: an empty thought, the closing tag right after the opening one.
            let fast = split(ReasoningParser::HunyuanA13b, "<think>\n\n</think>\n<answer>\nOK\n</answer>", size);
            assert_eq!(fast, (String::new(), "OK".into()), "pieces of {size}");
            // No thought: the answer alone, wrapped or not; a closing tag without its newline.
            let direct = split(ReasoningParser::HunyuanA13b, "<answer>\nYes.\n</answer>", size);
            assert_eq!(direct, (String::new(), "Yes.".into()));
            let plain = split(ReasoningParser::HunyuanA13b, "It is <b>4</b>.", size);
            assert_eq!(plain, (String::new(), "It is <b>4</b>.".into()));
            let tight = split(ReasoningParser::HunyuanA13b, "<think>\nHm.</think><answer>\n4\n</answer>", size);
            assert_eq!(tight, ("Hm.".into(), "4".into()));
        }
        // Cut while answering: what was written is content, the wrapper's opening dropped.
        let cut = split(ReasoningParser::HunyuanA13b, "<think>\nA\n</think>\n<answer>\nPart", 3);
        assert_eq!(cut, ("A".into(), "Part".into()));
        assert_eq!(ReasoningParser::parse("hunyuan_a13b"), Ok(ReasoningParser::HunyuanA13b));
    }

    #[test]
    fn ernie45_reasons_as_deepseek_r1_and_drops_its_response_wrapper() {
        for size in [1, 3, 1000] {
            let wrapped = split(ReasoningParser::Ernie45, "abc\n</think>\n\n<response>\ndef\n</response>\n", size);
            assert_eq!(wrapped, ("abc\n".into(), "\ndef\n".into()), "pieces of {size}");
            let bare = split(ReasoningParser::Ernie45, "abc\n</think>\ndef", size);
            assert_eq!(bare, ("abc\n".into(), "def".into()), "pieces of {size}");
        }
        assert_eq!(split(ReasoningParser::Ernie45, "still thinking", 4), ("still thinking".into(), String::new()));
        assert_eq!(ReasoningParser::parse("ernie45"), Ok(ReasoningParser::Ernie45));
    }

    #[test]
    fn held_text_is_only_what_could_begin_the_closing_tag() {
        let mut splitter = ReasoningSplitter::new(ReasoningParser::DeepseekR1);
        assert_eq!(splitter.push("a </th"), vec![Part::Reasoning("a ".into())]);
        assert_eq!(splitter.push("ing"), vec![Part::Reasoning("</thing".into())]);
        assert_eq!(splitter.push("</think>b"), vec![Part::Answer("b".into())]);
        assert!(ReasoningParser::parse("o1").unwrap_err().contains("deepseek_r1, minimax_m2, olmo3, qwen3"));
    }
}
