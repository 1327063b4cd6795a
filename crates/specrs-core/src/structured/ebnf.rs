//! Context-free grammars in the EBNF that vLLM's `grammar` and llama.cpp's GBNF take
//! (`root ::= "SELECT " column (", " column)*`), parsed and lowered to byte-level rules for
//! [`super::pushdown`].
//!
//! Syntax: rules `name ::= alternatives` (rule boundaries are found by the next `name ::=`, so
//! a rule may span lines and an alternative may start a line with `|`); double-quoted
//! literals; character classes `[a-z]`, `[^"\\]`; `.` for any character; rule references;
//! groups `( ... )`; `*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}`; `#` comments. Escapes: `\n \r \t
//! \\ \" \' \[ \] \- \^ \/ \xHH \uHHHH \UHHHHHHHH`. The grammar starts at `root`.
//!
//! Lowering: every terminal becomes a sequence of byte sets (a literal's UTF-8 bytes; a
//! character class's UTF-8 sequences, as alternatives of a helper rule), groups and
//! repetitions become helper rules (`x*` is `h ::= x h | ""`, right-recursive so the
//! recogniser's stack stays flat). Grammars the recogniser cannot run are refused here, by
//! name: undefined or duplicate rules, left recursion (it would expand forever), rules that
//! can never finish, classes that match nothing. Grammars without `::=` are read as Lark
//! ([`super::lark`]) and lowered the same way.

use std::collections::HashMap;

use regex_syntax::hir::{ClassUnicode, ClassUnicodeRange};
use regex_syntax::utf8::Utf8Sequences;

/// The rule a grammar starts at.
pub const ROOT_RULE: &str = "root";

/// Largest bound a repetition `{m,n}` may name (each repeat is a rule element).
pub const MAX_REPEAT: u32 = 1024;

/// Longest grammar text, in characters.
pub const MAX_GRAMMAR_CHARS: usize = 1 << 17;

/// Most rules a grammar lowers to (its own and the helpers of its groups, repetitions and
/// classes): the checks run over every rule until nothing changes.
pub const MAX_RULES: usize = 8192;

/// Deepest nesting of groups in the grammar's text.
pub const MAX_GROUP_DEPTH: usize = 128;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct EbnfError(pub String);

/// One element of a lowered alternative.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Symbol {
    /// One byte from the set at this index of [`Rules::byte_sets`].
    Byte(u32),
    /// The rule at this index.
    Rule(u32),
    /// The alternative is over.
    End,
}

/// A 256-bit set of bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ByteSet([u64; 4]);

impl ByteSet {
    pub fn range(lo: u8, hi: u8) -> Self {
        let mut set = Self::default();
        (lo..=hi).for_each(|b| set.0[b as usize / 64] |= 1 << (b % 64));
        set
    }

    pub fn contains(&self, byte: u8) -> bool {
        self.0[byte as usize / 64] & (1 << (byte % 64)) != 0
    }

    fn union(mut self, other: ByteSet) -> Self {
        self.0.iter_mut().zip(other.0).for_each(|(a, b)| *a |= b);
        self
    }
}

/// A grammar lowered to byte-level rules: every alternative is a run of [`Symbol`]s in
/// `symbols` closed by [`Symbol::End`], named by the index of its first symbol.
#[derive(Debug)]
pub struct Rules {
    pub symbols: Vec<Symbol>,
    /// Each rule's alternatives (indices into `symbols`).
    pub alternatives: Vec<Vec<u32>>,
    pub byte_sets: Vec<ByteSet>,
    pub root: u32,
    /// Each rule's name for messages; a helper rule (a group, repetition or class) has the
    /// name of the rule it serves.
    pub names: Vec<String>,
    pub is_helper: Vec<bool>,
}

impl Rules {
    /// Parses and lowers `text` (EBNF where it defines a rule with `::=`, Lark otherwise),
    /// refusing what the recogniser cannot run.
    pub fn parse(text: &str) -> Result<Self, EbnfError> {
        let (definitions, root) = definitions(text)?;
        Self::lower(&definitions, root)
    }

