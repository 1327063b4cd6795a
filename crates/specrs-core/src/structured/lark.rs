//! Lark grammars (vLLM's `guidance` backend, OpenAI's grammar-constrained custom tools), read
//! into the same definitions as EBNF and lowered by [`super::ebnf`]: the output is whatever
//! text `start` derives.
//!
//! Syntax: rules and terminals `name: expansions` (`?`/`!` prefixes and `.N` priorities are
//! read and ignored: they shape Lark's tree, not its language), alternatives continued on
//! lines that start with `|`, `-> alias` dropped; literals `"..."` or `'...'` (`i` for any
//! case), ranges `"a".."z"`, regexes `/.../` with flags `imsx` (no anchors or look-arounds),
//! groups `( ... )`, optional `[ ... ]`, `?`, `*`, `+`, `~ n`, `~ n..m`; `//` comments;
//! `%import common.NAME` (and `(A, B)` lists, `-> ALIAS`) for Lark's common terminals, and
//! `%ignore`: what it names may come before every token (each literal or terminal a rule
//! uses) and at the end, as Lark's lexer skips it. Templates and `%declare` are refused.

use regex_syntax::hir::{Class, Hir, HirKind};

use super::ebnf::{Definition, EbnfError, Expr, MAX_REPEAT, Parser};

/// The rule a Lark grammar starts at.
pub const START_RULE: &str = "start";

/// The rule the `%ignore`d terminals are gathered in.
const IGNORED: &str = "%ignore";

