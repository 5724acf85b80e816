//! Go `encoding/json`'s scanner (`scanner.go`) as `json.Decoder` runs it for the first
//! value of a stream, with its error texts; plus the position arithmetic protobuf-go uses
//! in its errors (`internal/encoding/json/decode.go` `Position`).

const EOF: &str = "unexpected EOF";

/// The first JSON value's byte range, `None` for an empty or all-space body, or Go's error.
pub fn first_value(b: &[u8]) -> Result<Option<(usize, usize)>, String> {
    let mut p = Scanner { b, i: 0 };
    p.skip_ws();
    if p.i >= b.len() {
        return Ok(None);
    }
    let start = p.i;
    p.value()?;
    Ok(Some((start, p.i)))
}

struct Scanner<'a> {
    b: &'a [u8],
    i: usize,
}

fn err(c: u8, context: &str) -> String {
    format!("invalid character {} {context}", quote_char(c))
}

impl Scanner<'_> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    fn value(&mut self) -> Result<(), String> {
        match self.peek() {
            None => Err(EOF.to_owned()),
            Some(b'{') => self.object(),
            Some(b'[') => self.array(),
            Some(b'"') => self.string(),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b't') => self.literal(b"true"),
            Some(b'f') => self.literal(b"false"),
            Some(b'n') => self.literal(b"null"),
            Some(c) => Err(err(c, "looking for beginning of value")),
        }
    }

    fn object(&mut self) -> Result<(), String> {
        self.i += 1;
        self.skip_ws();
        match self.peek() {
            None => return Err(EOF.to_owned()),
            Some(b'}') => {
                self.i += 1;
                return Ok(());
            }
            Some(b'"') => {}
            Some(c) => return Err(err(c, "looking for beginning of object key string")),
        }
        loop {
            self.string()?;
            self.skip_ws();
            match self.peek() {
                None => return Err(EOF.to_owned()),
                Some(b':') => self.i += 1,
                Some(c) => return Err(err(c, "after object key")),
            }
            self.skip_ws();
            self.value()?;
            self.skip_ws();
            match self.peek() {
                None => return Err(EOF.to_owned()),
                Some(b',') => {
                    self.i += 1;
                    self.skip_ws();
                    match self.peek() {
                        None => return Err(EOF.to_owned()),
                        Some(b'"') => {}
                        Some(c) => {
                            return Err(err(c, "looking for beginning of object key string"));
                        }
                    }
                }
                Some(b'}') => {
                    self.i += 1;
                    return Ok(());
                }
                Some(c) => return Err(err(c, "after object key:value pair")),
            }
        }
    }

    fn array(&mut self) -> Result<(), String> {
        self.i += 1;
        self.skip_ws();
        if self.peek() == Some(b']') {
            self.i += 1;
            return Ok(());
        }
        loop {
            self.skip_ws();
            self.value()?;
            self.skip_ws();
            match self.peek() {
                None => return Err(EOF.to_owned()),
                Some(b',') => self.i += 1,
                Some(b']') => {
                    self.i += 1;
                    return Ok(());
                }
                Some(c) => return Err(err(c, "after array element")),
            }
        }
    }

    fn string(&mut self) -> Result<(), String> {
        self.i += 1;
        loop {
            match self.peek() {
                None => return Err(EOF.to_owned()),
                Some(b'"') => {
                    self.i += 1;
                    return Ok(());
                }
                Some(b'\\') => {
                    self.i += 1;
                    match self.peek() {
                        None => return Err(EOF.to_owned()),
                        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => self.i += 1,
                        Some(b'u') => {
                            self.i += 1;
                            for _ in 0..4 {
                                match self.peek() {
                                    None => return Err(EOF.to_owned()),
                                    Some(h) if h.is_ascii_hexdigit() => self.i += 1,
                                    Some(c) => {
                                        return Err(err(c, "in \\u hexadecimal character escape"));
                                    }
                                }
                            }
                        }
                        Some(c) => return Err(err(c, "in string escape code")),
                    }
                }
                Some(c) if c < 0x20 => return Err(err(c, "in string literal")),
                Some(_) => self.i += 1,
            }
        }
    }

    fn digits(&mut self) {
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.i += 1;
        }
    }

    fn need_digit(&mut self, context: &str) -> Result<(), String> {
        match self.peek() {
            None => Err(EOF.to_owned()),
            Some(b'0'..=b'9') => Ok(()),
            Some(c) => Err(err(c, context)),
        }
    }

    fn number(&mut self) -> Result<(), String> {
        if self.peek() == Some(b'-') {
            self.i += 1;
            self.need_digit("in numeric literal")?;
        }
        if self.peek() == Some(b'0') {
            self.i += 1;
        } else {
            self.digits();
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            self.need_digit("after decimal point in numeric literal")?;
            self.digits();
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.i += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.i += 1;
            }
            self.need_digit("in exponent of numeric literal")?;
            self.digits();
        }
        Ok(())
    }

    fn literal(&mut self, word: &[u8]) -> Result<(), String> {
        self.i += 1;
        for &expected in &word[1..] {
            match self.peek() {
                None => return Err(EOF.to_owned()),
                Some(c) if c == expected => self.i += 1,
                Some(c) => {
                    let context = format!(
                        "in literal {} (expecting {})",
                        String::from_utf8_lossy(word),
                        quote_char(expected)
                    );
                    return Err(err(c, &context));
                }
            }
        }
        Ok(())
    }
}

