//! A reader for BIND's canonical configuration, as `named-checkconf -p` prints it.
//!
//! That output is regular: statements made of words (bare or double-quoted) and
//! brace blocks, each ended by `;`. BIND's own parser has already resolved includes,
//! checked the grammar and thrown away comments, so this only has to split it up;
//! it still accepts comments and refuses anything malformed with an error (never a
//! panic), because the text comes from a file the operator may have edited.

use std::fmt;

/// Nesting deeper than this is refused (BIND's grammar needs about five levels).
const MAX_DEPTH: usize = 32;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Token {
    /// A bare word (`type`, `192.0.2.0/24`, `!`) or a quoted string's contents.
    Word {
        text: String,
        quoted: bool,
    },
    Open,
    Close,
    Semi,
}

#[derive(Debug, PartialEq, Eq)]
pub struct ParseError {
    pub line: usize,
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

impl std::error::Error for ParseError {}

/// Splits the text into tokens, each with its line number.
pub fn tokenize(text: &str) -> Result<Vec<(usize, Token)>, ParseError> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    let mut line = 1;
    let err = |line, message: &str| ParseError { line, message: message.to_owned() };
    while let Some(c) = chars.next() {
        match c {
            '\n' => line += 1,
            c if c.is_whitespace() => {}
            '{' => out.push((line, Token::Open)),
            '}' => out.push((line, Token::Close)),
            ';' => out.push((line, Token::Semi)),
            '#' => {
                while chars.peek().is_some_and(|&c| c != '\n') {
                    chars.next();
                }
            }
            '/' if chars.peek() == Some(&'/') => {
                while chars.peek().is_some_and(|&c| c != '\n') {
                    chars.next();
                }
            }
            '/' if chars.peek() == Some(&'*') => {
                chars.next();
                let start = line;
                let mut prev = ' ';
                loop {
                    match chars.next() {
                        None => return Err(err(start, "unterminated /* comment")),
                        Some('/') if prev == '*' => break,
                        Some(c) => {
                            if c == '\n' {
                                line += 1;
                            }
                            prev = c;
                        }
                    }
                }
            }
            '"' => {
                let start = line;
                let mut s = String::new();
                loop {
                    match chars.next() {
                        None => return Err(err(start, "unterminated quoted string")),
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            None => return Err(err(start, "unterminated quoted string")),
                            Some(c) => {
                                if c == '\n' {
                                    line += 1;
                                }
                                s.push(c);
                            }
                        },
                        Some(c) => {
                            if c == '\n' {
                                line += 1;
                            }
                            s.push(c);
                        }
                    }
                }
                out.push((start, Token::Word { text: s, quoted: true }));
            }
            c => {
                let mut s = String::from(c);
                while let Some(&c) = chars.peek() {
                    if c.is_whitespace() || matches!(c, '{' | '}' | ';' | '"' | '#') {
                        break;
                    }
                    // A `//` comment may follow a word without a space.
                    if c == '/' && s.ends_with('/') {
                        s.pop();
                        while chars.peek().is_some_and(|&c| c != '\n') {
                            chars.next();
                        }
                        break;
                    }
                    s.push(c);
                    chars.next();
                }
                if !s.is_empty() {
                    out.push((line, Token::Word { text: s, quoted: false }));
                }
            }
        }
    }
    Ok(out)
}

/// One part of a statement: a word or a braced block of statements.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Item {
    Word(String),
    Block(Vec<Statement>),
}

/// A statement: its items up to the `;`, and the line it starts on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Statement {
    pub line: usize,
    pub items: Vec<Item>,
}

impl Statement {
    /// The leading keyword (`zone`, `type`, `key`, ...), lowercased.
    pub fn keyword(&self) -> Option<String> {
        match self.items.first() {
            Some(Item::Word(w)) => Some(w.to_ascii_lowercase()),
            _ => None,
        }
    }

    /// The words after the keyword, up to the first block.
    pub fn args(&self) -> Vec<&str> {
        self.items
            .iter()
            .skip(1)
            .map_while(|i| match i {
                Item::Word(w) => Some(w.as_str()),
                Item::Block(_) => None,
            })
            .collect()
    }