    /// Lowers parsed (or generated) definitions, starting at the rule named `root`, refusing
    /// what the recogniser cannot run.
    pub(super) fn lower(definitions: &[Definition], root: &str) -> Result<Self, EbnfError> {
        let rules = Lowering::run(definitions, root)?;
        rules.check()?;
        Ok(rules)
    }

    /// Which rules can match the empty text.
    fn nullable(&self) -> Vec<bool> {
        let mut nullable = vec![false; self.alternatives.len()];
        let mut changed = true;
        while changed {
            changed = false;
            for rule in 0..self.alternatives.len() {
                if !nullable[rule]
                    && self.alternatives[rule].iter().any(|&a| self.run(a).all(|s| is_nullable(s, &nullable)))
                {
                    nullable[rule] = true;
                    changed = true;
                }
            }
        }
        nullable
    }

    /// The symbols of the alternative starting at `start`, without its end.
    fn run(&self, start: u32) -> impl Iterator<Item = Symbol> + '_ {
        self.symbols[start as usize..].iter().copied().take_while(|&s| s != Symbol::End)
    }

    fn check(&self) -> Result<(), EbnfError> {
        // Productive rules: those that can finish on some text.
        let mut productive = vec![false; self.alternatives.len()];
        let mut changed = true;
        while changed {
            changed = false;
            for rule in 0..self.alternatives.len() {
                let finishes = |&a: &u32| {
                    self.run(a).all(|s| match s {
                        Symbol::Rule(r) => productive[r as usize],
                        _ => true,
                    })
                };
                if !productive[rule] && self.alternatives[rule].iter().any(finishes) {
                    productive[rule] = true;
                    changed = true;
                }
            }
        }
        if let Some(rule) = (0..self.alternatives.len()).find(|&r| !productive[r]) {
            return Err(EbnfError(format!(
                "rule `{}` can never finish: each of its alternatives needs the rule itself again; give it an \
                 alternative that ends",
                self.names[rule]
            )));
        }
        // Left recursion: a rule that can reach itself before reading a byte.
        let nullable = self.nullable();
        let left_corners: Vec<Vec<u32>> = (0..self.alternatives.len())
            .map(|rule| {
                let mut corners = Vec::new();
                for &a in &self.alternatives[rule] {
                    for symbol in self.run(a) {
                        if let Symbol::Rule(r) = symbol {
                            corners.push(r);
                        }
                        if !is_nullable(symbol, &nullable) {
                            break;
                        }
                    }
                }
                corners
            })
            .collect();
        let mut visiting = vec![0u8; self.alternatives.len()]; // 0 new, 1 on the path, 2 done
        for rule in 0..self.alternatives.len() as u32 {
            let mut path = Vec::new();
            if let Some(cycle) = find_cycle(rule, &left_corners, &mut visiting, &mut path) {
                let mut named: Vec<&str> = cycle
                    .iter()
                    .filter(|&&r| !self.is_helper[r as usize])
                    .map(|&r| self.names[r as usize].as_str())
                    .collect();
                if named.is_empty() {
                    return Err(EbnfError(format!(
                        "a repetition in rule `{}` repeats something that can match nothing, so it could \
                         repeat forever; make what it repeats match at least one character",
                        self.names[cycle[0] as usize]
                    )));
                }
                named.dedup();
                return Err(EbnfError(format!(
                    "rule `{}` is left-recursive ({}); rewrite it with a repetition, e.g. `expr ::= term (\"+\" term)*` \
                     instead of `expr ::= expr \"+\" term | term`",
                    named[0],
                    named.join(" -> ")
                )));
            }
        }
        Ok(())
    }
}

/// The definitions of a grammar's text (EBNF where it defines a rule with `::=`, Lark
/// otherwise) and the name of the rule it starts at.
pub(super) fn definitions(text: &str) -> Result<(Vec<Definition>, &'static str), EbnfError> {
    let length = text.chars().count();
    if length > MAX_GRAMMAR_CHARS {
        return Err(EbnfError(format!(
            "the grammar is {length} characters long; at most {MAX_GRAMMAR_CHARS} are taken"
        )));
    }
    if defines_with_walrus(text) {
        Ok((Parser::new(text).grammar()?, ROOT_RULE))
    } else {
        Ok((Parser::new(text).lark()?, super::lark::START_RULE))
    }
}