/// Go `quoteChar`: a byte shown as a (Latin-1) rune in single quotes.
fn quote_char(c: u8) -> String {
    match c {
        b'\'' => r"'\''".to_owned(),
        b'"' => "'\"'".to_owned(),
        c => format!("'{}'", quote_rune(char::from(c))),
    }
}

/// One rune as Go `strconv.Quote` writes it (without the quotes).
pub fn quote_rune(c: char) -> String {
    match c {
        '\u{7}' => "\\a".to_owned(),
        '\u{8}' => "\\b".to_owned(),
        '\u{c}' => "\\f".to_owned(),
        '\n' => "\\n".to_owned(),
        '\r' => "\\r".to_owned(),
        '\t' => "\\t".to_owned(),
        '\u{b}' => "\\v".to_owned(),
        '\\' => "\\\\".to_owned(),
        c if (c as u32) < 0x20 || c as u32 == 0x7f => format!("\\x{:02x}", c as u32),
        c if (0x80..=0xa0).contains(&(c as u32)) || c as u32 == 0xad || c.is_control() => {
            format!("\\u{:04x}", c as u32)
        }
        c => c.to_string(),
    }
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\n' | b'\r') {
        i += 1;
    }
    i
}

fn skip_string(b: &[u8], mut i: usize) -> usize {
    i += 1;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            b'"' => return i + 1,
            _ => i += 1,
        }
    }
    i
}

fn skip_scalar(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && !matches!(b[i], b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r') {
        i += 1;
    }
    i
}

fn skip_value(b: &[u8], i: usize) -> usize {
    match b.get(i) {
        Some(b'"') => skip_string(b, i),
        Some(&open @ (b'{' | b'[')) => {
            let close = if open == b'{' { b'}' } else { b']' };
            let mut j = skip_ws(b, i + 1);
            if b.get(j) == Some(&close) {
                return j + 1;
            }
            loop {
                if open == b'{' {
                    j = skip_string(b, j);
                    j = skip_ws(b, j) + 1;
                    j = skip_ws(b, j);
                }
                j = skip_ws(b, skip_value(b, j));
                match b.get(j) {
                    Some(b',') => j = skip_ws(b, j + 1),
                    _ => return j + 1,
                }
            }
        }
        _ => skip_scalar(b, i),
    }
}

/// A field of a request message, for [`check_protojson`].
pub struct Field {
    pub name: &'static str,
    pub kind: Kind,
}

pub enum Kind {
    Str,
    Message(&'static [Field]),
    Repeated(&'static [Field]),
    /// `google.protobuf.Struct`
    Struct,
    /// `google.protobuf.Int32Value`
    Int32Wrapper,
    Enum,
}

/// protojson's `Unmarshal` with `DiscardUnknown` over an already well-formed JSON value,
/// in document order, stopping at the first error as protobuf-go does
/// (`encoding/protojson/decode.go`): unknown fields skipped, a repeated field name
/// (`duplicate field`), a repeated Struct key (`duplicate map key`), `null` meaning unset,
/// a message from anything but an object (`syntax error …: unexpected token`), a badly
/// typed scalar (`invalid value for <kind> field <name>`). Positions are protobuf-go's:
/// line and rune column from the first byte of the value.
pub fn check_protojson(raw: &[u8], fields: &[Field]) -> Result<(), String> {
    let mut w = Walker {
        b: raw,
        i: skip_ws(raw, 0),
    };
    w.message(fields)
}

struct Walker<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Walker<'a> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn ws(&mut self) {
        self.i = skip_ws(self.b, self.i);
    }

    fn error_at(&self, pos: usize, message: &str) -> String {
        let (line, column) = line_col(self.b, pos);
        format!("proto: (line {line}:{column}): {message}")
    }

    fn unexpected(&self) -> String {
        let (line, column) = line_col(self.b, self.i);
        format!(
            "proto: syntax error (line {line}:{column}): unexpected token {}",
            raw_token(self.b, self.i)
        )
    }

    fn invalid(&self, kind: &str, name: &str) -> String {
        let token = raw_token(self.b, self.i);
        self.error_at(
            self.i,
            &format!("invalid value for {kind} field {name}: {token}"),
        )
    }

    /// An object key at `self.i`: its raw token and its decoded text; moves past the `:`.
    fn key(&mut self) -> (&'a [u8], std::borrow::Cow<'a, str>) {
        let start = self.i;
        let end = skip_string(self.b, start);
        let raw = &self.b[start..end];
        let inner = &raw[1..raw.len() - 1];
        let name = if inner.contains(&b'\\') {
            std::borrow::Cow::Owned(serde_json::from_slice::<String>(raw).unwrap_or_default())
        } else {
            String::from_utf8_lossy(inner)
        };
        self.i = skip_ws(self.b, end) + 1;
        self.ws();
        (raw, name)
    }

