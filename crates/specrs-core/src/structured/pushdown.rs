//! A context-free grammar as a byte automaton: the recogniser behind `grammar`.
//!
//! The parser's configuration is the set of stacks of grammar positions it could be in (the
//! nondeterminism of alternatives kept side by side, as llama.cpp's grammar sampler keeps
//! them), each stack's top a byte set to read next or nothing (the root is complete). Stacks
//! are hash-consed nodes (a position on top of a parent stack), so stacks that share their
//! bottom share its memory and compare by id, and configurations are interned sets of stack
//! ids: a state is a small id, `Copy` and hashable like the other automata's, so the guide
//! caches allowed tokens per state. Each `(state, byte)` step is computed once and remembered
//! (a walk over the vocabulary's trie is mostly these lookups). Configurations depend on the
//! output's nesting, not its length (a repetition is a tail call and keeps the stack flat).

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex};

use super::ebnf::{EbnfError, Rules, Symbol};
use super::vocab::{TokenSet, TokenVocabulary};

/// Deepest stack of open rules a configuration may hold (the output's nesting).
pub const MAX_STACK_DEPTH: usize = 1024;

/// Most stacks one configuration may hold (the grammar's ambiguity at one point).
pub const MAX_STACKS: usize = 1024;

/// Most configurations one grammar interns; past it, new ones end the output's way on.
pub const MAX_CONFIGURATIONS: usize = 1 << 20;

/// Most steps remembered before the memo starts over (~24 MiB; it is a cache: the states
/// stay, only their steps are computed again).
pub const MAX_REMEMBERED_STEPS: usize = 1 << 20;

/// A remembered step whose byte leaves the grammar.
const REFUSED: u32 = u32::MAX;

/// The empty stack: the root is complete.
const EMPTY: u32 = u32::MAX;

/// A stack: its top position in [`Rules::symbols`] over the stack below (an id, or [`EMPTY`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Node {
    top: u32,
    below: u32,
}

/// The stack ids a parser could be in, sorted and distinct.
type Configuration = Arc<[u32]>;

/// An interned configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PushdownState(u32);

#[derive(Debug)]
pub struct PushdownGrammar {
    rules: Rules,
    start: PushdownState,
    table: Mutex<Table>,
}

type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<StepHasher>>;

#[derive(Debug, Default)]
struct Table {
    nodes: Vec<Node>,
    depths: Vec<u32>,
    node_ids: FastMap<Node, u32>,
    configurations: Vec<Configuration>,
    /// Whether each configuration may end the output (it holds the empty stack).
    accepting: Vec<bool>,
    ids: HashMap<Configuration, u32>,
    /// Steps taken, by `state << 8 | byte` ([`REFUSED`] where the byte leaves the grammar);
    /// the trie walks take millions over a long output, so it is bounded.
    steps: FastMap<u64, u32>,
}

impl Table {
    /// The stack `top` over `below`, interned.
    fn push(&mut self, top: u32, below: u32) -> u32 {
        let node = Node { top, below };
        if let Some(&id) = self.node_ids.get(&node) {
            return id;
        }
        let id = self.nodes.len() as u32;
        self.nodes.push(node);
        self.depths.push(if below == EMPTY { 1 } else { self.depths[below as usize] + 1 });
        self.node_ids.insert(node, id);
        id
    }

    fn depth(&self, stack: u32) -> usize {
        if stack == EMPTY { 0 } else { self.depths[stack as usize] as usize }
    }
}

/// Fibonacci hashing: one multiply per word, where SipHash would cost more than the step it
/// finds.
#[derive(Default)]
struct StepHasher(u64);