/// Whether some line of `text` starts an EBNF definition (`name ::=`): EBNF, not Lark (a
/// Lark literal may hold `::=` without making the grammar EBNF).
fn defines_with_walrus(text: &str) -> bool {
    text.lines().any(|line| {
        let line = line.trim_start();
        let name_end = line.find(|c: char| !Parser::is_name_char(c)).unwrap_or(line.len());
        name_end > 0 && line[name_end..].trim_start().starts_with("::=")
    })
}

fn is_nullable(symbol: Symbol, nullable: &[bool]) -> bool {
    match symbol {
        Symbol::Rule(r) => nullable[r as usize],
        Symbol::Byte(_) => false,
        Symbol::End => true,
    }
}

/// A cycle through `rule` in the left-corner graph, as the rules along it (first repeated
/// last). Depth-first without recursion: a grammar may chain thousands of rules.
fn find_cycle(rule: u32, edges: &[Vec<u32>], visiting: &mut [u8], path: &mut Vec<u32>) -> Option<Vec<u32>> {
    if visiting[rule as usize] != 0 {
        return None;
    }
    // (rule, index of its next edge to follow)
    let mut frames = vec![(rule, 0usize)];
    visiting[rule as usize] = 1;
    path.push(rule);
    while let Some(&mut (current, ref mut next_edge)) = frames.last_mut() {
        let Some(&next) = edges[current as usize].get(*next_edge) else {
            frames.pop();
            path.pop();
            visiting[current as usize] = 2;
            continue;
        };
        *next_edge += 1;
        match visiting[next as usize] {
            0 => {
                visiting[next as usize] = 1;
                path.push(next);
                frames.push((next, 0));
            }
            1 => {
                let from = path.iter().position(|&r| r == next).unwrap_or(0);
                let mut cycle = path[from..].to_vec();
                cycle.push(next);
                return Some(cycle);
            }
            _ => {}
        }
    }
    None
}

/// A parsed right-hand side.
#[derive(Debug, Clone)]
pub(super) enum Expr {
    /// A literal's text (empty: the empty string).
    Literal(String),
    Class(ClassUnicode),
    Reference {
        name: String,
        at: Position,
    },
    /// Alternatives of sequences.
    Choice(Vec<Vec<Expr>>),
    Repeat {
        item: Box<Expr>,
        min: u32,
        max: Option<u32>,
    },
    /// One lexical token written as an expression (a Lark regex): Lark's `%ignore` may come
    /// before it, never inside it.
    Token(Box<Expr>),
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Position {
    line: usize,
    column: usize,
}

impl Position {
    /// Where a generated definition (one no text was parsed for) stands.
    pub(super) fn generated() -> Self {
        Self { line: 0, column: 0 }
    }
}

impl std::fmt::Display for Position {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}, column {}", self.line, self.column)
    }
}

pub(super) struct Definition {
    pub name: String,
    pub at: Position,
    pub body: Expr,
}

/// Recursive descent over the grammar's text (EBNF here, Lark in [`super::lark`]).
pub(super) struct Parser {
    pub chars: Vec<char>,
    pub at: usize,
    /// Where each line starts, for positions in messages.
    line_starts: Vec<usize>,
    /// Groups open around the parser.
    pub depth: usize,
}

impl Parser {
    pub(super) fn new(text: &str) -> Self {
        let chars: Vec<char> = text.chars().collect();
        let line_starts = std::iter::once(0)
            .chain(chars.iter().enumerate().filter(|&(_, &c)| c == '\n').map(|(i, _)| i + 1))
            .collect();
        Self { chars, at: 0, line_starts, depth: 0 }
    }

    pub(super) fn position(&self) -> Position {
        let line = self.line_starts.partition_point(|&start| start <= self.at);
        Position { line, column: self.at - self.line_starts[line - 1] + 1 }
    }

