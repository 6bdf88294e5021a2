//! JSON text to its canonical form, each number kept as written. (Parsing into
//! `serde_json::Value` instead would round big integers and long decimals to the nearest `f64`,
//! and keep only the last of two equal keys.)

use super::{enter, write_str};

/// A JSON value read from text.
#[derive(Debug, PartialEq)]
pub enum JsonText<'a> {
    /// `null`, `true`, `false` or a number, exactly as written.
    Atom(&'a str),
    /// A string, unescaped.
    Str(String),
    /// An array.
    Array(Vec<JsonText<'a>>),
    /// An object's members, sorted by key; no key appears twice.
    Object(Vec<(String, JsonText<'a>)>),
}

impl<'a> JsonText<'a> {
    /// Reads `body` as one JSON value (RFC 8259). `None` when it is not UTF-8 JSON, nests deeper
    /// than [`MAX_FINGERPRINT_DEPTH`](crate::MAX_FINGERPRINT_DEPTH), or repeats a key in an
    /// object (readers disagree on what that means, so it has no one canonical form).
    pub fn parse(body: &'a [u8]) -> Option<JsonText<'a>> {
        let mut parser = Parser {
            text: std::str::from_utf8(body).ok()?,
            pos: 0,
        };
        let value = parser.value(0)?;
        parser.skip_whitespace();
        (parser.pos == parser.text.len()).then_some(value)
    }

    /// The value at a JSON Pointer (RFC 6901), found as serde_json's `Value::pointer` finds it.
    pub fn pointer(&self, pointer: &str) -> Option<&JsonText<'a>> {
        if pointer.is_empty() {
            return Some(self);
        }
        pointer
            .strip_prefix('/')?
            .split('/')
            .map(|token| token.replace("~1", "/").replace("~0", "~"))
            .try_fold(self, |target, token| match target {
                JsonText::Object(members) => members
                    .binary_search_by(|(key, _)| key.as_str().cmp(&token))
                    .ok()
                    .and_then(|i| members.get(i))
                    .map(|(_, value)| value),
                JsonText::Array(items) => array_index(&token).and_then(|i| items.get(i)),
                _ => None,
            })
    }

    /// The canonical form: no whitespace, members sorted by key, strings escaped as
    /// [`Fingerprint::of_json`](crate::Fingerprint::of_json)'s canonical form escapes them, numbers as written.
    pub fn canonical(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write(&mut out);
        out
    }

    fn write(&self, out: &mut Vec<u8>) {
        match self {
            JsonText::Atom(text) => out.extend_from_slice(text.as_bytes()),
            JsonText::Str(s) => write_str(out, s),
            JsonText::Array(items) => {
                out.push(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    item.write(out);
                }
                out.push(b']');
            }
            JsonText::Object(members) => {
                out.push(b'{');
                for (i, (key, value)) in members.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    write_str(out, key);
                    out.push(b':');
                    value.write(out);
                }
                out.push(b'}');
            }
        }
    }
}

/// An array index as serde_json's `Value::pointer` reads one: decimal, no sign, no leading zero.
fn array_index(token: &str) -> Option<usize> {
    if token.starts_with('+') || (token.starts_with('0') && token.len() != 1) {
        return None;
    }
    token.parse().ok()
}

/// A recursive-descent reader; recursion is bounded by the depth limit.
struct Parser<'a> {
    text: &'a str,
    pos: usize,
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }

    fn eat(&mut self, byte: u8) -> bool {
        let found = self.peek() == Some(byte);
        if found {
            self.pos += 1;
        }
        found
    }

    fn expect(&mut self, byte: u8) -> Option<()> {
        self.eat(byte).then_some(())
    }

    fn skip_whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    /// A value nested `depth` levels deep.
    fn value(&mut self, depth: usize) -> Option<JsonText<'a>> {
        self.skip_whitespace();
        match self.peek()? {
            b'[' => self.array(enter(depth).ok()?),
            b'{' => self.object(enter(depth).ok()?),
            b'"' => self.string().map(JsonText::Str),
            b't' => self.word("true"),
            b'f' => self.word("false"),
            b'n' => self.word("null"),
            _ => self.number(),
        }
    }

    /// An array whose items are `depth` levels deep (the cursor is on its `[`).
    fn array(&mut self, depth: usize) -> Option<JsonText<'a>> {
        self.pos += 1;
        let mut items = Vec::new();
        self.skip_whitespace();
        if !self.eat(b']') {
            loop {
                items.push(self.value(depth)?);
                self.skip_whitespace();
                if self.eat(b']') {
                    break;
                }
                self.expect(b',')?;
            }
        }
        Some(JsonText::Array(items))
    }

    /// An object whose values are `depth` levels deep (the cursor is on its `{`).
    fn object(&mut self, depth: usize) -> Option<JsonText<'a>> {
        self.pos += 1;
        let mut members = Vec::new();
        self.skip_whitespace();
        if !self.eat(b'}') {
            loop {
                self.skip_whitespace();
                let key = self.string()?;
                self.skip_whitespace();
                self.expect(b':')?;
                members.push((key, self.value(depth)?));
                self.skip_whitespace();
                if self.eat(b'}') {
                    break;
                }
                self.expect(b',')?;
            }
        }
        members.sort_by(|a, b| a.0.cmp(&b.0));
        let unique = members.windows(2).all(|pair| pair[0].0 != pair[1].0);
        unique.then_some(JsonText::Object(members))
    }

    /// A string, unescaped.
    fn string(&mut self) -> Option<String> {
        self.expect(b'"')?;
        let mut out = String::new();
        loop {
            // Copy the run up to the next quote, backslash or control character; it ends on an
            // ASCII byte, so on a character boundary.
            let start = self.pos;
            while matches!(self.peek(), Some(b) if b != b'"' && b != b'\\' && b >= 0x20) {
                self.pos += 1;
            }
            out.push_str(self.text.get(start..self.pos)?);
            match self.peek()? {
                b'"' => {
                    self.pos += 1;
                    return Some(out);
                }
                b'\\' => {
                    self.pos += 1;
                    out.push(self.escape()?);
                }
                _ => return None, // a control character must be escaped
            }
        }
    }

    /// The character of an escape (the cursor is after its backslash).
    fn escape(&mut self) -> Option<char> {
        let byte = self.peek()?;
        self.pos += 1;
        Some(match byte {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let unit = self.hex4()?;
                if (0xd800..0xdc00).contains(&unit) {
                    // A high surrogate needs an escaped low one after it.
                    self.expect(b'\\')?;
                    self.expect(b'u')?;
                    let low = self.hex4()?;
                    if !(0xdc00..0xe000).contains(&low) {
                        return None;
                    }
                    char::from_u32(0x10000 + ((unit - 0xd800) << 10) + (low - 0xdc00))?
                } else {
                    // `None` for a lone low surrogate, which no string can hold.
                    char::from_u32(unit)?
                }
            }
            _ => return None,
        })
    }

    fn hex4(&mut self) -> Option<u32> {
        let digits = self.text.get(self.pos..self.pos + 4)?;
        if !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        self.pos += 4;
        u32::from_str_radix(digits, 16).ok()
    }

    fn word(&mut self, word: &'static str) -> Option<JsonText<'a>> {
        let end = self.pos + word.len();
        let found = self.text.get(self.pos..end)?;
        (found == word).then(|| {
            self.pos = end;
            JsonText::Atom(found)
        })
    }

    /// A number as written: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
    fn number(&mut self) -> Option<JsonText<'a>> {
        let start = self.pos;
        self.eat(b'-');
        if !self.eat(b'0') {
            self.digits()?;
        }
        if self.eat(b'.') {
            self.digits()?;
        }
        if self.eat(b'e') || self.eat(b'E') {
            if !self.eat(b'+') {
                self.eat(b'-');
            }
            self.digits()?;
        }
        self.text.get(start..self.pos).map(JsonText::Atom)
    }

    /// One or more decimal digits.
    fn digits(&mut self) -> Option<()> {
        let start = self.pos;
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.pos += 1;
        }
        (self.pos > start).then_some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MAX_FINGERPRINT_DEPTH;

    fn canonical(text: &str) -> Option<String> {
        JsonText::parse(text.as_bytes()).map(|v| String::from_utf8(v.canonical()).unwrap())
    }

    #[test]
    fn sorts_unescapes_and_keeps_numbers() {
        let cases = [
            (
                r#" { "b" : "q\"" , "a" : [ { "d" : 1 , "c" : null } ] } "#,
                r#"{"a":[{"c":null,"d":1}],"b":"q\""}"#,
            ),
            (
                "[100000000000000000001, 1.0, 1E+2, -0, 0.10000000000000000001e-7]",
                "[100000000000000000001,1.0,1E+2,-0,0.10000000000000000001e-7]",
            ),
            (
                r#"{"\u0062":"\/\b\f\n\r\t\u00e9\ud83d\ude00","a":true}"#,
                "{\"a\":true,\"b\":\"/\\b\\f\\n\\r\\té😀\"}",
            ),
            (r#"{"a b":1,"a":2}"#, r#"{"a":2,"a b":1}"#),
            ("\"\u{7f}é\"", "\"\u{7f}é\""),
            ("false", "false"),
        ];
        for (text, want) in cases {
            assert_eq!(canonical(text).as_deref(), Some(want), "{text}");
        }
    }

    /// Whatever this reader accepts, serde_json accepts too, and for bodies a `Value` holds
    /// exactly, both paths to the canonical form agree.
    #[test]
    fn agrees_with_serde_json() {
        for text in [
            r#"{"b":[1,-2,"x\u0000"],"a":{"z":null,"y":false},"":""}"#,
            "[[],{},[{}],-9223372036854775808,18446744073709551615]",
            r#""\u00e9\ud83d\ude00\"""#,
        ] {
            let value: serde_json::Value = serde_json::from_str(text).unwrap();
            let typed = super::super::to_canonical(&value).unwrap();
            assert_eq!(JsonText::parse(text.as_bytes()).unwrap().canonical(), typed);
        }
    }

    #[test]
    fn rejects_what_is_not_json() {
        for text in [
            "",
            " ",
            "{",
            "[1,]",
            "[,1]",
            "{\"a\":1,}",
            "{\"a\"}",
            "{a:1}",
            "01",
            "-",
            "1.",
            ".5",
            "1e",
            "+1",
            "0x1",
            "NaN",
            "Infinity",
            "tru",
            "nul",
            "truex",
            "[1] [2]",
            "'a'",
            "\"a",
            "\"\\x\"",
            "\"\\u12\"",
            "\"\\u+123\"",
            "\"\\ud800\"",
            "\"\\udc00\"",
            "\"\\ud800\\u0041\"",
            "\"tab\there\"",
            "{\"a\":1,\"a\":1}",
            "[{\"a\":1,\"b\":2,\"a\":3}]",
        ] {
            assert_eq!(canonical(text), None, "{text:?}");
        }
        assert_eq!(JsonText::parse(b"\"\xff\""), None);
    }

    #[test]
    fn depth_is_bounded() {
        let nest = |n: usize| "[".repeat(n) + &"]".repeat(n);
        assert!(JsonText::parse(nest(MAX_FINGERPRINT_DEPTH).as_bytes()).is_some());
        assert!(JsonText::parse(nest(MAX_FINGERPRINT_DEPTH + 1).as_bytes()).is_none());
        let objects = |n: usize| "{\"a\":".repeat(n) + "1" + &"}".repeat(n);
        assert!(JsonText::parse(objects(MAX_FINGERPRINT_DEPTH).as_bytes()).is_some());
        assert!(JsonText::parse(objects(MAX_FINGERPRINT_DEPTH + 1).as_bytes()).is_none());
        assert!(JsonText::parse(nest(100_000).as_bytes()).is_none());
    }

    #[test]
    fn pointers_find_as_serde_json_does() {
        let text = r#"{"a":{"b/c":[10,{"~":true}],"":1},"n":null,"0":"zero"}"#;
        let ours = JsonText::parse(text.as_bytes()).unwrap();
        let theirs: serde_json::Value = serde_json::from_str(text).unwrap();
        for pointer in [
            "",
            "/",
            "/a",
            "/a/",
            "/a/b~1c",
            "/a/b~1c/0",
            "/a/b~1c/1/~0",
            "/a/b~1c/01",
            "/a/b~1c/+1",
            "/a/b~1c/2",
            "/a/b~1c/-",
            "/n",
            "/n/x",
            "/0",
            "/x",
            "a",
        ] {
            let ours = ours.pointer(pointer).map(JsonText::canonical);
            let theirs = theirs
                .pointer(pointer)
                .map(|v| super::super::to_canonical(v).unwrap());
            assert_eq!(ours, theirs, "{pointer}");
        }
    }
}