    /// The first word after the keyword.
    pub fn arg(&self) -> Option<&str> {
        self.args().first().copied()
    }

    /// The statement's first block.
    pub fn block(&self) -> Option<&[Statement]> {
        self.items.iter().find_map(|i| match i {
            Item::Block(b) => Some(b.as_slice()),
            Item::Word(_) => None,
        })
    }

    /// Every word of the statement, blocks left out.
    pub fn words(&self) -> Vec<&str> {
        self.items
            .iter()
            .filter_map(|i| match i {
                Item::Word(w) => Some(w.as_str()),
                Item::Block(_) => None,
            })
            .collect()
    }

    /// The statements in this one's block whose keyword is `name`.
    pub fn children<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Statement> + 'a {
        self.block().unwrap_or(&[]).iter().filter(move |s| s.keyword().as_deref() == Some(name))
    }

    /// The first statement named `name` in this one's block.
    pub fn child(&self, name: &str) -> Option<&Statement> {
        self.block().unwrap_or(&[]).iter().find(|s| s.keyword().as_deref() == Some(name))
    }
}

/// Parses a whole configuration into its top-level statements.
pub fn parse(text: &str) -> Result<Vec<Statement>, ParseError> {
    let tokens = tokenize(text)?;
    let mut pos = 0;
    let statements = parse_block(&tokens, &mut pos, 0)?;
    if let Some((line, _)) = tokens.get(pos) {
        return Err(ParseError { line: *line, message: "unexpected `}`".into() });
    }
    Ok(statements)
}

