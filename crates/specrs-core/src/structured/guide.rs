//! A compiled guide: a byte automaton over a vocabulary, the tokens it allows from each
//! state (cached), and a cursor that follows one output.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use regex_automata::util::primitives::StateID;

use super::json_grammar::{JsonGrammar, JsonState};
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
}

/// Where an output is in its guide's automaton.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GuideState {
    Regex(StateID),
    Json(JsonState),
    /// The output left the grammar (only reachable by tokens the guide never allowed).
    Dead,
}

impl Grammar {
    fn start(&self) -> GuideState {
        match self {
            Grammar::Regex(g) => GuideState::Regex(g.start()),
            Grammar::Json(g) => GuideState::Json(g.start()),
        }
    }

    fn step(&self, state: GuideState, byte: u8) -> Option<GuideState> {
        match (self, state) {
            (Grammar::Regex(g), GuideState::Regex(s)) => g.step(s, byte).map(GuideState::Regex),
            (Grammar::Json(g), GuideState::Json(s)) => g.step(s, byte).map(GuideState::Json),
            _ => None,
        }
    }

    fn accepts(&self, state: GuideState) -> bool {
        match (self, state) {
            (Grammar::Regex(g), GuideState::Regex(s)) => g.accepts(s),
            (Grammar::Json(g), GuideState::Json(s)) => g.accepts(s),
            _ => false,
        }
    }
}

/// A grammar bound to a vocabulary.
#[derive(Debug)]
pub struct TokenGuide {
    grammar: Grammar,
    vocabulary: Arc<TokenVocabulary>,
    allowed: Mutex<HashMap<GuideState, Arc<TokenSet>>>,
}

impl TokenGuide {
    pub fn new(grammar: Grammar, vocabulary: Arc<TokenVocabulary>) -> Self {
        Self { grammar, vocabulary, allowed: Mutex::new(HashMap::new()) }
    }

    pub fn start(&self) -> GuideState {
        self.grammar.start()
    }

    /// The state after `token`. End-of-sequence keeps a state that may end (the output is
    /// over); any token the state does not allow leads to [`GuideState::Dead`].
    pub fn advance(&self, state: GuideState, token: u32) -> GuideState {
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

    /// Whether the output may end in `state`.
    pub fn accepts(&self, state: GuideState) -> bool {
        self.grammar.accepts(state)
    }

    /// End-of-sequence, where it is all `state` allows: the output is complete and no byte
    /// may follow it.
    pub fn forced_end(&self, state: GuideState) -> Option<u32> {
        let complete = self.grammar.accepts(state) && (0..=255u8).all(|b| self.grammar.step(state, b).is_none());
        complete.then(|| self.vocabulary.eos_token_ids().first().copied()).flatten()
    }

    /// The bytes the grammar forces from `state`, at most `max` of them: while the output may
    /// not end and exactly one byte continues it (a schema's keys and punctuation, the rest of
    /// the only choice left). Empty where the output has a choice to make.
    pub fn forced_bytes(&self, mut state: GuideState, max: usize) -> Vec<u8> {
        let mut forced = Vec::new();
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
        let mut set = if state == GuideState::Dead {
            TokenSet::empty(self.vocabulary.vocab_size())
        } else {
            self.vocabulary.tokens_accepted_from(state, |s, b| self.grammar.step(s, b))
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
    /// The cursor after `output` (the tokens generated so far).
    pub fn after(guide: &CompiledGuide, output: &[u32]) -> Self {
        let state = output.iter().fold(guide.start(), |s, &t| guide.advance(s, t));
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
