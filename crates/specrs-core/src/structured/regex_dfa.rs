//! A regular expression as a byte automaton: a dense DFA (regex-automata) that must match
//! the whole output.
//!
//! The DFA reports every match (`MatchKind::All`), not the leftmost-first one a search
//! wants: with leftmost-first, `a|ab` would stop after `a`, and a guide would never allow
//! `ab`. The start is anchored; the end is checked by the end-of-input transition.

use std::collections::HashMap;

use regex_automata::dfa::{Automaton, StartKind, dense};
use regex_automata::nfa::thompson;
use regex_automata::util::primitives::StateID;
use regex_automata::util::start;
use regex_automata::{Anchored, MatchKind};

/// Cap on the DFA's memory and on determinization's working memory.
pub const MAX_DFA_BYTES: usize = 64 << 20;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RegexError(pub String);

#[derive(Debug)]
pub struct RegexGrammar {
    dfa: dense::DFA<Vec<u32>>,
    start: StateID,
    /// Whether some continuation of a state ends in a whole match, by state index (the trie
    /// walk asks this for every node it visits, so it is a plain lookup, not a hash).
    live: Vec<bool>,
}

impl RegexGrammar {
    pub fn new(pattern: &str) -> Result<Self, RegexError> {
        let dfa = dense::Builder::new()
            // The NFA first: counted repetitions (`a{1000000000}`) expand there, before any
            // DFA limit applies.
            .thompson(thompson::Config::new().nfa_size_limit(Some(MAX_DFA_BYTES)))
            .configure(
                dense::Config::new()
                    .match_kind(MatchKind::All)
                    .start_kind(StartKind::Anchored)
                    .dfa_size_limit(Some(MAX_DFA_BYTES))
                    .determinize_size_limit(Some(MAX_DFA_BYTES)),
            )
            .build(pattern)
            .map_err(|e| {
                // The cause (an NFA past its limit) sits under "error building NFA".
                let mut message = e.to_string();
                let mut cause = std::error::Error::source(&e);
                while let Some(c) = cause {
                    message = format!("{message}: {c}");
                    cause = c.source();
                }
                if message.contains("exceeded") || message.contains("limit") {
                    RegexError(format!(
                        "the pattern's automaton is larger than {} MiB ({message}); simplify it or bound its \
                         repetitions less generously",
                        MAX_DFA_BYTES >> 20
                    ))
                } else {
                    RegexError(format!("not a valid regex: {message}"))
                }
            })?;
        let start = dfa
            .start_state(&start::Config::new().anchored(Anchored::Yes))
            .map_err(|e| RegexError(format!("the pattern has no anchored start: {e}")))?;
        let live = live_states(&dfa, start);
        // A constraint no text satisfies would leave a request nothing to write: refused here
        // rather than answered with an empty output.
        if !live.get(start.as_usize() >> dfa.stride2()).copied().unwrap_or(false) {
            return Err(RegexError("the constraint allows no text at all (its pattern can never match)".into()));
        }
        Ok(Self { dfa, start, live })
    }

    pub fn start(&self) -> StateID {
        self.start
    }

    pub fn step(&self, state: StateID, byte: u8) -> Option<StateID> {
        let next = self.dfa.next_state(state, byte);
        self.live.get(next.as_usize() >> self.dfa.stride2()).copied().unwrap_or(false).then_some(next)
    }

    /// Whether the bytes that led to `state` are a whole match.
    pub fn accepts(&self, state: StateID) -> bool {
        self.dfa.is_match_state(self.dfa.next_eoi_state(state))
    }

    /// Whether `text` as a whole matches.
    pub fn matches(&self, text: &[u8]) -> bool {
        text.iter().try_fold(self.start, |s, &b| self.step(s, b)).is_some_and(|s| self.accepts(s))
    }
}

