//! Requests as grpc-gateway decodes them: Go `encoding/json` first, then protojson with
//! `DiscardUnknown`; query strings as Go parses them.

use super::*;

use serde_json::{Map, Value};

/// grpc-gateway's `decodeJSONPb`, up to the point where protojson accepts the body: Go's
/// `json.Decoder` reads the first value into a `json.RawMessage` (an empty body is `io.EOF`,
/// which the generated code accepts as an empty request; bytes after the first value are never
/// read), then protojson unmarshals it with `DiscardUnknown`. Returns
/// the raw first value (`None` for an empty body) or the error answer.
pub(super) fn gw_decode<'b>(
    body: &'b [u8],
    schema: &[gojson::Field],
) -> Result<Option<&'b [u8]>, Reply> {
    match gojson::first_value(body) {
        Ok(None) => Ok(None),
        Ok(Some((start, end))) => {
            let raw = &body[start..end];
            match gojson::check_protojson(raw, schema) {
                Ok(()) => Ok(Some(raw)),
                Err(msg) => Err(Reply::invalid_argument(&msg)),
            }
        }
        Err(msg) => Err(Reply::invalid_argument(&msg)),
    }
}

/// The value of a body protojson accepted (syntax and field types are already checked).
pub(super) fn accepted_json(raw: &[u8]) -> Result<Value, Reply> {
    serde_json::from_slice(raw)
        // Not reachable for a body Go accepted, short of invalid UTF-8 or an absurd number.
        .map_err(|e| Reply::invalid_argument(&format!("proto: {e}")))
}

/// A Write body, decoded. Once protojson's rules have accepted it, most bodies go through a
/// borrowing, allocation-light typed parse; the few it declines (a badly typed field that is
/// unknown where it stands, such as a delete's `condition`) go through `serde_json::Value`.
pub(super) enum ParsedWrite<'b> {
    Empty,
    Fast(fastjson::WriteBody<'b>),
    Slow(Value),
}

impl<'b> ParsedWrite<'b> {
    pub(super) fn decode(body: &'b [u8]) -> Result<Self, Reply> {
        let Some(raw) = gw_decode(body, schema::WRITE_REQUEST)? else {
            return Ok(ParsedWrite::Empty);
        };
        if let Ok(fast) = serde_json::from_slice(raw) {
            return Ok(ParsedWrite::Fast(fast));
        }
        accepted_json(raw).map(ParsedWrite::Slow)
    }

    pub(super) fn request(&self) -> WriteReq<'_> {
        match self {
            ParsedWrite::Empty => WriteReq {
                writes: None,
                deletes: None,
                model_id: "",
            },
            ParsedWrite::Fast(body) => body.request(),
            ParsedWrite::Slow(value) => WriteReq::from_value(value),
        }
    }
}

// Lenient accessors for a `Value` that protojson's rules already accepted: a field of the
// wrong type can only be one that is unknown where it stands, which protojson skips.

pub(super) fn v_str<'v>(m: &'v Map<String, Value>, name: &str) -> &'v str {
    m.get(name).and_then(Value::as_str).unwrap_or("")
}

pub(super) fn v_obj<'v>(m: &'v Map<String, Value>, name: &str) -> Option<&'v Map<String, Value>> {
    m.get(name).and_then(Value::as_object)
}

pub(super) fn v_list<'v>(
    m: &'v Map<String, Value>,
    name: &str,
) -> impl Iterator<Item = &'v Map<String, Value>> + 'v {
    m.get(name)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object)
}

#[derive(Clone, Copy)]
pub(super) struct CondIn<'v> {
    pub(super) name: &'v str,
    pub(super) context: Option<&'v Map<String, Value>>,
}

#[derive(Clone, Copy)]
pub(super) struct TK<'v> {
    pub(super) user: &'v str,
    pub(super) relation: &'v str,
    pub(super) object: &'v str,
    pub(super) condition: Option<CondIn<'v>>,
}

pub(super) struct TupleList<'v> {
    pub(super) keys: Vec<TK<'v>>,
    /// `on_duplicate` or `on_missing`.
    pub(super) option: &'v str,
}

/// `WriteRequest` (api `openfga/v1/openfga_service.proto`). Unknown fields are dropped, as
/// `DiscardUnknown` does; `store_id` comes from the path.
pub(super) struct WriteReq<'v> {
    pub(super) writes: Option<TupleList<'v>>,
    pub(super) deletes: Option<TupleList<'v>>,
    pub(super) model_id: &'v str,
}

impl<'v> WriteReq<'v> {
    pub(super) fn from_value(v: &'v Value) -> Self {
        let Some(top) = v.as_object() else {
            return WriteReq {
                writes: None,
                deletes: None,
                model_id: "",
            };
        };
        let list = |field: &str, option: &str, with_condition: bool| {
            v_obj(top, field).map(|msg| TupleList {
                keys: v_list(msg, "tuple_keys")
                    .map(|k| TK {
                        user: v_str(k, "user"),
                        relation: v_str(k, "relation"),
                        object: v_str(k, "object"),
                        // TupleKeyWithoutCondition has no `condition`: unknown, skipped.
                        condition: v_obj(k, "condition").filter(|_| with_condition).map(|c| {
                            CondIn {
                                name: v_str(c, "name"),
                                context: v_obj(c, "context"),
                            }
                        }),
                    })
                    .collect(),
                option: v_str(msg, option),
            })
        };
        WriteReq {
            writes: list("writes", "on_duplicate", true),
            deletes: list("deletes", "on_missing", false),
            model_id: v_str(top, "authorization_model_id"),
        }
    }