/// Lark's common terminals (`%import common.NAME`), each written as one regex.
const COMMON: &[(&str, &str)] = &[
    ("DIGIT", "[0-9]"),
    ("HEXDIGIT", "[a-fA-F0-9]"),
    ("INT", "[0-9]+"),
    ("SIGNED_INT", "[+-]?[0-9]+"),
    ("DECIMAL", r"[0-9]+\.[0-9]*|\.[0-9]+"),
    ("FLOAT", r"[0-9]+[eE][+-]?[0-9]+|(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"),
    ("SIGNED_FLOAT", r"[+-]?(?:[0-9]+[eE][+-]?[0-9]+|(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)"),
    ("NUMBER", r"[0-9]+(?:[eE][+-]?[0-9]+)?|(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"),
    ("SIGNED_NUMBER", r"[+-]?(?:[0-9]+(?:[eE][+-]?[0-9]+)?|(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)"),
    ("ESCAPED_STRING", r#""(?:[^"\\\n]|\\.)*""#),
    ("LCASE_LETTER", "[a-z]"),
    ("UCASE_LETTER", "[A-Z]"),
    ("LETTER", "[A-Za-z]"),
    ("WORD", "[A-Za-z]+"),
    ("CNAME", "[_A-Za-z][_A-Za-z0-9]*"),
    ("WS_INLINE", "[ \t]+"),
    ("WS", "[ \t\x0c\r\n]+"),
    ("CR", "\r"),
    ("LF", "\n"),
    ("NEWLINE", "(?:\r?\n)+"),
    ("SH_COMMENT", "#[^\n]*"),
    ("CPP_COMMENT", "//[^\n]*"),
    ("C_COMMENT", r"/\*(?:[^*]|\*+[^*/])*\*+/"),
    ("SQL_COMMENT", "--[^\n]*"),
];

/// A terminal's name: upper case (after any leading underscores).
fn is_terminal(name: &str) -> bool {
    name.trim_start_matches('_').starts_with(|c: char| c.is_ascii_uppercase())
}

impl Parser {
    /// The definitions of a Lark grammar, `%import`ed terminals and `%ignore` included.
    pub(super) fn lark(&mut self) -> Result<Vec<Definition>, EbnfError> {
        let mut definitions = Vec::new();
        let mut ignored = Vec::new();
        loop {
            self.skip_lark_space(true);
            let Some(c) = self.peek() else { break };
            let at = self.position();
            if c == '%' {
                self.directive(&mut definitions, &mut ignored)?;
                continue;
            }
            if matches!(c, '?' | '!') {
                self.at += 1;
            }
            let Some(name) = self.lark_name() else {
                return self.error("expected a rule or terminal name (`name: ...`)");
            };
            if self.peek() == Some('.') {
                self.at += 1;
                while self.peek().is_some_and(|c| c.is_ascii_digit() || c == '-') {
                    self.at += 1;
                }
            }
            if self.peek() == Some('{') {
                return self.error(format_args!("`{name}` is a template; templates are not supported"));
            }
            self.skip_lark_space(false);
            if self.peek() != Some(':') {
                return self.error(format_args!("expected `:` after `{name}`"));
            }
            self.at += 1;
            let body = self.expansions(false)?;
            definitions.push(Definition { name, at, body });
        }
        if definitions.is_empty() {
            return Err(EbnfError(
                "the grammar is empty; it needs at least `root ::= ...` (EBNF) or `start: ...` (Lark)".into(),
            ));
        }
        if !ignored.is_empty() {
            apply_ignore(&mut definitions, ignored);
        }
        Ok(definitions)
    }

    /// Spaces and `//` comments, and line breaks where `newlines`.
    fn skip_lark_space(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            if c == '\n' && !newlines {
                break;
            } else if c.is_whitespace() {
                self.at += 1;
            } else if self.chars[self.at..].starts_with(&['/', '/']) {
                while self.peek().is_some_and(|c| c != '\n') {
                    self.at += 1;
                }
            } else {
                break;
            }
        }
    }

    fn lark_name(&mut self) -> Option<String> {
        let start = self.at;
        while self.peek().is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            self.at += 1;
        }
        let name: String = self.chars[start..self.at].iter().collect();
        (!name.is_empty() && !name.starts_with(|c: char| c.is_ascii_digit())).then_some(name)
    }

    /// `%import common.NAME [-> ALIAS]`, `%import common (A, B)`, `%ignore X`.
    fn directive(&mut self, definitions: &mut Vec<Definition>, ignored: &mut Vec<Expr>) -> Result<(), EbnfError> {
        self.at += 1;
        let Some(directive) = self.lark_name() else { return self.error("expected a directive after `%`") };
        self.skip_lark_space(false);
        match directive.as_str() {
            "ignore" => {
                let body = self.expansions(false)?;
                ignored.push(body);
            }
            "import" => {
                let at = self.position();
                let Some(module) = self.lark_name() else { return self.error("expected a module after `%import`") };
                if module != "common" {
                    return self.error(format_args!(
                        "only Lark's `common` terminals can be imported, not `{module}`; define the rules in the grammar"
                    ));
                }
                let mut names = Vec::new();
                if self.peek() == Some('.') {
                    self.at += 1;
                    let name = self.lark_name().unwrap_or_default();
                    self.skip_lark_space(false);
                    let alias = if self.chars[self.at..].starts_with(&['-', '>']) {
                        self.at += 2;
                        self.skip_lark_space(false);
                        self.lark_name()
                    } else {
                        None
                    };
                    names.push((name.clone(), alias.unwrap_or(name)));
                } else {
                    self.skip_lark_space(false);
                    if self.peek() != Some('(') {
                        return self.error("expected `.NAME` or `(NAME, ...)` after `%import common`");
                    }
                    self.at += 1;
                    loop {
                        self.skip_lark_space(true);
                        match self.peek() {
                            Some(')') => break,
                            Some(',') => self.at += 1,
                            _ => match self.lark_name() {
                                Some(name) => names.push((name.clone(), name)),
                                None => return self.error("expected a terminal name in the import list"),
                            },
                        }
                    }
                    self.at += 1;
                }
                for (name, alias) in names {
                    let Some((_, regex)) = COMMON.iter().find(|(n, _)| *n == name) else {
                        let known: Vec<&str> = COMMON.iter().map(|(n, _)| *n).collect();
                        return Err(EbnfError(format!(
                            "`common.{name}` (at {at}) is not one of Lark's common terminals: {}",
                            known.join(", ")
                        )));
                    };
                    let body = regex_expr(regex, "").map_err(EbnfError)?;
                    definitions.push(Definition { name: alias, at, body });
                }
            }
            other => return self.error(format_args!("the directive `%{other}` is not supported")),
        }
        Ok(())
    }

    /// Alternatives; at the top level a line break ends them unless the next line starts
    /// with `|`.
    fn expansions(&mut self, nested: bool) -> Result<Expr, EbnfError> {
        let mut alternatives = vec![self.expansion(nested)?];
        loop {
            let before = self.at;
            self.skip_lark_space(true);
            if self.peek() == Some('|') {
                self.at += 1;
                alternatives.push(self.expansion(nested)?);
            } else {
                self.at = before;
                return Ok(Expr::Choice(alternatives));
            }
        }
    }

    fn expansion(&mut self, nested: bool) -> Result<Vec<Expr>, EbnfError> {
        let mut items = Vec::new();
        loop {
            self.skip_lark_space(nested);
            match self.peek() {
                None | Some('|' | '\n') => return Ok(items),
                Some(')' | ']') if nested => return Ok(items),
                Some('-') if self.chars.get(self.at + 1) == Some(&'>') => {
                    // `-> alias` names the tree node; the text is the same.
                    self.at += 2;
                    self.skip_lark_space(false);
                    self.lark_name();
                }
                Some(_) => {
                    let atom = self.atom()?;
                    items.push(self.lark_postfix(atom)?);
                }
            }
        }
    }

    fn atom(&mut self) -> Result<Expr, EbnfError> {
        let at = self.position();
        match self.peek() {
            Some(quote @ ('"' | '\'')) => {
                let text = self.quoted(quote)?;
                if self.chars[self.at..].starts_with(&['.', '.']) {
                    self.at += 2;
                    self.skip_lark_space(false);
                    let Some(quote) = self.peek().filter(|c| matches!(c, '"' | '\'')) else {
                        return self.error("expected a literal after `..`");
                    };
                    let high = self.quoted(quote)?;
                    let (mut lo, mut hi) = (text.chars(), high.chars());
                    return match (lo.next(), lo.next(), hi.next(), hi.next()) {
                        (Some(lo), None, Some(hi), None) if lo <= hi => {
                            let range = regex_syntax::hir::ClassUnicodeRange::new(lo, hi);
                            Ok(Expr::Class(regex_syntax::hir::ClassUnicode::new([range])))
                        }
                        _ => self.error("a range `\"a\"..\"z\"` needs two single characters, the lower first"),
                    };
                }
                if self.peek() == Some('i') && !self.chars.get(self.at + 1).is_some_and(|c| c.is_ascii_alphanumeric()) {
                    self.at += 1;
                    return regex_expr(&regex_syntax::escape(&text), "i").or_else(|e| self.error(e));
                }
                Ok(Expr::Literal(text))
            }
            Some('/') => {
                self.at += 1;
                let mut pattern = String::new();
                loop {
                    match self.peek() {
                        None | Some('\n') => return self.error("unterminated regex"),
                        Some('/') => break,
                        Some('\\') if self.chars.get(self.at + 1) == Some(&'/') => {
                            pattern.push('/');
                            self.at += 2;
                        }
                        Some(c) => {
                            pattern.push(c);
                            self.at += 1;
                        }
                    }
                }
                self.at += 1;
                let start = self.at;
                while self.peek().is_some_and(|c| "imsxlu".contains(c)) {
                    self.at += 1;
                }
                let flags: String = self.chars[start..self.at].iter().collect();
                regex_expr(&pattern, &flags).or_else(|e| self.error(e))
            }
            Some(open @ ('(' | '[')) => {
                self.at += 1;
                self.open_group()?;
                let inner = self.expansions(true)?;
                self.depth -= 1;
                self.skip_lark_space(true);
                let close = if open == '(' { ')' } else { ']' };
                if self.peek() != Some(close) {
                    return self.error(format_args!("expected `{close}`"));
                }
                self.at += 1;
                Ok(if open == '[' { Expr::Repeat { item: Box::new(inner), min: 0, max: Some(1) } } else { inner })
            }
            Some(c) if c.is_ascii_alphabetic() || c == '_' => {
                let name = self.lark_name().expect("a name character starts a name");
                Ok(Expr::Reference { name, at })
            }
            Some(c) => self.error(format_args!("unexpected `{c}`")),
            None => self.error("unexpected end of the grammar"),
        }
    }

    fn lark_postfix(&mut self, mut item: Expr) -> Result<Expr, EbnfError> {
        loop {
            self.skip_lark_space(false);
            match self.peek() {
                Some('~') => {
                    self.at += 1;
                    self.skip_lark_space(false);
                    let min = self.count()?;
                    let max = if self.chars[self.at..].starts_with(&['.', '.']) {
                        self.at += 2;
                        self.count()?
                    } else {
                        min
                    };
                    if max < min {
                        return self.error(format_args!("the repetition `~ {min}..{max}` has its bounds reversed"));
                    }
                    item = Expr::Repeat { item: Box::new(item), min, max: Some(max) };
                }
                _ => match self.repetition_operator() {
                    Some((min, max)) => item = Expr::Repeat { item: Box::new(item), min, max },
                    None => return Ok(item),
                },
            }
        }
    }

    fn count(&mut self) -> Result<u32, EbnfError> {
        let start = self.at;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.at += 1;
        }
        let digits: String = self.chars[start..self.at].iter().collect();
        match digits.parse::<u32>() {
            Ok(n) if n <= MAX_REPEAT => Ok(n),
            Ok(_) => self.error(format_args!("repetition bounds are at most {MAX_REPEAT}")),
            Err(_) => self.error("expected a number after `~`"),
        }
    }
}