fn parse_block(tokens: &[(usize, Token)], pos: &mut usize, depth: usize) -> Result<Vec<Statement>, ParseError> {
    if depth > MAX_DEPTH {
        let line = tokens.get(*pos).map_or(0, |t| t.0);
        return Err(ParseError { line, message: format!("blocks nested deeper than {MAX_DEPTH}") });
    }
    let mut statements = Vec::new();
    loop {
        let Some((line, token)) = tokens.get(*pos) else {
            return Ok(statements);
        };
        match token {
            Token::Close => return Ok(statements),
            // An empty statement (`;;`) is harmless.
            Token::Semi => {
                *pos += 1;
                continue;
            }
            _ => {}
        }
        let line = *line;
        let mut items = Vec::new();
        loop {
            let Some((at, token)) = tokens.get(*pos) else {
                return Err(ParseError { line, message: "statement not ended by `;`".into() });
            };
            match token {
                Token::Word { text, .. } => {
                    items.push(Item::Word(text.clone()));
                    *pos += 1;
                }
                Token::Open => {
                    *pos += 1;
                    let inner = parse_block(tokens, pos, depth + 1)?;
                    match tokens.get(*pos) {
                        Some((_, Token::Close)) => *pos += 1,
                        _ => return Err(ParseError { line: *at, message: "`{` not closed".into() }),
                    }
                    items.push(Item::Block(inner));
                }
                Token::Semi => {
                    *pos += 1;
                    break;
                }
                Token::Close => return Err(ParseError { line: *at, message: "`}` before the statement's `;`".into() }),
            }
        }
        statements.push(Statement { line, items });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const CANONICAL: &str = r#"acl "internal" {
	192.0.2.0/24;
	"localhost";
};
options {
	directory "/var/cache/bind";
	listen-on-v6  {
		"any";
	};
};
key "dhcp-key" {
	algorithm "hmac-sha256";
	secret "c2VjcmV0";
};
zone "example.com" IN {
	type master;
	file "/etc/bind/db.example.com";
	update-policy {
		grant "dhcp-key" zonesub "A" "AAAA";
		deny "*" name "www.example.com." "A";
	};
	allow-transfer  {
		key "ops-key";
		! 192.0.2.1/32;
	};
};
"#;

    #[test]
    fn reads_named_checkconf_output() {
        let s = parse(CANONICAL).unwrap();
        assert_eq!(s.len(), 4);
        assert_eq!(s[0].keyword().as_deref(), Some("acl"));
        assert_eq!(s[1].child("directory").unwrap().arg(), Some("/var/cache/bind"));
        let zone = &s[3];
        assert_eq!(zone.args(), vec!["example.com", "IN"]);
        assert_eq!(zone.line, 15);
        assert_eq!(zone.child("type").unwrap().arg(), Some("master"));
        let policy: Vec<Vec<&str>> = zone.child("update-policy").unwrap().block().unwrap().iter().map(|r| r.words()).collect();
        assert_eq!(policy, vec![vec!["grant", "dhcp-key", "zonesub", "A", "AAAA"], vec!["deny", "*", "name", "www.example.com.", "A"]]);
        let xfer: Vec<Vec<&str>> = zone.child("allow-transfer").unwrap().block().unwrap().iter().map(|r| r.words()).collect();
        assert_eq!(xfer, vec![vec!["key", "ops-key"], vec!["!", "192.0.2.1/32"]]);
    }

    #[test]
    fn comments_escapes_and_errors() {
        let s = parse("a \"x\\\"y\" { b; }; // c\n# d\n/* e\n f */ g h;").unwrap();
        assert_eq!(s[0].args(), vec!["x\"y"]);
        assert_eq!(s[1].words(), vec!["g", "h"]);
        assert_eq!(s[1].line, 4);
        assert_eq!(parse("a//c\n;").unwrap()[0].words(), vec!["a"]);
        for (bad, what) in [
            ("a", "not ended"),
            ("a {", "not closed"),
            ("a { b; }", "not ended"),
            ("}", "unexpected"),
            ("a \"b", "unterminated"),
            ("/* x", "unterminated"),
            ("a { b };", "before"),
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.message.contains(what), "{bad:?}: {e}");
        }
        let deep = "a {".repeat(MAX_DEPTH + 2) + &"};".repeat(MAX_DEPTH + 2);
        assert!(parse(&deep).unwrap_err().message.contains("nested"));
        let ok = "a {".repeat(MAX_DEPTH) + &"};".repeat(MAX_DEPTH);
        assert!(parse(&ok).is_ok());
    }

    /// Prints statements back in the canonical form.
    fn print(statements: &[Statement]) -> String {
        let mut out = String::new();
        for s in statements {
            for item in &s.items {
                match item {
                    Item::Word(w) => out += &format!("\"{}\" ", w.replace('\\', "\\\\").replace('"', "\\\"")),
                    Item::Block(b) => out += &format!("{{ {} }} ", print(b)),
                }
            }
            out += ";\n";
        }
        out
    }

    fn word() -> impl Strategy<Value = String> {
        "[ -~]{1,12}"
    }

    fn statement() -> impl Strategy<Value = Statement> {
        let leaf = prop::collection::vec(word().prop_map(Item::Word), 1..4).prop_map(|items| Statement { line: 0, items });
        leaf.prop_recursive(4, 32, 4, |inner| {
            (prop::collection::vec(word(), 1..3), prop::collection::vec(inner, 0..4)).prop_map(|(words, block)| {
                let mut items: Vec<Item> = words.into_iter().map(Item::Word).collect();
                items.push(Item::Block(block));
                Statement { line: 0, items }
            })
        })
    }

    fn strip_lines(s: &mut [Statement]) {
        for st in s {
            st.line = 0;
            for i in &mut st.items {
                if let Item::Block(b) = i {
                    strip_lines(b);
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        /// Any text: an error or statements, never a panic.
        #[test]
        fn arbitrary_text_never_panics(text in "[ -~\\n\\t{};\"/*#\\\\]{0,200}") {
            let _ = parse(&text);
        }

        /// Arbitrary bytes decoded lossily: the same.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
            let _ = parse(&String::from_utf8_lossy(&bytes));
        }

        /// Quoted words of any printable text survive a print and parse.
        #[test]
        fn printed_statements_parse_back(statements in prop::collection::vec(statement(), 0..5)) {
            let text = print(&statements);
            let mut back = parse(&text).unwrap();
            strip_lines(&mut back);
            prop_assert_eq!(back, statements);
        }
    }
}
