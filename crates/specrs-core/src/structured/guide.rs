//! A compiled guide: a byte automaton over a vocabulary, the tokens it allows from each
//! state (cached), and a cursor that follows one output. A guide may let a reasoning model
//! think first: the automaton starts once `</think>` has closed the thinking (vLLM applies
//! structured outputs after the reasoning parser's end the same way).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use regex_automata::util::primitives::StateID;

use super::json_grammar::{JsonGrammar, JsonState};
use super::pushdown::{PushdownGrammar, PushdownState};
use super::regex_dfa::RegexGrammar;
use super::vocab::{TokenSet, TokenVocabulary};

/// Allowed-token sets kept per guide before the cache starts over (a set is `V / 8` bytes).
const MAX_CACHED_STATES: usize = 2048;

/// The automaton a guide runs.
#[derive(Debug)]
pub enum Grammar {
    /// Boxed: a DFA's handle is large beside the JSON automaton's flag.
    Regex(Box<RegexGrammar>),
    Json(JsonGrammar),
    /// A context-free grammar (EBNF or Lark).
    Cfg(Box<PushdownGrammar>),
}

/// Where an output is in its guide's automaton.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GuideState {
    Regex(StateID),
    Json(JsonState),
    Cfg(PushdownState),
    /// The output left the grammar (only reachable by tokens the guide never allowed).
    Dead,
    /// Inside the model's reasoning: any token, until `</think>`.
    Thinking,
    /// The output's start, for a model that may think first: `<think>` or the grammar's
    /// first token.
    MayThink,
    /// Just after `</think>`: whitespace, or the grammar's first token.
    ReasoningDone,
}

impl Grammar {
    fn start(&self) -> GuideState {
        match self {
            Grammar::Regex(g) => GuideState::Regex(g.start()),
            Grammar::Json(g) => GuideState::Json(g.start()),
            Grammar::Cfg(g) => GuideState::Cfg(g.start()),
        }
    }

    fn step(&self, state: GuideState, byte: u8) -> Option<GuideState> {
        match (self, state) {
            (Grammar::Regex(g), GuideState::Regex(s)) => g.step(s, byte).map(GuideState::Regex),
            (Grammar::Json(g), GuideState::Json(s)) => g.step(s, byte).map(GuideState::Json),
            (Grammar::Cfg(g), GuideState::Cfg(s)) => g.step(s, byte).map(GuideState::Cfg),
            _ => None,
        }
    }

    fn accepts(&self, state: GuideState) -> bool {
        match (self, state) {
            (Grammar::Regex(g), GuideState::Regex(s)) => g.accepts(s),
            (Grammar::Json(g), GuideState::Json(s)) => g.accepts(s),
            (Grammar::Cfg(g), GuideState::Cfg(s)) => g.accepts(s),
            _ => false,
        }
    }
}

/// A grammar bound to a vocabulary.
#[derive(Debug)]
pub struct TokenGuide {
    grammar: Grammar,
    vocabulary: Arc<TokenVocabulary>,
    /// `(<think>, </think>)` where the grammar holds only after the model's reasoning.
    reasoning: Option<(u32, u32)>,
    allowed: Mutex<HashMap<GuideState, Arc<TokenSet>>>,
}

impl TokenGuide {
    pub fn new(grammar: Grammar, vocabulary: Arc<TokenVocabulary>) -> Self {
        Self { grammar, vocabulary, reasoning: None, allowed: Mutex::new(HashMap::new()) }
    }

    /// The same guide holding off while the model thinks, where the vocabulary has the
    /// reasoning markers (without them there is no telling thought from answer, and the
    /// grammar holds from the first token).
    pub fn after_reasoning(mut self) -> Self {
        self.reasoning = self.vocabulary.thinking_token_ids();
        self
    }

    /// The grammar's start.
    pub fn start(&self) -> GuideState {
        self.grammar.start()
    }

    /// Where an output begins after `prompt`. A guide that lets the model think first starts
    /// inside the reasoning where the prompt opened it (DeepSeek-R1's template ends with
    /// `<think>`), at the grammar where the prompt closed it and wrote nothing since but
    /// whitespace (Qwen3's `enable_thinking: false`), and otherwise where the model may open it.
    pub fn start_after(&self, prompt: &[u32]) -> GuideState {
        let Some((open, close)) = self.reasoning else { return self.start() };
        let last_marker = prompt.iter().rposition(|&t| t == open || t == close);
        match last_marker {
            Some(at) if prompt[at] == open => GuideState::Thinking,
            Some(at) if prompt[at + 1..].iter().all(|&t| self.vocabulary.is_whitespace(t)) => self.start(),
            _ => GuideState::MayThink,
        }
    }

    /// The state after `token`. End-of-sequence keeps a state that may end (the output is
    /// over); any token the state does not allow leads to [`GuideState::Dead`].
    pub fn advance(&self, state: GuideState, token: u32) -> GuideState {
        if let Some((open, close)) = self.reasoning {
            match state {
                GuideState::Thinking if token == close => return GuideState::ReasoningDone,
                GuideState::Thinking => return GuideState::Thinking,
                GuideState::MayThink if token == open => return GuideState::Thinking,
                GuideState::ReasoningDone if self.vocabulary.is_whitespace(token) => return state,
                GuideState::MayThink | GuideState::ReasoningDone => return self.advance(self.start(), token),
                _ => {}
            }
        }
        if self.vocabulary.eos_token_ids().contains(&token) {
            return if self.grammar.accepts(state) { state } else { GuideState::Dead };
        }
        self.vocabulary
            .bytes_of(token)
            .and_then(|bytes| bytes.iter().try_fold(state, |s, &b| self.grammar.step(s, b)))
            .unwrap_or(GuideState::Dead)
    }

