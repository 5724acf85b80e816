//! Encodings: JSON text as protojson and Go write it, protobuf sizes, timestamps, continuation
//! tokens.

use super::*;
use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};

/// JSON string escaping as protojson (and serde_json) do it.
pub(super) fn write_json_str(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Go `encoding/json` escaping with `SetEscapeHTML(false)`: the same, plus U+2028 and U+2029.
pub(super) fn write_go_json_str(s: &str, out: &mut String) {
    let mut tmp = String::with_capacity(s.len() + 2);
    write_json_str(s, &mut tmp);
    if tmp.contains(['\u{2028}', '\u{2029}']) {
        tmp = tmp
            .replace('\u{2028}', "\\u2028")
            .replace('\u{2029}', "\\u2029");
    }
    out.push_str(&tmp);
}

/// Go `strconv.Quote`, close enough for the control characters it is used for.
pub(super) fn go_quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c => out.push_str(&gojson::quote_rune(c)),
        }
    }
    out.push('"');
    out
}

/// A JSON value as a `google.protobuf.Value` prints it: objects with sorted keys, numbers as
/// doubles (protobuf-go `appendFloat`).
pub(super) fn write_canonical(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&format_double(n.as_f64().unwrap_or(0.0))),
        Value::String(s) => write_json_str(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        Value::Object(m) => write_canonical_object(m, out),
    }
}

pub(super) fn write_canonical_object(m: &Map<String, Value>, out: &mut String) {
    let mut keys: Vec<&String> = m.keys().collect();
    keys.sort();
    out.push('{');
    for (i, k) in keys.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_json_str(k, out);
        out.push(':');
        write_canonical(&m[k], out);
    }
    out.push('}');
}

/// protobuf-go `appendFloat` for a double: `%f`-style shortest digits, `e` notation below 1e-6
/// and from 1e21 (`1e+21`, `1e-7`). Negative zero prints as 0 so equal values compare equal.
pub(super) fn format_double(f: f64) -> String {
    if f == 0.0 {
        return "0".to_owned();
    }
    let a = f.abs();
    if (1e-6..1e21).contains(&a) {
        format!("{f}")
    } else {
        let s = format!("{f:e}");
        match s.split_once('e') {
            Some((m, e)) if !e.starts_with('-') => format!("{m}e+{e}"),
            _ => s,
        }
    }
}

pub(super) fn varint_len(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

/// A length-delimited field with a one-byte tag.
pub(super) fn len_field(payload: usize) -> usize {
    1 + varint_len(payload as u64) + payload
}

/// A proto3 string field (omitted when empty).
pub(super) fn str_field(s: &str) -> usize {
    if s.is_empty() { 0 } else { len_field(s.len()) }
}

/// `proto.Size` of a `google.protobuf.Struct`: map entries always carry key and value.
pub(super) fn struct_size(m: &Map<String, Value>) -> usize {
    m.iter()
        .map(|(k, v)| len_field(len_field(k.len()) + len_field(value_size(v))))
        .sum()
}

/// `proto.Size` of a `google.protobuf.Value` (a oneof: always encoded).
pub(super) fn value_size(v: &Value) -> usize {
    match v {
        Value::Null | Value::Bool(_) => 2,
        Value::Number(_) => 9,
        Value::String(s) => len_field(s.len()),
        Value::Object(m) => len_field(struct_size(m)),
        Value::Array(items) => len_field(items.iter().map(|i| len_field(value_size(i))).sum()),
    }
}

/// A `google.protobuf.Timestamp` as protojson prints it; microseconds, as PostgreSQL keeps.
pub(super) fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let micros = d.subsec_micros();
    let (days, sod) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let mut s = format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60
    );
    if micros != 0 {
        if micros.is_multiple_of(1000) {
            let _ = write!(s, ".{:03}", micros / 1000);
        } else {
            let _ = write!(s, ".{micros:06}");
        }
    }
    s.push('Z');
    s
}

pub(super) const B64: &[u8; 64] =
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// Go `base64.URLEncoding` (padded), as OpenFGA's token encoder uses.
pub(super) fn b64url_encode(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(B64[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

pub(super) fn b64url_decode(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(4) {
        return None;
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len() / 4 * 3);
    for (ci, chunk) in b.chunks(4).enumerate() {
        let last = ci == b.len() / 4 - 1;
        let pad = chunk.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 || (pad > 0 && !last) {
            return None;
        }
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            let v = if i >= 4 - pad {
                0
            } else {
                B64.iter().position(|&x| x == c)? as u32
            };
            n = (n << 6) | v;
        }
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..3 - pad]);
    }
    Some(out)
}

/// A continuation token: base64url of UTF-8 text; "" for none; None when it does not decode.
pub(super) fn decode_token(token: &str) -> Option<String> {
    if token.is_empty() {
        return Some(String::new());
    }
    String::from_utf8(b64url_decode(token)?).ok()
}

/// A recorded body as JSON for `WriteRecord::body`: its first JSON value (all the server ever
/// reads), `Null` for an empty body, the text itself when that is not JSON.
pub(super) fn body_as_json(body: &[u8]) -> Value {
    let as_text = || Value::String(String::from_utf8_lossy(body).into_owned());
    match gojson::first_value(body) {
        Ok(None) => Value::Null,
        Ok(Some((start, end))) => {
            serde_json::from_slice(&body[start..end]).unwrap_or_else(|_| as_text())
        }
        Err(_) => as_text(),
    }
}