    /// Enters a group, refusing nesting deeper than [`MAX_GROUP_DEPTH`].
    pub(super) fn open_group(&mut self) -> Result<(), EbnfError> {
        self.depth += 1;
        if self.depth > MAX_GROUP_DEPTH {
            return self.error(format_args!("groups nest deeper than {MAX_GROUP_DEPTH}"));
        }
        Ok(())
    }

    pub(super) fn error<T>(&self, message: impl std::fmt::Display) -> Result<T, EbnfError> {
        Err(EbnfError(format!("{message} at {}", self.position())))
    }

    pub(super) fn peek(&self) -> Option<char> {
        self.chars.get(self.at).copied()
    }

    fn skip_space(&mut self) {
        while let Some(c) = self.peek() {
            if c.is_whitespace() {
                self.at += 1;
            } else if c == '#' {
                while self.peek().is_some_and(|c| c != '\n') {
                    self.at += 1;
                }
            } else {
                break;
            }
        }
    }

    fn is_name_char(c: char) -> bool {
        c.is_ascii_alphanumeric() || c == '_' || c == '-'
    }

    fn name(&mut self) -> Option<String> {
        let start = self.at;
        while self.peek().is_some_and(Self::is_name_char) {
            self.at += 1;
        }
        (self.at > start).then(|| self.chars[start..self.at].iter().collect())
    }

    /// Whether a rule definition (`name ::=`) starts here.
    fn at_definition(&mut self) -> bool {
        let start = self.at;
        let found = self.name().is_some() && {
            self.skip_space();
            self.chars[self.at..].starts_with(&[':', ':', '='])
        };
        self.at = start;
        found
    }

    fn grammar(&mut self) -> Result<Vec<Definition>, EbnfError> {
        let mut definitions = Vec::new();
        self.skip_space();
        while self.peek().is_some() {
            let at = self.position();
            let Some(name) = self.name() else {
                return self.error("expected a rule name (`name ::= ...`)");
            };
            self.skip_space();
            if !self.chars[self.at..].starts_with(&[':', ':', '=']) {
                return self.error(format_args!("expected `::=` after rule name `{name}`"));
            }
            self.at += 3;
            let body = self.choice(false)?;
            definitions.push(Definition { name, at, body });
        }
        if definitions.is_empty() {
            return Err(EbnfError("the grammar is empty; it needs at least `root ::= ...`".into()));
        }
        Ok(definitions)
    }

    /// Alternatives up to the next definition (top level) or the closing parenthesis.
    fn choice(&mut self, nested: bool) -> Result<Expr, EbnfError> {
        let mut alternatives = vec![self.sequence(nested)?];
        while self.peek() == Some('|') {
            self.at += 1;
            alternatives.push(self.sequence(nested)?);
        }
        Ok(Expr::Choice(alternatives))
    }

    fn sequence(&mut self, nested: bool) -> Result<Vec<Expr>, EbnfError> {
        let mut items = Vec::new();
        loop {
            self.skip_space();
            match self.peek() {
                None | Some('|') => return Ok(items),
                Some(')') if nested => return Ok(items),
                _ if !nested && self.at_definition() => return Ok(items),
                _ => {}
            }
            let item = self.primary()?;
            items.push(self.postfix(item)?);
        }
    }

    fn primary(&mut self) -> Result<Expr, EbnfError> {
        let at = self.position();
        match self.peek() {
            Some('"') => Ok(Expr::Literal(self.quoted('"')?)),
            Some('[') => self.class(),
            Some('.') => {
                self.at += 1;
                Ok(Expr::Class(ClassUnicode::new([ClassUnicodeRange::new('\0', char::MAX)])))
            }
            Some('(') => {
                self.at += 1;
                self.open_group()?;
                let inner = self.choice(true)?;
                self.depth -= 1;
                if self.peek() != Some(')') {
                    return self.error("expected `)`");
                }
                self.at += 1;
                Ok(inner)
            }
            Some(c) if Self::is_name_char(c) => {
                let name = self.name().expect("a name character starts a name");
                Ok(Expr::Reference { name, at })
            }
            Some(c) => self.error(format_args!("unexpected `{c}`")),
            None => self.error("unexpected end of the grammar"),
        }
    }