/// `%ignore`: what it names may come before each token a rule uses (a literal, a regex or a
/// terminal) and at the end of `start`, as Lark's lexer skips it between tokens.
fn apply_ignore(definitions: &mut Vec<Definition>, ignored: Vec<Expr>) {
    let at = definitions[0].at;
    let skip = || Expr::Repeat { item: Box::new(Expr::Reference { name: IGNORED.into(), at }), min: 0, max: None };
    for definition in definitions.iter_mut().filter(|d| !is_terminal(&d.name)) {
        precede_tokens(&mut definition.body, &skip);
        if definition.name == START_RULE {
            let body = std::mem::replace(&mut definition.body, Expr::Literal(String::new()));
            definition.body = Expr::Choice(vec![vec![body, skip()]]);
        }
    }
    let alternatives = ignored.into_iter().map(|e| vec![e]).collect();
    definitions.push(Definition { name: IGNORED.into(), at, body: Expr::Choice(alternatives) });
}

fn precede_tokens(expr: &mut Expr, skip: &impl Fn() -> Expr) {
    match expr {
        Expr::Choice(alternatives) => alternatives.iter_mut().flatten().for_each(|e| precede_tokens(e, skip)),
        Expr::Repeat { item, .. } => precede_tokens(item, skip),
        Expr::Reference { name, .. } if !is_terminal(name) => {}
        Expr::Literal(_) | Expr::Class(_) | Expr::Reference { .. } | Expr::Token(_) => {
            let token = std::mem::replace(expr, Expr::Literal(String::new()));
            *expr = Expr::Choice(vec![vec![skip(), token]]);
        }
    }
}