    fn message(&mut self, fields: &[Field]) -> Result<(), String> {
        if self.peek() != Some(b'{') {
            return Err(self.unexpected());
        }
        self.i += 1;
        let mut seen = 0u64;
        loop {
            self.ws();
            if self.peek() != Some(b'"') {
                self.i += 1; // the closing brace
                return Ok(());
            }
            let key_pos = self.i;
            let (raw_key, name) = self.key();
            match fields.iter().position(|f| f.name == name) {
                None => self.i = skip_value(self.b, self.i),
                Some(n) => {
                    if seen & (1 << n) != 0 {
                        let message =
                            format!("duplicate field {}", String::from_utf8_lossy(raw_key));
                        return Err(self.error_at(key_pos, &message));
                    }
                    seen |= 1 << n;
                    self.field(&fields[n])?;
                }
            }
            self.ws();
            if self.peek() == Some(b',') {
                self.i += 1;
            }
        }
    }

    fn field(&mut self, field: &Field) -> Result<(), String> {
        // `null` leaves any of these fields unset.
        if self.b[self.i..].starts_with(b"null") {
            self.i += 4;
            return Ok(());
        }
        match field.kind {
            Kind::Str => {
                if self.peek() != Some(b'"') {
                    return Err(self.invalid("string", field.name));
                }
                self.i = skip_string(self.b, self.i);
            }
            Kind::Message(fields) => self.message(fields)?,
            Kind::Repeated(fields) => {
                if self.peek() != Some(b'[') {
                    return Err(self.unexpected());
                }
                self.i += 1;
                loop {
                    self.ws();
                    if self.peek() == Some(b']') {
                        self.i += 1;
                        break;
                    }
                    self.message(fields)?;
                    self.ws();
                    if self.peek() == Some(b',') {
                        self.i += 1;
                    }
                }
            }
            Kind::Struct => self.struct_value()?,
            Kind::Int32Wrapper => {
                if !self.int32_token() {
                    return Err(self.invalid("int32", "value"));
                }
                self.i = skip_value(self.b, self.i);
            }
            Kind::Enum => {
                // A name (unknown ones are discarded) or an int32.
                if self.peek() != Some(b'"') && !self.int32_token() {
                    return Err(self.invalid("enum", field.name));
                }
                self.i = skip_value(self.b, self.i);
            }
        }
        Ok(())
    }

    fn int32_token(&self) -> bool {
        let end = skip_value(self.b, self.i);
        serde_json::from_slice::<serde_json::Value>(&self.b[self.i..end])
            .ok()
            .and_then(|v| super::json_int32(&v))
            .is_some()
    }

    /// A `google.protobuf.Struct`: an object whose keys may not repeat, at any depth.
    fn struct_value(&mut self) -> Result<(), String> {
        if self.peek() != Some(b'{') {
            return Err(self.unexpected());
        }
        self.i += 1;
        let mut keys: Vec<std::borrow::Cow<'a, str>> = Vec::new();
        loop {
            self.ws();
            if self.peek() != Some(b'"') {
                self.i += 1;
                return Ok(());
            }
            let key_pos = self.i;
            let (raw_key, name) = self.key();
            if keys.contains(&name) {
                let message = format!("duplicate map key {}", String::from_utf8_lossy(raw_key));
                return Err(self.error_at(key_pos, &message));
            }
            keys.push(name);
            self.any_value()?;
            self.ws();
            if self.peek() == Some(b',') {
                self.i += 1;
            }
        }
    }

    /// A `google.protobuf.Value`.
    fn any_value(&mut self) -> Result<(), String> {
        match self.peek() {
            Some(b'{') => self.struct_value(),
            Some(b'[') => {
                self.i += 1;
                loop {
                    self.ws();
                    if self.peek() == Some(b']') {
                        self.i += 1;
                        return Ok(());
                    }
                    self.any_value()?;
                    self.ws();
                    if self.peek() == Some(b',') {
                        self.i += 1;
                    }
                }
            }
            _ => {
                self.i = skip_value(self.b, self.i);
                Ok(())
            }
        }
    }
}

/// The token at `pos` as protobuf-go's `Token.RawString` shows it.
pub fn raw_token(raw: &[u8], pos: usize) -> String {
    let end = match raw.get(pos) {
        None => pos,
        Some(b'{' | b'[') => pos + 1,
        Some(b'"') => skip_string(raw, pos),
        Some(_) => skip_scalar(raw, pos),
    };
    String::from_utf8_lossy(&raw[pos..end.min(raw.len())]).into_owned()
}

/// protobuf-go `Decoder.Position`: 1-based line, and rune column.
pub fn line_col(raw: &[u8], pos: usize) -> (usize, usize) {
    let before = &raw[..pos.min(raw.len())];
    let line = before.iter().filter(|&&c| c == b'\n').count() + 1;
    let line_start = before
        .iter()
        .rposition(|&c| c == b'\n')
        .map_or(0, |p| p + 1);
    let column = String::from_utf8_lossy(&before[line_start..])
        .chars()
        .count()
        + 1;
    (line, column)
}