    fn class(&mut self) -> Result<Expr, EbnfError> {
        self.at += 1; // `[`
        let negated = self.peek() == Some('^');
        if negated {
            self.at += 1;
        }
        let mut ranges = Vec::new();
        loop {
            let lo = match self.peek() {
                None => return self.error("unterminated character class"),
                Some(']') => break,
                Some('\\') => self.escape()?,
                Some(c) => {
                    self.at += 1;
                    c
                }
            };
            let mut hi = lo;
            if self.peek() == Some('-') && self.chars.get(self.at + 1).is_some_and(|&c| c != ']') {
                self.at += 1;
                hi = match self.peek() {
                    Some('\\') => self.escape()?,
                    Some(c) => {
                        self.at += 1;
                        c
                    }
                    None => return self.error("unterminated character class"),
                };
                if hi < lo {
                    return self.error(format_args!("the class range `{lo}-{hi}` is reversed"));
                }
            }
            ranges.push(ClassUnicodeRange::new(lo, hi));
        }
        self.at += 1; // `]`
        let mut class = ClassUnicode::new(ranges);
        if negated {
            class.negate();
        }
        if class.ranges().is_empty() {
            return self.error("the character class matches no character");
        }
        Ok(Expr::Class(class))
    }

    /// A quoted literal's text (the parser is on its opening `quote`).
    pub(super) fn quoted(&mut self, quote: char) -> Result<String, EbnfError> {
        self.at += 1;
        let mut text = String::new();
        loop {
            match self.peek() {
                None => return self.error("unterminated string literal"),
                Some(c) if c == quote => break,
                Some('\\') => text.push(self.escape()?),
                Some(c) => {
                    self.at += 1;
                    text.push(c);
                }
            }
        }
        self.at += 1;
        Ok(text)
    }

    /// An escape after `\` (the parser is on the backslash).
    pub(super) fn escape(&mut self) -> Result<char, EbnfError> {
        self.at += 1;
        let Some(c) = self.peek() else { return self.error("unterminated escape") };
        self.at += 1;
        let hex_digits = match c {
            'n' => return Ok('\n'),
            'r' => return Ok('\r'),
            't' => return Ok('\t'),
            '\\' | '"' | '\'' | '[' | ']' | '-' | '^' | '/' => return Ok(c),
            'x' => 2,
            'u' => 4,
            'U' => 8,
            other => return self.error(format_args!("unknown escape `\\{other}`")),
        };
        let digits: String = self.chars.get(self.at..self.at + hex_digits).unwrap_or_default().iter().collect();
        let value = u32::from_str_radix(&digits, 16).ok().filter(|_| digits.len() == hex_digits);
        match value.and_then(char::from_u32) {
            Some(ch) => {
                self.at += hex_digits;
                Ok(ch)
            }
            None => self.error(format_args!("`\\{c}` needs {hex_digits} hex digits of a valid character")),
        }
    }

    fn postfix(&mut self, mut item: Expr) -> Result<Expr, EbnfError> {
        loop {
            item = match self.peek() {
                Some('{') => {
                    self.at += 1;
                    self.bounded(item)?
                }
                _ => match self.repetition_operator() {
                    Some((min, max)) => Expr::Repeat { item: Box::new(item), min, max },
                    None => return Ok(item),
                },
            };
        }
    }

    /// The bounds of the `*`, `+` or `?` here (both syntaxes have them), read past; `None`
    /// where none is.
    pub(super) fn repetition_operator(&mut self) -> Option<(u32, Option<u32>)> {
        let bounds = match self.peek() {
            Some('*') => (0, None),
            Some('+') => (1, None),
            Some('?') => (0, Some(1)),
            _ => return None,
        };
        self.at += 1;
        Some(bounds)
    }

    /// `item{...}`: the bounds `m}`, `m,}`, `m,n}` or `,n}` after `{`.
    fn bounded(&mut self, item: Expr) -> Result<Expr, EbnfError> {
        let (min, max) = self.bounds()?;
        Ok(Expr::Repeat { item: Box::new(item), min, max })
    }

