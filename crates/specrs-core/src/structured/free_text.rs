//! Free text that never contains any of a list of strings (an enclosing tag's end, a trigger,
//! an `excludes` list), written as grammar rules.
//!
//! The rules are the states of an Aho–Corasick automaton over the strings: one rule per
//! state, each either stopping or reading one character and going on in the state that
//! character leads to. States where one of the strings has just been written are left out,
//! so no text the rules derive contains one, and a text may stop anywhere else. Every rule
//! ends in a tail call, so the parser's stack stays flat however long the text runs.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use regex_syntax::hir::{ClassUnicode, ClassUnicodeRange};

use super::ebnf::{Definition, Expr, MAX_RULES, Position};

/// The definitions of text containing none of `excluded` and, with `max_chars`, at most that
/// many characters (Unicode scalar values). The first definition, named `name`, is where the
/// text starts; the others are named `name#state` (`name#state/left` with a budget).
pub(super) fn definitions(name: &str, excluded: &[String], max_chars: Option<u32>) -> Result<Vec<Definition>, String> {
    let strings: BTreeSet<&str> = excluded.iter().map(String::as_str).filter(|s| !s.is_empty()).collect();
    let automaton = Automaton::new(&strings);
    let alphabet: BTreeSet<char> = strings.iter().flat_map(|s| s.chars()).collect();
    let live: Vec<usize> = (0..automaton.fail.len()).filter(|&s| !automaton.matched[s]).collect();
    let budgets = max_chars.map_or(1, |m| m as usize + 1);
    if live.len().saturating_mul(budgets) > MAX_RULES {
        return Err(format!(
            "free text excluding {} strings with at most {} characters needs {} rules; at most {MAX_RULES} are \
             taken: lower max_chars or exclude fewer strings",
            strings.len(),
            max_chars.unwrap_or(0),
            live.len() * budgets
        ));
    }
    let rule_name = |state: usize, left: Option<u32>| match (state, left) {
        (0, left) if left == max_chars => name.to_string(),
        (state, None) => format!("{name}#{state}"),
        (state, Some(left)) => format!("{name}#{state}/{left}"),
    };
    // Characters outside every excluded string lead back to the start.
    let mut elsewhere = class_of(alphabet.iter().copied());
    elsewhere.negate();
    let mut definitions = Vec::new();
    let lefts: Vec<Option<u32>> = match max_chars {
        None => vec![None],
        Some(max) => (0..=max).rev().map(Some).collect(),
    };
    for &left in &lefts {
        for &state in &live {
            let mut alternatives = vec![Vec::new()];
            if left != Some(0) {
                let next = left.map(|l| l - 1);
                // Characters grouped by the state they lead to: one alternative per state.
                let mut by_target: BTreeMap<usize, Vec<char>> = BTreeMap::new();
                for &c in &alphabet {
                    let target = automaton.step(state, c);
                    if !automaton.matched[target] {
                        by_target.entry(target).or_default().push(c);
                    }
                }
                for (target, chars) in by_target {
                    alternatives.push(vec![Expr::Class(class_of(chars)), reference(rule_name(target, next))]);
                }
                if !elsewhere.ranges().is_empty() {
                    alternatives.push(vec![Expr::Class(elsewhere.clone()), reference(rule_name(0, next))]);
                }
            }
            definitions.push(Definition {
                name: rule_name(state, left),
                at: Position::generated(),
                body: Expr::Choice(alternatives),
            });
        }
    }
    Ok(definitions)
}

fn reference(name: String) -> Expr {
    Expr::Reference { name, at: Position::generated() }
}

fn class_of(chars: impl IntoIterator<Item = char>) -> ClassUnicode {
    ClassUnicode::new(chars.into_iter().map(|c| ClassUnicodeRange::new(c, c)))
}

/// An Aho–Corasick automaton over characters: the trie of the strings with failure links.
struct Automaton {
    children: Vec<BTreeMap<char, usize>>,
    /// The state of the longest proper suffix of this state's text that is in the trie.
    fail: Vec<usize>,
    /// One of the strings ends at this state's text.
    matched: Vec<bool>,
}