    pub(super) fn all_keys(&self) -> impl Iterator<Item = (&'v str, &'v str, &'v str)> + '_ {
        self.writes
            .iter()
            .chain(self.deletes.iter())
            .flat_map(|l| l.keys.iter().map(|k| (k.user, k.relation, k.object)))
    }

    /// The protobuf encoding size of the request gRPC receives.
    pub(super) fn proto_size(&self, store_id: &str) -> usize {
        let list = |l: &TupleList<'_>| -> usize {
            l.keys
                .iter()
                .map(|k| {
                    let cond = k.condition.map_or(0, |c| {
                        len_field(
                            str_field(c.name) + c.context.map_or(0, |m| len_field(struct_size(m))),
                        )
                    });
                    len_field(
                        str_field(k.user) + str_field(k.relation) + str_field(k.object) + cond,
                    )
                })
                .sum::<usize>()
                + str_field(l.option)
        };
        str_field(store_id)
            + self.writes.as_ref().map_or(0, |l| len_field(list(l)))
            + self.deletes.as_ref().map_or(0, |l| len_field(list(l)))
            + str_field(self.model_id)
    }
}

#[derive(Clone, Copy, Default)]
pub(super) struct ReadKey<'v> {
    pub(super) user: &'v str,
    pub(super) relation: &'v str,
    pub(super) object: &'v str,
}

/// `ReadRequest`.
pub(super) struct ReadReq<'v> {
    pub(super) tuple_key: Option<ReadKey<'v>>,
    pub(super) page_size: Option<i64>,
    pub(super) token: &'v str,
    pub(super) consistency: i64,
}

impl<'v> ReadReq<'v> {
    pub(super) fn from_value(top: &'v Map<String, Value>) -> Self {
        ReadReq {
            tuple_key: v_obj(top, "tuple_key").map(|tk| ReadKey {
                user: v_str(tk, "user"),
                relation: v_str(tk, "relation"),
                object: v_str(tk, "object"),
            }),
            // google.protobuf.Int32Value: a number or a numeric string.
            page_size: top.get("page_size").and_then(json_int32),
            token: v_str(top, "continuation_token"),
            // An enum: a number, or a name (unknown names are dropped by DiscardUnknown).
            consistency: match top.get("consistency") {
                Some(Value::String(s)) => match s.as_str() {
                    "MINIMIZE_LATENCY" => 100,
                    "HIGHER_CONSISTENCY" => 200,
                    _ => 0,
                },
                Some(v) => json_int32(v).unwrap_or(0),
                None => 0,
            },
        }
    }
}

/// protojson's int32 reading: an integral number (or a string holding one) within range.
pub(super) fn json_int32(v: &Value) -> Option<i64> {
    let f = match v {
        Value::Number(n) => n.as_f64()?,
        Value::String(s) if !s.is_empty() && s.trim() == s => s.parse::<f64>().ok()?,
        _ => return None,
    };
    (f.fract() == 0.0 && f >= f64::from(i32::MIN) && f <= f64::from(i32::MAX)).then_some(f as i64)
}

/// Go `strconv.ParseInt(value, 10, 32)` and its error text.
pub(super) fn parse_go_int32(value: &str) -> Result<i64, String> {
    let digits = value.strip_prefix(['+', '-']).unwrap_or(value);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "strconv.ParseInt: parsing \"{value}\": invalid syntax"
        ));
    }
    match value.parse::<i128>() {
        Ok(n) if n >= i128::from(i32::MIN) && n <= i128::from(i32::MAX) => Ok(n as i64),
        _ => Err(format!(
            "strconv.ParseInt: parsing \"{value}\": value out of range"
        )),
    }
}

/// Go `url.ParseQuery` (what `Request.ParseForm` uses): `&`-separated, `+` is a space,
/// `%XX` escapes; a semicolon or a bad escape is an error.
pub(super) fn parse_query(query: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for part in query.split('&') {
        if part.is_empty() {
            continue;
        }
        if part.contains(';') {
            return Err("invalid semicolon separator in query".to_owned());
        }
        let (k, v) = part.split_once('=').unwrap_or((part, ""));
        out.push((unescape_query(k)?, unescape_query(v)?));
    }
    Ok(out)
}

pub(super) fn unescape_query(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = |c: u8| (c as char).to_digit(16);
                match (
                    b.get(i + 1).copied().and_then(hex),
                    b.get(i + 2).copied().and_then(hex),
                ) {
                    (Some(h), Some(l)) => out.push((h * 16 + l) as u8),
                    _ => {
                        let bad: String = s[i..].chars().take(3).collect();
                        return Err(format!("invalid URL escape \"{bad}\""));
                    }
                }
                i += 2;
            }
            c => out.push(c),
        }
        i += 1;
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}