    /// The bounds after `{`; leaves the parser after `}`.
    fn bounds(&mut self) -> Result<(u32, Option<u32>), EbnfError> {
        let number = |p: &mut Self| -> Result<Option<u32>, EbnfError> {
            p.skip_space();
            let start = p.at;
            while p.peek().is_some_and(|c| c.is_ascii_digit()) {
                p.at += 1;
            }
            if p.at == start {
                return Ok(None);
            }
            let digits: String = p.chars[start..p.at].iter().collect();
            match digits.parse::<u32>() {
                Ok(n) if n <= MAX_REPEAT => Ok(Some(n)),
                _ => p.error(format_args!("repetition bounds are at most {MAX_REPEAT}")),
            }
        };
        let min = number(self)?;
        self.skip_space();
        let bounds = if self.peek() == Some(',') {
            self.at += 1;
            let max = number(self)?;
            (min.unwrap_or(0), max)
        } else {
            match min {
                Some(n) => (n, Some(n)),
                None => return self.error("expected a number in `{m,n}`"),
            }
        };
        self.skip_space();
        if self.peek() != Some('}') {
            return self.error("expected `}` closing the repetition");
        }
        self.at += 1;
        if let (min, Some(max)) = bounds
            && max < min
        {
            return self.error(format_args!("the repetition `{{{min},{max}}}` has its bounds reversed"));
        }
        Ok(bounds)
    }
}

/// Definitions to byte-level rules.
struct Lowering {
    rules: Rules,
    by_name: HashMap<String, u32>,
    /// Helper rules of character classes already lowered, by their ranges.
    classes: HashMap<Vec<(char, char)>, u32>,
}

impl Lowering {
    fn run(definitions: &[Definition], root_name: &str) -> Result<Rules, EbnfError> {
        if definitions.len() > MAX_RULES {
            return Err(EbnfError(format!(
                "the grammar defines {} rules; at most {MAX_RULES} are taken",
                definitions.len()
            )));
        }
        let mut by_name = HashMap::new();
        let mut names = Vec::new();
        for definition in definitions {
            if by_name.insert(definition.name.clone(), names.len() as u32).is_some() {
                return Err(EbnfError(format!(
                    "rule `{}` is defined twice (again at {}); join its alternatives with `|`",
                    definition.name, definition.at
                )));
            }
            names.push(definition.name.clone());
        }
        let Some(&root) = by_name.get(root_name) else {
            return Err(EbnfError(format!("the grammar has no `{root_name}` rule, where the output starts")));
        };
        let rule_count = names.len();
        let mut lowering = Lowering {
            rules: Rules {
                symbols: Vec::new(),
                alternatives: vec![Vec::new(); rule_count],
                byte_sets: Vec::new(),
                root,
                is_helper: vec![false; names.len()],
                names,
            },
            by_name,
            classes: HashMap::new(),
        };
        for (rule, definition) in definitions.iter().enumerate() {
            let alternatives = lowering.alternatives(&definition.body, &definition.name)?;
            lowering.rules.alternatives[rule] = alternatives;
        }
        Ok(lowering.rules)
    }

    /// The alternatives of `expr` as a rule's (a choice lists its own; anything else is one).
    fn alternatives(&mut self, expr: &Expr, owner: &str) -> Result<Vec<u32>, EbnfError> {
        match expr {
            Expr::Choice(alternatives) => alternatives.iter().map(|sequence| self.sequence(sequence, owner)).collect(),
            other => Ok(vec![self.sequence(std::slice::from_ref(other), owner)?]),
        }
    }

    /// Lowers a sequence into `symbols`, returning where it starts. Items are lowered first
    /// (their helper rules append their own runs), then this run is written in one piece.
    fn sequence(&mut self, items: &[Expr], owner: &str) -> Result<u32, EbnfError> {
        let mut run = Vec::new();
        for item in items {
            self.item(item, owner, &mut run)?;
        }
        let start = self.rules.symbols.len() as u32;
        self.rules.symbols.extend(run);
        self.rules.symbols.push(Symbol::End);
        Ok(start)
    }