impl Automaton {
    fn new(strings: &BTreeSet<&str>) -> Self {
        let mut automaton = Self { children: vec![BTreeMap::new()], fail: vec![0], matched: vec![false] };
        for string in strings {
            let mut state = 0;
            for c in string.chars() {
                state = match automaton.children[state].get(&c) {
                    Some(&next) => next,
                    None => {
                        let next = automaton.fail.len();
                        automaton.children.push(BTreeMap::new());
                        automaton.fail.push(0);
                        automaton.matched.push(false);
                        automaton.children[state].insert(c, next);
                        next
                    }
                };
            }
            automaton.matched[state] = true;
        }
        // Breadth first, so a state's failure link (a shallower state) is settled before it
        // is used for the state's children.
        let mut queue: VecDeque<usize> = automaton.children[0].values().copied().collect();
        while let Some(state) = queue.pop_front() {
            let children: Vec<(char, usize)> = automaton.children[state].iter().map(|(&c, &n)| (c, n)).collect();
            for (c, child) in children {
                let fail = automaton.step(automaton.fail[state], c);
                automaton.fail[child] = fail;
                automaton.matched[child] |= automaton.matched[fail];
                queue.push_back(child);
            }
        }
        automaton
    }

    /// The state after reading `c` in `state`.
    fn step(&self, mut state: usize, c: char) -> usize {
        loop {
            if let Some(&next) = self.children[state].get(&c) {
                return next;
            }
            if state == 0 {
                return 0;
            }
            state = self.fail[state];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::ebnf::Rules;
    use super::super::pushdown::PushdownGrammar;
    use super::*;

    fn free_text(excluded: &[&str], max_chars: Option<u32>) -> PushdownGrammar {
        let excluded: Vec<String> = excluded.iter().map(|s| s.to_string()).collect();
        let definitions = definitions("text", &excluded, max_chars).unwrap();
        PushdownGrammar::from_rules(Rules::lower(&definitions, "text").unwrap()).unwrap()
    }

    #[test]
    fn text_never_contains_an_excluded_string_and_may_stop_anywhere_else() {
        let grammar = free_text(&["</think>", "<tool>"], None);
        for allowed in ["", "plain words", "a < b and </thin k>", "<tool", "</think", "ünïcödé ✓ </", "<<too>"] {
            assert!(grammar.matches(allowed.as_bytes()), "{allowed:?} should be allowed");
        }
        for refused in ["</think>", "so </think> then", "x<tool>", "<<tool>", "<</think>>"] {
            assert!(!grammar.matches(refused.as_bytes()), "{refused:?} should be refused");
        }
    }

    #[test]
    fn overlapping_strings_are_caught_through_failure_links() {
        // "abab" must be seen inside "ababab" and "aabab"; "bc" inside "abc" (a suffix of a
        // trie path that is itself a string).
        let grammar = free_text(&["abab", "bc"], None);
        assert!(grammar.matches(b"aba"));
        assert!(grammar.matches(b"abaab"));
        assert!(!grammar.matches(b"aabab"));
        assert!(!grammar.matches(b"ababab"));
        assert!(!grammar.matches(b"abc"));
    }

    #[test]
    fn no_exclusions_is_any_text_and_empty_strings_are_ignored() {
        let grammar = free_text(&["", ""], None);
        assert!(grammar.matches("any text at all, even </think> ✓".as_bytes()));
        assert!(!grammar.matches(&[0xff]), "free text is valid UTF-8");
    }

    #[test]
    fn a_character_budget_counts_characters_not_bytes() {
        let grammar = free_text(&["end"], Some(4));
        assert!(grammar.matches("ééé✓".as_bytes()));
        assert!(grammar.matches(b"en d"));
        assert!(!grammar.matches(b"abcde"));
        assert!(!grammar.matches(b"xend"));
        assert!(free_text(&[], Some(0)).matches(b""));
        assert!(!free_text(&[], Some(0)).matches(b"a"));
    }

    #[test]
    fn a_budget_too_large_for_the_rule_limit_is_refused_by_name() {
        let error = definitions("text", &["</think>".to_string()], Some(4096)).err().unwrap();
        assert!(error.contains("lower max_chars"), "{error}");
    }
}