/// A regex (Lark's `/.../flags`) as one token.
pub(super) fn regex_expr(pattern: &str, flags: &str) -> Result<Expr, String> {
    let hir = regex_syntax::ParserBuilder::new()
        .case_insensitive(flags.contains('i'))
        .multi_line(flags.contains('m'))
        .dot_matches_new_line(flags.contains('s'))
        .ignore_whitespace(flags.contains('x'))
        .build()
        .parse(pattern)
        .map_err(|e| format!("the regex /{pattern}/ is not valid: {e}"))?;
    Ok(Expr::Token(Box::new(hir_expr(&hir, pattern)?)))
}

fn hir_expr(hir: &Hir, pattern: &str) -> Result<Expr, String> {
    Ok(match hir.kind() {
        HirKind::Empty => Expr::Literal(String::new()),
        HirKind::Literal(literal) => Expr::Literal(
            String::from_utf8(literal.0.to_vec())
                .map_err(|_| format!("the regex /{pattern}/ matches invalid UTF-8"))?,
        ),
        HirKind::Class(Class::Unicode(class)) => Expr::Class(class.clone()),
        HirKind::Class(Class::Bytes(class)) => match class.to_unicode_class() {
            Some(class) => Expr::Class(class),
            None => return Err(format!("the regex /{pattern}/ matches bytes outside ASCII one at a time")),
        },
        HirKind::Look(_) => {
            return Err(format!("the regex /{pattern}/ uses an anchor or look-around, which a grammar cannot hold"));
        }
        HirKind::Repetition(repetition) => {
            if repetition.min > MAX_REPEAT || repetition.max.is_some_and(|m| m > MAX_REPEAT) {
                return Err(format!("the regex /{pattern}/ repeats more than {MAX_REPEAT} times"));
            }
            Expr::Repeat {
                item: Box::new(hir_expr(&repetition.sub, pattern)?),
                min: repetition.min,
                max: repetition.max,
            }
        }
        HirKind::Capture(capture) => hir_expr(&capture.sub, pattern)?,
        HirKind::Concat(items) => {
            Expr::Choice(vec![items.iter().map(|h| hir_expr(h, pattern)).collect::<Result<_, _>>()?])
        }
        HirKind::Alternation(branches) => {
            Expr::Choice(branches.iter().map(|h| hir_expr(h, pattern).map(|e| vec![e])).collect::<Result<_, _>>()?)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::super::pushdown::PushdownGrammar;

    fn grammar(text: &str) -> PushdownGrammar {
        PushdownGrammar::new(text).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_lark_grammar_with_regexes_ranges_and_common_terminals_runs() {
        let g = grammar(
            r#"
            // A call like `move(3, -2)`.
            ?start: call
            call: NAME "(" [args] ")" -> call_node
            args: arg ("," " "? arg)*
                | "*"
            arg: SIGNED_INT | "'" /[a-z ]+/ "'"
            NAME.2: ("a".."z" | "_")+
            %import common.SIGNED_INT
            "#,
        );
        assert!(g.matches(b"move(3, -2)"));
        assert!(g.matches(b"say('hi there')"));
        assert!(g.matches(b"stop()"));
        assert!(g.matches(b"all(*)"));
        assert!(grammar("start: \"a ::= b\"").matches(b"a ::= b"), "`::=` in a Lark literal stays Lark");
        assert!(!g.matches(b"Move(3)"), "NAME is lower case");
        assert!(!g.matches(b"move(3,,2)"));
    }

    #[test]
    fn ignored_whitespace_may_come_before_every_token_and_at_the_end() {
        let g = grammar(
            r#"
            start: "[" [value ("," value)*] "]"
            value: NUMBER | start | "true"i
            %import common (NUMBER, WS)
            %ignore WS
            "#,
        );
        assert!(g.matches(b"[1,2,[3]]"));
        assert!(g.matches(b" [ 1 ,\n 2.5e3 , [ ] , TRUE ] \n"));
        assert!(!g.matches(b"[1 2]"), "whitespace separates tokens; it does not replace commas");
        assert!(!g.matches(b"[t rue]"), "nor may it split a token");
    }

    #[test]
    fn larks_json_tutorial_grammar_reads_json_as_lark_would() {
        let g = grammar(
            r#"
            ?start: value
            ?value: object
                  | array
                  | string
                  | SIGNED_NUMBER      -> number
                  | "true"             -> true
                  | "false"            -> false
                  | "null"             -> null
            array  : "[" [value ("," value)*] "]"
            object : "{" [pair ("," pair)*] "}"
            pair   : string ":" value
            string : ESCAPED_STRING

            %import common.ESCAPED_STRING
            %import common.SIGNED_NUMBER
            %import common.WS
            %ignore WS
            "#,
        );
        let pretty =
            "{\n  \"name\": \"Ada \\\"the first\\\"\",\n  \"tags\": [1, -2.5e3, true, null],\n  \"o\": {}\n}\n";
        assert!(g.matches(pretty.as_bytes()), "{pretty}");
        assert!(g.matches(br#"[{"a":[]},"b"]"#));
        assert!(!g.matches(br#"{"a" 1}"#));
        assert!(!g.matches(br#"{"a": tru e}"#));
    }

    #[test]
    fn lark_grammars_the_recogniser_cannot_run_are_refused_by_name() {
        let error = |text: &str| PushdownGrammar::new(text).expect_err("refused").0;
        assert!(error("rule: \"a\"").contains("no `start` rule"));
        assert!(error("start: /^a/").contains("anchor"));
        assert!(error("start: x\n%import common.NOPE").contains("not one of Lark's common terminals"));
        assert!(error("start: x\n%import other.X").contains("only Lark's `common`"));
        assert!(error("start: a\n_sep{x}: x").contains("template"));
        assert!(error("start: \"a\"\n%declare X").contains("`%declare` is not supported"));
        assert!(error("start: start \"a\" | \"a\"").contains("left-recursive"));
        assert!(error("start: \"a\" ~ 3..1").contains("reversed"));
        assert!(error("").contains("empty"));
    }
}