    fn item(&mut self, item: &Expr, owner: &str, run: &mut Vec<Symbol>) -> Result<(), EbnfError> {
        match item {
            Expr::Literal(text) => {
                for byte in text.bytes() {
                    run.push(self.byte_set(ByteSet::range(byte, byte)));
                }
            }
            Expr::Class(class) => run.push(self.class(class, owner)?),
            Expr::Reference { name, at } => match self.by_name.get(name) {
                Some(&rule) => run.push(Symbol::Rule(rule)),
                None => {
                    return Err(EbnfError(format!("rule `{name}` is used at {at} (in `{owner}`) but never defined")));
                }
            },
            Expr::Token(inner) => self.item(inner, owner, run)?,
            Expr::Choice(alternatives) if alternatives.len() == 1 => {
                for inner in &alternatives[0] {
                    self.item(inner, owner, run)?;
                }
            }
            Expr::Choice(_) => {
                let helper = self.helper(owner)?;
                let alternatives = self.alternatives(item, owner)?;
                self.rules.alternatives[helper as usize] = alternatives;
                run.push(Symbol::Rule(helper));
            }
            Expr::Repeat { item: inner, min, max } => {
                // The item once, as a rule, so each repeat is a single symbol.
                let once = self.helper(owner)?;
                let alternatives = self.alternatives(inner, owner)?;
                self.rules.alternatives[once as usize] = alternatives;
                run.extend(std::iter::repeat_n(Symbol::Rule(once), *min as usize));
                match max {
                    // `h ::= x h | ""`: any number more, the stack kept flat by the tail call.
                    None => {
                        let more = self.helper(owner)?;
                        let again = self.write_run(&[Symbol::Rule(once), Symbol::Rule(more)]);
                        let stop = self.write_run(&[]);
                        self.rules.alternatives[more as usize] = vec![again, stop];
                        run.push(Symbol::Rule(more));
                    }
                    // Up to `max - min` more, nested (`h_k ::= x h_{k-1} | ""`) so each count
                    // has one parse.
                    Some(max) => {
                        let mut tail: Option<u32> = None;
                        for _ in *min..*max {
                            let level = self.helper(owner)?;
                            let mut symbols = vec![Symbol::Rule(once)];
                            symbols.extend(tail.map(Symbol::Rule));
                            let again = self.write_run(&symbols);
                            let stop = self.write_run(&[]);
                            self.rules.alternatives[level as usize] = vec![again, stop];
                            tail = Some(level);
                        }
                        run.extend(tail.map(Symbol::Rule));
                    }
                }
            }
        }
        Ok(())
    }

    fn write_run(&mut self, symbols: &[Symbol]) -> u32 {
        let start = self.rules.symbols.len() as u32;
        self.rules.symbols.extend_from_slice(symbols);
        self.rules.symbols.push(Symbol::End);
        start
    }

    /// A new rule serving `owner` (a group, a repetition, a class).
    fn helper(&mut self, owner: &str) -> Result<u32, EbnfError> {
        if self.rules.alternatives.len() >= MAX_RULES {
            return Err(EbnfError(format!(
                "the grammar lowers to more than {MAX_RULES} rules (each group, repetition bound and character \
                 class adds some); make it smaller"
            )));
        }
        let rule = self.rules.alternatives.len() as u32;
        self.rules.alternatives.push(Vec::new());
        self.rules.names.push(owner.to_string());
        self.rules.is_helper.push(true);
        Ok(rule)
    }

    fn byte_set(&mut self, set: ByteSet) -> Symbol {
        let index = match self.rules.byte_sets.iter().position(|s| *s == set) {
            Some(i) => i,
            None => {
                self.rules.byte_sets.push(set);
                self.rules.byte_sets.len() - 1
            }
        };
        Symbol::Byte(index as u32)
    }