impl Hasher for StepHasher {
    fn write(&mut self, bytes: &[u8]) {
        bytes.iter().for_each(|&b| self.write_u64(u64::from(b)));
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        let mixed = (self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = mixed ^ (mixed >> 32);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

impl PushdownGrammar {
    pub fn new(text: &str) -> Result<Self, EbnfError> {
        Self::from_rules(Rules::parse(text)?)
    }

    /// The recogniser of rules already lowered (a grammar's, or a structural tag's).
    pub fn from_rules(rules: Rules) -> Result<Self, EbnfError> {
        let mut table = Table::default();
        let mut stacks = Vec::new();
        expand(&rules, &mut table, EMPTY, rules.root, 0, &mut stacks);
        if stacks.is_empty() {
            return Err(EbnfError(format!(
                "the grammar enters more than {MAX_STACK_DEPTH} rules before its first character; shorten the chain"
            )));
        }
        let start = intern(&mut table, stacks)
            .ok_or_else(|| EbnfError("the grammar's start is too ambiguous (over 1024 parses at once)".into()))?;
        Ok(Self { rules, start: PushdownState(start), table: Mutex::new(table) })
    }

    pub fn start(&self) -> PushdownState {
        self.start
    }

    pub fn step(&self, state: PushdownState, byte: u8) -> Option<PushdownState> {
        self.step_in(&mut self.lock(), state, byte)
    }

    /// The tokens whose bytes the grammar reads from `state` (a walk over the vocabulary's
    /// trie under one hold of the table's lock).
    pub fn tokens_accepted_from(&self, vocabulary: &TokenVocabulary, state: PushdownState) -> TokenSet {
        let table = RefCell::new(self.lock());
        vocabulary.tokens_accepted_from(state, |s, b| self.step_in(&mut table.borrow_mut(), s, b))
    }

    fn step_in(&self, table: &mut Table, state: PushdownState, byte: u8) -> Option<PushdownState> {
        let key = u64::from(state.0) << 8 | u64::from(byte);
        match table.steps.get(&key) {
            None => {}
            Some(&REFUSED) => return None,
            Some(&next) => return Some(PushdownState(next)),
        }
        let configuration = table.configurations[state.0 as usize].clone();
        let mut stacks = Vec::new();
        for &stack in configuration.iter().filter(|&&stack| stack != EMPTY) {
            let Node { top, below } = table.nodes[stack as usize];
            let Symbol::Byte(set) = self.rules.symbols[top as usize] else { continue };
            if self.rules.byte_sets[set as usize].contains(byte) {
                let moved = table.push(top + 1, below);
                settle(&self.rules, table, moved, 0, &mut stacks);
            }
        }
        let next = if stacks.is_empty() { None } else { intern(table, stacks) };
        if table.steps.len() >= MAX_REMEMBERED_STEPS {
            table.steps.clear();
        }
        table.steps.insert(key, next.unwrap_or(REFUSED));
        next.map(PushdownState)
    }

    /// Whether the bytes that led to `state` are a whole output of the grammar.
    pub fn accepts(&self, state: PushdownState) -> bool {
        self.lock().accepting[state.0 as usize]
    }

    /// Whether `text` as a whole is an output of the grammar.
    pub fn matches(&self, text: &[u8]) -> bool {
        text.iter().try_fold(self.start, |s, &b| self.step(s, b)).is_some_and(|s| self.accepts(s))
    }

    /// How many configurations the grammar has interned (they grow with nesting, not length).
    pub fn configurations(&self) -> usize {
        self.lock().configurations.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        // A panic while holding the lock leaves a table that is still consistent.
        self.table.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Brings `stack` (whose top may be any position) to stacks whose tops are byte sets, or to
/// the empty stack, into `out`; `entered` counts the rules entered on the way without a byte
/// read (a chain of rules that each start with the next).
fn settle(rules: &Rules, table: &mut Table, mut stack: u32, entered: usize, out: &mut Vec<u32>) {
    loop {
        if stack == EMPTY {
            out.push(stack);
            return;
        }
        let Node { top, below } = table.nodes[stack as usize];
        match rules.symbols[top as usize] {
            Symbol::Byte(_) => {
                out.push(stack);
                return;
            }
            Symbol::End => stack = below,
            Symbol::Rule(rule) => {
                // The continuation goes under the rule, unless nothing follows it (a tail
                // call: `h ::= x h` repeats without growing the stack).
                let continuation = match rules.symbols[top as usize + 1] {
                    Symbol::End => below,
                    _ => table.push(top + 1, below),
                };
                expand(rules, table, continuation, rule, entered + 1, out);
                return;
            }
        }
    }
}

/// Enters `rule` on top of `below` (which already holds the continuation after it): each
/// alternative starts a stack of its own.
fn expand(rules: &Rules, table: &mut Table, below: u32, rule: u32, entered: usize, out: &mut Vec<u32>) {
    if table.depth(below) >= MAX_STACK_DEPTH || entered >= MAX_STACK_DEPTH || out.len() > MAX_STACKS {
        return; // too deep or too ambiguous: this parse is dropped
    }
    for &alternative in &rules.alternatives[rule as usize] {
        let stack = table.push(alternative, below);
        settle(rules, table, stack, entered, out);
    }
}

/// The id of the configuration of `stacks`, interned now or found; `None` where the table or
/// the configuration is full.
fn intern(table: &mut Table, mut stacks: Vec<u32>) -> Option<u32> {
    stacks.sort_unstable();
    stacks.dedup();
    if stacks.len() > MAX_STACKS {
        return None;
    }
    let configuration: Configuration = stacks.into();
    if let Some(&id) = table.ids.get(&configuration) {
        return Some(id);
    }
    if table.configurations.len() >= MAX_CONFIGURATIONS {
        return None;
    }
    let id = table.configurations.len() as u32;
    table.accepting.push(configuration.contains(&EMPTY));
    table.configurations.push(configuration.clone());
    table.ids.insert(configuration, id);
    Some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grammar(text: &str) -> PushdownGrammar {
        PushdownGrammar::new(text).expect("the grammar compiles")
    }

    /// vLLM's documentation example for `grammar` (xgrammar's EBNF).
    const SQL: &str = r#"
        root ::= select_statement
        select_statement ::= "SELECT " column " from " table " where " condition
        column ::= "col_1 " | "col_2 "
        table ::= "table_1 " | "table_2 "
        condition ::= column "= " number
        number ::= "1 " | "2 "
    "#;

    #[test]
    fn the_sql_example_accepts_its_sentences_and_nothing_else() {
        let g = grammar(SQL);
        assert!(g.matches(b"SELECT col_1  from table_2  where col_2 = 1 "));
        assert!(!g.matches(b"SELECT col_3  from table_2  where col_2 = 1 "));
        assert!(!g.matches(b"SELECT col_1  from table_2  where col_2 = 1"), "a prefix is not whole");
        assert!(!g.matches(b"SELECT col_1  from table_2  where col_2 = 1 ;"));
    }

    #[test]
    fn nesting_is_recognised_to_any_depth_a_regex_cannot_count() {
        let g = grammar(
            r#"root ::= expr
               expr ::= term (("+" | "-") term)*
               term ::= factor ("*" factor)*
               factor ::= [0-9]+ | "(" expr ")""#,
        );
        assert!(g.matches(b"1+2*3"));
        assert!(g.matches(b"((1+2)*(3-4))*5"));
        let deep = format!("{}7{}", "(".repeat(100), ")".repeat(100));
        assert!(g.matches(deep.as_bytes()));
        assert!(!g.matches(b"(1+2"), "an open parenthesis must close");
        assert!(!g.matches(b"(1+2))"), "and close only what opened");
        assert!(!g.matches(b"1+*2"));
    }

    #[test]
    fn repetitions_keep_their_bounds() {
        let g = grammar(r#"root ::= "a"{2,3} "b"{2} "c"{1,} "d"{,1} "e"?"#);
        assert!(g.matches(b"aabbc"));
        assert!(g.matches(b"aaabbcccde"));
        assert!(!g.matches(b"abbc"), "at least two a");
        assert!(!g.matches(b"aaaabbc"), "at most three a");
        assert!(!g.matches(b"aabc"), "exactly two b");
        assert!(!g.matches(b"aabb"), "at least one c");
        assert!(!g.matches(b"aabbcdd"), "at most one d");
    }

    #[test]
    fn classes_match_whole_utf8_characters() {
        let g = grammar(r#"root ::= "\"" [^"\\]* "\"" | [α-ω]+ | ."#);
        assert!(g.matches("\"héllo wörld ✓\"".as_bytes()));
        assert!(!g.matches(b"\"a\\\""), "a backslash is outside the class");
        assert!(g.matches("λόγος".replace('ό', "ο").as_bytes()));
        assert!(g.matches("✓".as_bytes()), "`.` is one whole character");
        assert!(!g.matches(&"✓".as_bytes()[..2]), "half a character is not one");
        assert!(!g.matches("ab".as_bytes()), "`.` is one character, not two");
    }

    #[test]
    fn a_long_repetition_keeps_the_stack_flat_and_the_table_small() {
        let g = grammar(
            r#"root ::= item ("," item)*
                           item ::= [a-z]+"#,
        );
        let text = vec!["abc"; 5000].join(",");
        assert!(g.matches(text.as_bytes()));
        assert!(g.configurations() < 10, "{} configurations for a flat list", g.configurations());
    }

    #[test]
    fn ambiguous_grammars_keep_every_parse_until_the_bytes_decide() {
        // Both alternatives start alike; only the last byte tells them apart.
        let g = grammar(
            r#"root ::= "ab" x | "a" y
                           x ::= "c"
                           y ::= "bd""#,
        );
        assert!(g.matches(b"abc"));
        assert!(g.matches(b"abd"));
        assert!(!g.matches(b"abe"));
        let after_ab = g.step(g.step(g.start(), b'a').unwrap(), b'b').unwrap();
        assert!(!g.accepts(after_ab));
        assert!(g.step(after_ab, b'c').is_some_and(|s| g.accepts(s)));
    }

    #[test]
    fn oversized_grammars_are_refused_without_exhausting_the_stack_or_the_clock() {
        // `r0 ::= r1 | "x"`, `r1 ::= r2 | "x"`, ... `r{n} ::= "y"`: each rule starts with the next.
        let chain = |n: usize, alternative: &str| {
            let mut text = String::from("root ::= r0\n");
            (0..n).for_each(|i| text.push_str(&format!("r{i}::=r{}{alternative}\n", i + 1)));
            text + &format!("r{n} ::= \"y\"\n")
        };
        let error = |text: &str| PushdownGrammar::new(text).err().map(|e| e.0).expect("refused");
        assert!(grammar(&chain(500, " | \"x\"")).matches(b"y"), "a long chain of rules runs");
        assert!(error(&chain(3000, "")).contains("enters more than 1024 rules"));
        assert!(error(&chain(8500, "")).contains("defines 8502 rules; at most 8192"));
        let nested = format!("root ::= {}\"a\"{}", "(".repeat(200), ")".repeat(200));
        assert!(error(&nested).contains("groups nest deeper than 128"));
        let long = format!("root ::= \"{}\"", "a".repeat(200_000));
        assert!(error(&long).contains("at most 131072"));
        let helpers = format!("root ::= {}", "[a-z]{0,1000} ".repeat(10));
        assert!(error(&helpers).contains("more than 8192 rules"));
    }

    #[test]
    fn nesting_past_the_depth_limit_ends_the_way_on() {
        let g = grammar(r#"root ::= "(" root ")" | "x""#);
        let mut state = g.start();
        let mut depth = 0;
        while let Some(next) = g.step(state, b'(') {
            (state, depth) = (next, depth + 1);
            assert!(depth < 2 * MAX_STACK_DEPTH, "the depth is bounded");
        }
        assert!(depth >= MAX_STACK_DEPTH - 2, "refused only at the limit ({depth} levels), not a panic");
        assert!(g.step(state, b'x').is_some(), "the output can still close what is open");
    }
}