    /// Whether `token` ends the output (the vocabulary's end-of-sequence tokens).
    pub fn is_end_of_sequence(&self, token: u32) -> bool {
        self.vocabulary.eos_token_ids().contains(&token)
    }

    /// Whether the output may end in `state` (while thinking it may, as plain decoding would).
    pub fn accepts(&self, state: GuideState) -> bool {
        match state {
            GuideState::Thinking => true,
            GuideState::MayThink | GuideState::ReasoningDone => self.grammar.accepts(self.start()),
            _ => self.grammar.accepts(state),
        }
    }

    /// Whether `state` is in the reasoning a guide lets the model write first, or at its
    /// edges, where the model chooses rather than the grammar.
    fn around_reasoning(state: GuideState) -> bool {
        matches!(state, GuideState::Thinking | GuideState::MayThink | GuideState::ReasoningDone)
    }

    /// End-of-sequence, where it is all `state` allows: the output is complete and no byte
    /// may follow it.
    pub fn forced_end(&self, state: GuideState) -> Option<u32> {
        if Self::around_reasoning(state) {
            return None;
        }
        let complete = self.grammar.accepts(state) && (0..=255u8).all(|b| self.grammar.step(state, b).is_none());
        complete.then(|| self.vocabulary.eos_token_ids().first().copied()).flatten()
    }

    /// The bytes the grammar forces from `state`, at most `max` of them: while the output may
    /// not end and exactly one byte continues it (a schema's keys and punctuation, the rest of
    /// the only choice left). Empty where the output has a choice to make.
    pub fn forced_bytes(&self, mut state: GuideState, max: usize) -> Vec<u8> {
        let mut forced = Vec::new();
        if Self::around_reasoning(state) {
            return forced;
        }
        while forced.len() < max && !self.grammar.accepts(state) {
            let mut next = (0..=255u8).filter_map(|b| self.grammar.step(state, b).map(|s| (b, s)));
            match (next.next(), next.next()) {
                (Some((byte, after)), None) => {
                    forced.push(byte);
                    state = after;
                }
                _ => break,
            }
        }
        forced
    }

    /// The tokens allowed in `state`: every token whose bytes the grammar accepts from it,
    /// and end-of-sequence where the output may end. A state with no way on (a dead one)
    /// allows end-of-sequence alone, so a request can always finish.
    pub fn allowed(&self, state: GuideState) -> Arc<TokenSet> {
        if let Some(set) = self.lock().get(&state) {
            return set.clone();
        }
        let set = Arc::new(self.allowed_uncached(state));
        let mut cache = self.lock();
        if cache.len() >= MAX_CACHED_STATES {
            cache.clear();
        }
        cache.insert(state, set.clone());
        set
    }

    /// [`Self::allowed`] computed afresh (a walk over the vocabulary's trie).
    pub fn allowed_uncached(&self, state: GuideState) -> TokenSet {
        let vocab_size = self.vocabulary.vocab_size();
        match (state, self.reasoning) {
            (GuideState::Thinking, _) => return TokenSet::full(vocab_size),
            (GuideState::MayThink, Some((open, _))) => {
                let mut set = self.allowed_uncached(self.start());
                set.insert(open);
                return set;
            }
            (GuideState::ReasoningDone, _) => {
                let mut set = self.allowed_uncached(self.start());
                (0..vocab_size as u32).filter(|&t| self.vocabulary.is_whitespace(t)).for_each(|t| set.insert(t));
                return set;
            }
            _ => {}
        }
        let mut set = match (&self.grammar, state) {
            (_, GuideState::Dead) => TokenSet::empty(self.vocabulary.vocab_size()),
            (Grammar::Cfg(g), GuideState::Cfg(s)) => g.tokens_accepted_from(&self.vocabulary, s),
            _ => self.vocabulary.tokens_accepted_from(state, |s, b| self.grammar.step(s, b)),
        };
        if set.is_empty() || self.grammar.accepts(state) {
            self.vocabulary.eos_token_ids().iter().for_each(|&eos| set.insert(eos));
        }
        set
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<GuideState, Arc<TokenSet>>> {
        // A panic while holding the lock leaves a cache that is still consistent.
        self.allowed.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A shared compiled guide; equal only to itself (parameters compare by identity).
#[derive(Debug, Clone)]
pub struct CompiledGuide(pub Arc<TokenGuide>);

impl PartialEq for CompiledGuide {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for CompiledGuide {}

impl std::ops::Deref for CompiledGuide {
    type Target = TokenGuide;
    fn deref(&self) -> &TokenGuide {
        &self.0
    }
}

/// One output's position in its guide, moved token by token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuideCursor {
    guide: CompiledGuide,
    state: GuideState,
}

impl GuideCursor {
    /// The cursor after `output` (the tokens generated so far for `prompt`).
    pub fn after(guide: &CompiledGuide, prompt: &[u32], output: &[u32]) -> Self {
        let state = output.iter().fold(guide.start_after(prompt), |s, &t| guide.advance(s, t));
        Self { guide: guide.clone(), state }
    }

    pub fn push(&mut self, token: u32) {
        self.state = self.guide.advance(self.state, token);
    }

    pub fn state(&self) -> GuideState {
        self.state
    }

    /// Masks every token the guide does not allow next (`logits` is `[V]`).
    pub fn mask_logits(&self, logits: &mut [f32]) {
        self.guide.allowed(self.state).mask_logits(logits);
    }
}