/// The states reachable from `start` that can still reach a whole match: a walk over one
/// byte per equivalence class, then a backward sweep from the accepting states.
fn live_states(dfa: &dense::DFA<Vec<u32>>, start: StateID) -> Vec<bool> {
    let representatives: Vec<u8> = dfa.byte_classes().representatives(..).filter_map(|u| u.as_u8()).collect();
    let mut index = HashMap::from([(start, 0usize)]);
    let mut states = vec![start];
    let mut predecessors: Vec<Vec<usize>> = vec![Vec::new()];
    let mut i = 0;
    while i < states.len() {
        let state = states[i];
        for &byte in &representatives {
            let next = dfa.next_state(state, byte);
            if dfa.is_dead_state(next) || dfa.is_quit_state(next) {
                continue;
            }
            let j = *index.entry(next).or_insert_with(|| {
                states.push(next);
                predecessors.push(Vec::new());
                states.len() - 1
            });
            predecessors[j].push(i);
        }
        i += 1;
    }
    let mut live = vec![false; states.len()];
    let mut frontier: Vec<usize> =
        (0..states.len()).filter(|&i| dfa.is_match_state(dfa.next_eoi_state(states[i]))).collect();
    frontier.iter().for_each(|&i| live[i] = true);
    while let Some(j) = frontier.pop() {
        for &p in &predecessors[j] {
            if !live[p] {
                live[p] = true;
                frontier.push(p);
            }
        }
    }
    let index = |s: StateID| s.as_usize() >> dfa.stride2();
    let mut by_index = vec![false; states.iter().map(|&s| index(s) + 1).max().unwrap_or(0)];
    for (state, live) in states.into_iter().zip(live) {
        by_index[index(state)] = live;
    }
    by_index
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_outputs_match_and_every_alternative_stays_reachable() {
        let grammar = RegexGrammar::new("a|ab|[0-9]{2,3}").unwrap();
        for (text, whole) in [("a", true), ("ab", true), ("12", true), ("123", true), ("1", false), ("1234", false)] {
            assert_eq!(grammar.matches(text.as_bytes()), whole, "{text}");
        }
        let after_a = grammar.step(grammar.start(), b'a').unwrap();
        assert!(grammar.accepts(after_a) && grammar.step(after_a, b'b').is_some(), "`a` may end or go on");
        assert!(grammar.step(grammar.start(), b'x').is_none());
        let yes = RegexGrammar::new("yes").unwrap();
        let done = b"yes".iter().try_fold(yes.start(), |s, &b| yes.step(s, b)).unwrap();
        assert!(yes.accepts(done) && (0..=255).all(|b| yes.step(done, b).is_none()), "nothing follows a whole match");
    }

    #[test]
    fn a_pattern_no_text_matches_is_refused() {
        for pattern in ["a^b", "[a&&b]", "x[a&&b]y"] {
            let e = RegexGrammar::new(pattern).unwrap_err().to_string();
            assert!(e.contains("allows no text"), "{pattern}: {e}");
        }
        assert!(RegexGrammar::new("").unwrap().matches(b""), "the empty text is still a text");
    }

    #[test]
    fn unicode_classes_walk_utf8_bytes() {
        let grammar = RegexGrammar::new("[é日]+").unwrap();
        assert!(grammar.matches("é日é".as_bytes()));
        let first_byte = grammar.step(grammar.start(), "日".as_bytes()[0]).unwrap();
        assert!(!grammar.accepts(first_byte), "half a character is not a match");
    }

    #[test]
    fn bad_and_oversized_patterns_are_errors_that_say_so() {
        assert!(RegexGrammar::new("(").unwrap_err().0.contains("not a valid regex"));
        let huge = RegexGrammar::new("(?:[a-z]{40}|[0-9a-z]{41}){1,200}").unwrap_err().0;
        assert!(huge.contains("larger than 64 MiB"), "{huge}");
        // Counted repetitions expand in the NFA: refused there, before they take the memory.
        let started = std::time::Instant::now();
        for counted in ["a{1000000000}", "[a-z]{100000000}"] {
            let e = RegexGrammar::new(counted).unwrap_err().0;
            assert!(e.contains("larger than 64 MiB"), "{counted}: {e}");
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(30), "refused without building it");
    }
}