    /// A character class: one byte set where every character is one byte, otherwise a helper
    /// rule whose alternatives are the class's UTF-8 byte sequences.
    fn class(&mut self, class: &ClassUnicode, owner: &str) -> Result<Symbol, EbnfError> {
        let key: Vec<(char, char)> = class.ranges().iter().map(|r| (r.start(), r.end())).collect();
        if let Some(&rule) = self.classes.get(&key) {
            return Ok(Symbol::Rule(rule));
        }
        let mut single = ByteSet::default();
        let mut sequences: Vec<Vec<ByteSet>> = Vec::new();
        for range in class.ranges() {
            for sequence in Utf8Sequences::new(range.start(), range.end()) {
                let sets: Vec<ByteSet> = sequence.as_slice().iter().map(|r| ByteSet::range(r.start, r.end)).collect();
                match sets.as_slice() {
                    [one] => single = single.union(*one),
                    _ => sequences.push(sets),
                }
            }
        }
        if sequences.is_empty() {
            return Ok(self.byte_set(single));
        }
        let helper = self.helper(owner)?;
        let mut alternatives = Vec::new();
        if single != ByteSet::default() {
            let symbol = self.byte_set(single);
            alternatives.push(self.write_run(&[symbol]));
        }
        for sets in sequences {
            let symbols: Vec<Symbol> = sets.into_iter().map(|s| self.byte_set(s)).collect();
            alternatives.push(self.write_run(&symbols));
        }
        self.rules.alternatives[helper as usize] = alternatives;
        self.classes.insert(key, helper);
        Ok(Symbol::Rule(helper))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error_of(text: &str) -> String {
        Rules::parse(text).expect_err("the grammar is refused").0
    }

    #[test]
    fn rules_span_lines_and_alternatives_may_start_a_line() {
        let rules = Rules::parse(
            "# a comment\nroot ::= greeting \" \" name\ngreeting ::=\n  \"hi\"\n  | \"hello\" # trailing\nname ::= [a-z]+",
        )
        .unwrap();
        assert_eq!(rules.names[..3], ["root", "greeting", "name"]);
        assert_eq!(rules.alternatives[1].len(), 2, "greeting has two alternatives");
    }

    #[test]
    fn bad_grammars_are_refused_naming_what_is_wrong_and_where() {
        assert!(error_of("start ::= \"a\"").contains("no `root` rule"));
        assert!(error_of("root ::= item\n").contains("rule `item` is used at line 1, column 10"));
        assert!(error_of("root ::= \"a\"\nroot ::= \"b\"").contains("defined twice"));
        let left = error_of("root ::= expr\nexpr ::= expr \"+\" num | num\nnum ::= [0-9]+");
        assert!(left.contains("`expr` is left-recursive") && left.contains("rewrite it"), "{left}");
        let hidden = error_of("root ::= a\na ::= b? \"x\" | \"y\"\nb ::= a \"z\"");
        assert!(hidden.contains("left-recursive"), "through an optional prefix: {hidden}");
        assert!(error_of("root ::= \"(\" root \")\"").contains("can never finish"));
        assert!(
            error_of("root ::= (\"a\"?)*")
                .contains("repetition in rule `root` repeats something that can match nothing")
        );
        assert!(error_of("root ::= \"abc").contains("unterminated string literal"));
        assert!(error_of("root ::= [b-a]").contains("reversed"));
        assert!(error_of("root ::= [^\\x00-\\U0010FFFF]").contains("matches no character"));
        assert!(error_of("root ::= \"\\q\"").contains("unknown escape `\\q`"));
        assert!(error_of("root ::= \"a\"{3,1}").contains("bounds reversed"));
        assert!(error_of("root ::= \"a\"{2000}").contains("at most 1024"));
        assert!(error_of("root ::= (\"a\" | \"b\"").contains("expected `)`"));
        assert!(error_of("root ::= \"a\"\nb = \"c\"").contains("unexpected `=` at line 2, column 3"));
    }

    #[test]
    fn escapes_name_bytes_and_characters() {
        let rules = Rules::parse(r#"root ::= "\x41\u00e9\n\"""#).unwrap();
        let bytes: Vec<u8> = rules
            .run(rules.alternatives[0][0])
            .map(|s| match s {
                Symbol::Byte(i) => (0..=255u8).find(|&b| rules.byte_sets[i as usize].contains(b)).unwrap(),
                other => panic!("a literal lowers to bytes, not {other:?}"),
            })
            .collect();
        assert_eq!(bytes, "Aé\n\"".as_bytes());
    }
}
