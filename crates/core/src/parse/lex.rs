//! Tokens of the rule language, with the columns errors point at.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// A name: selector, keyword, unit, option or algorithm.
    Word,
    /// Decimal digits, optionally grouped by `_`.
    Number,
    /// One of `/ : + ( ) , ; =`.
    Punct,
    /// Any other character, kept so errors can show it.
    Other,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Token<'a> {
    pub(super) kind: Kind,
    pub(super) text: &'a str,
    /// First column, from 1, in characters.
    pub(super) column: usize,
    /// The column just after the token.
    pub(super) end: usize,
}

pub(super) fn lex(text: &str) -> Vec<Token<'_>> {
    let bytes = text.as_bytes();
    let mut tokens = Vec::new();
    let (mut at, mut column) = (0, 1);
    while let Some(c) = text[at..].chars().next() {
        let (kind, len) = if c.is_ascii_digit() {
            (Kind::Number, number_len(&bytes[at..]))
        } else if c.is_ascii_alphabetic() || c == '_' {
            let word = bytes[at..]
                .iter()
                .take_while(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
            (Kind::Word, word.count())
        } else if "/:+(),;=".contains(c) {
            (Kind::Punct, 1)
        } else {
            (Kind::Other, c.len_utf8())
        };
        // Only Other tokens can hold non-ASCII characters, and they hold exactly one.
        let width = if c.is_ascii() { len } else { 1 };
        if !c.is_whitespace() {
            let text = &text[at..at + len];
            tokens.push(Token {
                kind,
                text,
                column,
                end: column + width,
            });
        }
        at += len;
        column += width;
    }
    tokens
}

/// Digits, with `_` allowed only between two digits (`1_000`).
fn number_len(bytes: &[u8]) -> usize {
    let mut len = 0;
    while let Some(&b) = bytes.get(len) {
        if b.is_ascii_digit() {
            len += 1;
        } else if b == b'_' && bytes.get(len + 1).is_some_and(u8::is_ascii_digit) {
            len += 2;
        } else {
            break;
        }
    }
    len
}

/// The value of a number token, or `None` if it does not fit in a u64.
pub(super) fn number_value(text: &str) -> Option<u64> {
    text.bytes().filter(|&b| b != b'_').try_fold(0u64, |n, b| {
        n.checked_mul(10)?.checked_add(u64::from(b - b'0'))
    })
}

/// The token as shown in an error: quoted, escaped, and short enough for one line.
pub(super) fn quote(text: &str) -> String {
    const MAX_CHARS: usize = 32;
    match text.char_indices().nth(MAX_CHARS) {
        Some((cut, _)) => format!("{:?}", format!("{}…", &text[..cut])),
        None => format!("{text:?}"),
    }
}
