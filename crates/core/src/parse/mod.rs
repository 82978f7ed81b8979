//! Reading the rule language (grammar in [`crate::rule`]) into validated [`Rule`]s.
//!
//! ```
//! use sluice_core::parse::parse_rule;
//!
//! let rule = parse_rule("ip:10/s; user:100/5m burst=20").unwrap();
//! assert_eq!(rule.to_string(), "or(ip:10/s, user:100/5m burst=20)");
//!
//! let err = parse_rule("10/x").unwrap_err();
//! assert_eq!(err.column, 4);
//! ```
//!
//! Every error, syntactic or semantic, names the column of the offending token so a config
//! loader can point at it in one line.

mod lex;

use std::str::FromStr;

use lex::{Kind, Token, lex, number_value, quote};

use crate::algorithm::Algorithm;
use crate::algorithm::concurrency::MAX_CONCURRENT;
use crate::rate::{MAX_COUNT, Rate, RateError, Span, Unit};
use crate::rule::{
    Leaf, LeafOptions, MAX_DEPTH, MAX_LEAVES, MAX_NAME_LEN, MAX_WINDOWS, Rule, Selector,
    is_valid_name,
};

/// Why a rule (or a rate) could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("column {column}: expected {expected}, found {found}")]
pub struct RuleError {
    /// Column of the offending token, counted in characters from 1.
    pub column: usize,
    /// What would have been accepted there: `a count`, `` `)` or `,` ``, `end of rule`.
    pub expected: String,
    /// The offending token in double quotes (long tokens cut short), or `end of input`.
    pub found: String,
}

/// Reads a rule. A top-level list `a; b` becomes `Rule::Or([a, b])`; a single rule stays as is.
pub fn parse_rule(text: &str) -> Result<Rule, RuleError> {
    Parser::new(text).rules()
}

impl FromStr for Rule {
    type Err = RuleError;

    fn from_str(text: &str) -> Result<Rule, RuleError> {
        parse_rule(text)
    }
}

/// Reads just `count/span`: `10/s`, `100/5m`, `2/hour`.
impl FromStr for Rate {
    type Err = RuleError;

    fn from_str(text: &str) -> Result<Rate, RuleError> {
        let mut parser = Parser::new(text);
        let rate = parser.rate()?;
        parser.expect_end("end of rate")?;
        Ok(rate)
    }
}

const UNIT: &str = "a unit (s, m, h, d, w, y or a long name)";
/// The word that makes a count a concurrency limit: `user:3 concurrent`.
const CONCURRENT: &str = "concurrent";

fn error_at(token: Token<'_>, expected: impl Into<String>) -> RuleError {
    RuleError {
        column: token.column,
        expected: expected.into(),
        found: quote(token.text),
    }
}

fn too_deep(keyword: Token<'_>) -> RuleError {
    error_at(keyword, format!("groups nested at most {MAX_DEPTH} deep"))
}

#[derive(Default)]
struct Parser<'a> {
    tokens: Vec<Token<'a>>,
    next: usize,
    leaves: usize,
    /// The first group opened at the deepest level allowed: a top-level list adds one more
    /// level (it is an `or`), so such a group may not share the top level with other rules.
    deepest: Option<Token<'a>>,
}

impl<'a> Parser<'a> {
    fn new(text: &'a str) -> Parser<'a> {
        let tokens = lex(text);
        Parser {
            tokens,
            ..Parser::default()
        }
    }

    fn peek(&self) -> Option<Token<'a>> {
        self.tokens.get(self.next).copied()
    }

    /// Takes the next token if it is the punctuation `punct`.
    fn eat(&mut self, punct: &str) -> bool {
        let found = self
            .peek()
            .is_some_and(|t| t.kind == Kind::Punct && t.text == punct);
        self.next += usize::from(found);
        found
    }

    /// Takes the next token if it is of `kind`.
    fn take(&mut self, kind: Kind) -> Option<Token<'a>> {
        let token = self.peek().filter(|t| t.kind == kind)?;
        self.next += 1;
        Some(token)
    }

    /// An error at the next token, or at the end of the last one if there is none.
    fn error_here(&self, expected: impl Into<String>) -> RuleError {
        match self.peek() {
            Some(token) => error_at(token, expected),
            None => RuleError {
                column: self.tokens.last().map_or(1, |t| t.end),
                expected: expected.into(),
                found: "end of input".to_owned(),
            },
        }
    }

    fn expect_end(&self, expected: &str) -> Result<(), RuleError> {
        match self.peek() {
            Some(_) => Err(self.error_here(expected)),
            None => Ok(()),
        }
    }

    fn rules(&mut self) -> Result<Rule, RuleError> {
        let mut rules = vec![self.rule(0)?];
        while self.eat(";") {
            if self.peek().is_none() {
                break; // a trailing `;`
            }
            if let Some(keyword) = self.deepest {
                return Err(too_deep(keyword));
            }
            rules.push(self.rule(1)?);
        }
        self.expect_end("`;` or end of rule")?;
        Ok(if rules.len() == 1 {
            rules.swap_remove(0)
        } else {
            Rule::Or(rules)
        })
    }

    /// A group or a leaf inside `depth` groups.
    fn rule(&mut self, depth: usize) -> Result<Rule, RuleError> {
        let Some(first) = self.peek() else {
            return Err(self.error_here("a rule"));
        };
        let opens_group = self
            .tokens
            .get(self.next + 1)
            .is_some_and(|t| t.text == "(");
        if first.kind != Kind::Word || !opens_group {
            return self.leaf();
        }
        let is_or = first.text.eq_ignore_ascii_case("or");
        if !is_or && !first.text.eq_ignore_ascii_case("and") {
            return Err(error_at(first, "`or` or `and` before `(`"));
        }
        let depth = depth + 1;
        if depth > MAX_DEPTH {
            return Err(too_deep(first));
        }
        if depth == MAX_DEPTH && self.deepest.is_none() {
            self.deepest = Some(first);
        }
        self.next += 2;
        let mut children = vec![self.rule(depth)?];
        while self.eat(",") {
            children.push(self.rule(depth)?);
        }
        if !self.eat(")") {
            return Err(self.error_here("`)` or `,`"));
        }
        Ok(if is_or {
            Rule::Or(children)
        } else {
            Rule::And(children)
        })
    }

    fn leaf(&mut self) -> Result<Rule, RuleError> {
        let start = match self.peek() {
            Some(t) if matches!(t.kind, Kind::Word | Kind::Number) => t,
            _ => return Err(self.error_here("a rule")),
        };
        self.leaves += 1;
        if self.leaves > MAX_LEAVES {
            return Err(error_at(
                start,
                format!("at most {MAX_LEAVES} leaves in one rule"),
            ));
        }
        let selector = match start.kind {
            Kind::Word => self.selector()?,
            _ => Selector::global(),
        };
        let concurrent = self.peek().is_some_and(|t| t.kind == Kind::Number)
            && self
                .tokens
                .get(self.next + 1)
                .is_some_and(|t| t.text.eq_ignore_ascii_case(CONCURRENT));
        if concurrent {
            return self.concurrency_leaf(selector);
        }
        let rate = self.rate()?;
        let options = self.options()?;
        Ok(Rule::Leaf(Leaf {
            selector,
            rate,
            options,
        }))
    }

    /// `name(+name)*:`
    fn selector(&mut self) -> Result<Selector, RuleError> {
        let mut names: Vec<&str> = Vec::new();
        let mut first = None;
        loop {
            let Some(name) = self.take(Kind::Word) else {
                return Err(self.error_here("a selector name"));
            };
            first = first.or(Some(name));
            if !is_valid_name(name.text) {
                let expected = format!("a selector name of at most {MAX_NAME_LEN} characters");
                return Err(error_at(name, expected));
            }
            if names.contains(&name.text) {
                return Err(error_at(
                    name,
                    "a selector name not already in this selector",
                ));
            }
            names.push(name.text);
            if self.eat(":") {
                break;
            }
            if !self.eat("+") {
                return Err(self.error_here("`:` or `+`"));
            }
        }
        // The checks above mirror Selector::new; should they ever drift, still no panic.
        Selector::new(names).map_err(|err| RuleError {
            column: first.map_or(1, |t| t.column),
            expected: "a valid selector".to_owned(),
            found: err.to_string(),
        })
    }

    /// `count/[multiplier]unit`
    fn rate(&mut self) -> Result<Rate, RuleError> {
        let (count, count_token) = self.number("a count", MAX_COUNT)?;
        if !self.eat("/") {
            return Err(self.error_here("`/` (or `concurrent`)"));
        }
        let span = self.span()?;
        Rate::new(count, span).map_err(|err| error_at(count_token, acceptable(&err)))
    }

    /// `count concurrent [lease=span]`, the selector already read.
    fn concurrency_leaf(&mut self, selector: Selector) -> Result<Rule, RuleError> {
        let (count, count_token) = self.number("a count of leases", MAX_CONCURRENT)?;
        self.next += 1; // `concurrent`, seen by the caller
        if self.peek().is_some_and(|t| t.text == "/") {
            return Err(self.error_here(
                "an option or the end of the leaf (a concurrency leaf takes a count, not a rate)",
            ));
        }
        let mut lease = None;
        while let Some(name) = self.take(Kind::Word) {
            match name.text.to_ascii_lowercase().as_str() {
                "lease" if lease.is_some() => {
                    return Err(error_at(name, "at most one `lease` option"));
                }
                "lease" => {
                    if !self.eat("=") {
                        return Err(self.error_here("`=`"));
                    }
                    if !self
                        .peek()
                        .is_some_and(|t| matches!(t.kind, Kind::Number | Kind::Word))
                    {
                        return Err(self.error_here("a lease time such as 30s or 5m"));
                    }
                    lease = Some(self.span()?);
                }
                "burst" | "algorithm" | "algo" | "windows" => {
                    let expected =
                        "`lease=` (a concurrency leaf takes no burst, algorithm or windows)";
                    return Err(error_at(name, expected));
                }
                _ => return Err(error_at(name, "an option (lease)")),
            }
        }
        let mut leaf = Leaf::concurrent(count, lease)
            .map_err(|err| error_at(count_token, acceptable(&err)))?;
        leaf.selector = selector;
        Ok(Rule::Leaf(leaf))
    }

    /// `[multiplier]unit`: `s`, `5m`, `30s`.
    fn span(&mut self) -> Result<Span, RuleError> {
        let multiplier = self.take(Kind::Number);
        // The multiplier and unit form one word (`5m`), so no space may come between them.
        let unit = match self.peek() {
            Some(t) if t.kind == Kind::Word && multiplier.is_none_or(|m| m.end == t.column) => t,
            _ if multiplier.is_some() => {
                return Err(self.error_here(format!("{UNIT} right after the number")));
            }
            _ => return Err(self.error_here(UNIT)),
        };
        self.next += 1;
        let unit_value = Unit::from_name(unit.text).ok_or_else(|| error_at(unit, UNIT))?;
        let span = match multiplier {
            None => Span::new(1, unit_value),
            // A multiplier too big for a u64 is simply a span far too long.
            Some(m) => number_value(m.text)
                .map_or(Err(RateError::SpanTooLong), |n| Span::new(n, unit_value)),
        };
        span.map_err(|err| RuleError {
            column: multiplier.unwrap_or(unit).column,
            expected: acceptable(&err),
            found: quote(&format!(
                "{}{}",
                multiplier.map_or("", |m| m.text),
                unit.text
            )),
        })
    }

    /// `name=value`, each option at most once.
    fn options(&mut self) -> Result<LeafOptions, RuleError> {
        let mut options = LeafOptions::default();
        while let Some(name) = self.take(Kind::Word) {
            let key = name.text.to_ascii_lowercase();
            let (canonical, given) = match key.as_str() {
                "burst" => ("burst", options.burst.is_some()),
                "algorithm" | "algo" => ("algorithm", options.algorithm.is_some()),
                "windows" => ("windows", options.windows.is_some()),
                "prefetch" => ("prefetch", options.prefetch.is_some()),
                CONCURRENT | "lease" => {
                    let expected = "an option (burst, algorithm, windows or prefetch); \
                                    `concurrent` and `lease` follow a bare count: \
                                    `3 concurrent lease=30s`";
                    return Err(error_at(name, expected));
                }
                _ => {
                    return Err(error_at(
                        name,
                        "an option (burst, algorithm, windows or prefetch)",
                    ));
                }
            };
            if given {
                return Err(error_at(name, format!("at most one `{canonical}` option")));
            }
            if !self.eat("=") {
                return Err(self.error_here("`=`"));
            }
            match canonical {
                "burst" => options.burst = Some(self.number("a burst size", MAX_COUNT)?.0),
                "windows" => {
                    let (windows, _) = self.number("a number of windows", MAX_WINDOWS.into())?;
                    options.windows = u32::try_from(windows).ok(); // at most MAX_WINDOWS: fits
                }
                "prefetch" => {
                    let expected = format!("a block size from 2 to {MAX_COUNT}");
                    let Some(token) = self.take(Kind::Number) else {
                        return Err(self.error_here(expected));
                    };
                    let block = number_value(token.text)
                        .filter(|n| (2..=MAX_COUNT).contains(n))
                        .ok_or_else(|| error_at(token, expected))?;
                    options.prefetch = Some(block);
                }
                _ => options.algorithm = Some(self.algorithm()?),
            }
        }
        Ok(options)
    }

    fn algorithm(&mut self) -> Result<Algorithm, RuleError> {
        let names: Vec<&str> = Algorithm::ALL.iter().map(|a| a.name()).collect();
        let expected = format!("an algorithm ({})", names.join(", "));
        match self.take(Kind::Word) {
            Some(token) => {
                Algorithm::from_name(token.text).ok_or_else(|| error_at(token, expected))
            }
            None => Err(self.error_here(expected)),
        }
    }

    /// A number from 1 to `max`, called `what` ("a count") in errors.
    fn number(&mut self, what: &str, max: u64) -> Result<(u64, Token<'a>), RuleError> {
        let Some(token) = self.take(Kind::Number) else {
            return Err(self.error_here(what));
        };
        match number_value(token.text) {
            Some(n) if (1..=max).contains(&n) => Ok((n, token)),
            _ => Err(error_at(token, format!("{what} from 1 to {max}"))),
        }
    }
}

/// What would have been accepted instead of the value [`Rate`] or [`Span`] refused.
fn acceptable(err: &RateError) -> String {
    match err {
        RateError::ZeroCount | RateError::CountTooLarge => format!("a count from 1 to {MAX_COUNT}"),
        RateError::ZeroSpan => "a span of at least one unit".to_owned(),
        RateError::SpanTooLong => "a span of at most ten years".to_owned(),
    }
}
