//! The outbox payload: `{"writes": [TupleKey...], "deletes": [TupleKey...]}`, and optionally
//! the OpenFGA store and model it is for (`"store_id"`, `"authorization_model_id"`, the names
//! OpenFGA's API uses).
//!
//! A payload that OpenFGA could never accept is rejected here, with a reason that names the
//! offending field, so that its row is dead-lettered at once instead of being sent again and
//! again. The field rules are OpenFGA's own request validation (the protoc-gen-validate rules on
//! its `TupleKey` and `RelationshipCondition` messages), each check naming the rule it mirrors:
//! checking them here is never stricter than the server.

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

/// One relationship tuple's identity: OpenFGA allows it once per Write, and the relay orders
/// operations per tuple.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TupleKey {
    pub object: String,
    pub relation: String,
    pub user: String,
}

impl fmt::Display for TupleKey {
    /// OpenFGA's own notation: `object#relation@user`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}@{}", self.object, self.relation, self.user)
    }
}

/// A condition on a written tuple, passed to OpenFGA as given.
#[derive(Clone, Debug, PartialEq)]
pub struct Condition {
    pub name: String,
    /// Always an object, `{}` when the payload gave none: OpenFGA's datastores read a stored
    /// condition back with an empty context, and with `on_duplicate: "ignore"` a rewrite
    /// without `context` would not equal it and answer 409 instead of being a no-op.
    pub context: Map<String, Value>,
}

impl Condition {
    /// `{"name", "context"}`, as OpenFGA returns a stored condition.
    pub fn to_value(&self) -> Value {
        serde_json::json!({"name": self.name, "context": Value::Object(self.context.clone())})
    }
}

/// Whether two conditions (`{"name", "context"}`) are the same for OpenFGA: its context is a
/// protobuf Struct, whose numbers are doubles (`1` and `1.0` are one value, and an integer
/// beyond 2^53 comes back rounded).
pub fn same_condition(expected: Option<&Value>, held: Option<&Value>) -> bool {
    match (expected, held) {
        (None, None) => true,
        (Some(a), Some(b)) => as_struct(a) == as_struct(b),
        _ => false,
    }
}

/// A JSON value as a protobuf Struct holds it: every number a double.
fn as_struct(v: &Value) -> Value {
    match v {
        Value::Number(n) => n
            .as_f64()
            .and_then(serde_json::Number::from_f64)
            .map_or_else(|| v.clone(), Value::Number),
        Value::Array(items) => Value::Array(items.iter().map(as_struct).collect()),
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| (k.clone(), as_struct(v)))
                .collect::<Map<_, _>>(),
        ),
        other => other.clone(),
    }
}

/// One operation of a row.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    Write {
        key: TupleKey,
        condition: Option<Condition>,
    },
    Delete {
        key: TupleKey,
    },
}

impl Op {
    pub fn key(&self) -> &TupleKey {
        match self {
            Op::Write { key, .. } | Op::Delete { key } => key,
        }
    }

    pub fn is_write(&self) -> bool {
        matches!(self, Op::Write { .. })
    }
}

/// A valid payload: its operations, writes first, each tuple at most once, and where they go.
#[derive(Clone, Debug, PartialEq)]
pub struct Payload {
    pub ops: Arc<[Op]>,
    /// The store the row names (`store_id`); `None`: the relay's configured store.
    pub store: Option<Arc<str>>,
    /// The model the row names (`authorization_model_id`); `None`: the store's default (for
    /// the configured store, the configured model; for another, its latest).
    pub model: Option<Arc<str>>,
}

/// Why a payload can never be delivered.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("malformed payload: {0}")]
pub struct PayloadError(pub String);

fn bad(msg: impl Into<String>) -> PayloadError {
    PayloadError(msg.into())
}

/// One JSON value, looked at one level deep: the levels below stay unread text.
///
/// PostgreSQL's jsonb takes documents that a full parse refuses (a number beyond a double,
/// nesting deeper than the parser's recursion limit). Keys the relay ignores may hold anything
/// jsonb holds, so they are only checked to be well-formed JSON (without evaluating numbers or
/// recursing), never decoded.
enum Node<'a> {
    Null,
    Bool,
    Number,
    String(String),
    Array(Vec<&'a RawValue>),
    Object(Members<'a>),
}

/// An object's members, one level deep, with their keys borrowed from the text where they hold
/// no escapes: the relay reads thousands of rows a second, and owning each key cost it an
/// allocation a field.
struct Members<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'a> Members<'a> {
    /// The value of `key`; the last one where a document repeats it, as a JSON parser that
    /// keeps one value a key does (jsonb keeps the last).
    fn get(&self, key: &str) -> Option<&&'a RawValue> {
        self.0.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v)
    }
}

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Each;
        impl<'de> Visitor<'de> for Each {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Members<'de>, M::Error> {
                let mut members = Vec::with_capacity(map.size_hint().unwrap_or(4));
                while let Some(Key(k)) = map.next_key()? {
                    members.push((k, map.next_value()?));
                }
                Ok(Members(members))
            }
        }
        d.deserialize_map(Each)
    }
}

/// An object's key: borrowed from the text unless it holds an escape.
struct Key<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Text;
        impl<'de> Visitor<'de> for Text {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v)))
            }
        }
        d.deserialize_str(Text)
    }
}

/// Where a value is in the payload (`writes[3].condition.name`), for the reason a row is
/// refused: written out only when one is, not for every field of every row read.
#[derive(Clone, Copy)]
struct At<'a> {
    parent: Option<&'a At<'a>>,
    step: Step<'a>,
}

#[derive(Clone, Copy)]
enum Step<'a> {
    Key(&'a str),
    Index(usize),
}

impl<'a> At<'a> {
    /// A top-level key.
    fn top(key: &'a str) -> At<'a> {
        At {
            parent: None,
            step: Step::Key(key),
        }
    }

    fn key(&'a self, key: &'a str) -> At<'a> {
        At {
            parent: Some(self),
            step: Step::Key(key),
        }
    }

    fn index(&'a self, i: usize) -> At<'a> {
        At {
            parent: Some(self),
            step: Step::Index(i),
        }
    }
}

impl fmt::Display for At<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(parent) = self.parent {
            parent.fmt(f)?;
        }
        match (self.step, self.parent) {
            (Step::Key(k), None) => f.write_str(k),
            (Step::Key(k), Some(_)) => write!(f, ".{k}"),
            (Step::Index(i), _) => write!(f, "[{i}]"),
        }
    }
}

impl<'a> Node<'a> {
    fn read(raw: &'a RawValue) -> Result<Node<'a>, serde_json::Error> {
        let text = raw.get();
        Ok(match text.trim_start().as_bytes().first() {
            Some(b'{') => Node::Object(serde_json::from_str(text)?),
            Some(b'[') => Node::Array(serde_json::from_str(text)?),
            Some(b'"') => Node::String(serde_json::from_str(text)?),
            Some(b'n') => Node::Null,
            Some(b't' | b'f') => Node::Bool,
            _ => Node::Number,
        })
    }

    fn type_name(&self) -> &'static str {
        match self {
            Node::Null => "null",
            Node::Bool => "a boolean",
            Node::Number => "a number",
            Node::String(_) => "a string",
            Node::Array(_) => "an array",
            Node::Object(_) => "an object",
        }
    }
}

/// Reads the value at `path`; `None` for an absent key or `null`.
fn node<'a>(path: At<'_>, raw: Option<&&'a RawValue>) -> Result<Option<Node<'a>>, PayloadError> {
    let Some(raw) = raw else { return Ok(None) };
    match Node::read(raw) {
        Ok(Node::Null) => Ok(None),
        Ok(n) => Ok(Some(n)),
        Err(e) => Err(bad(format!("{path} cannot be read: {e}"))),
    }
}

/// Longest `user`, in bytes (OpenFGA's `TupleKey.user`: `max_bytes: 512`).
const MAX_USER_BYTES: usize = 512;
/// Longest `relation`, in characters (OpenFGA's `TupleKey.relation`: `^[^:#@\s]{1,50}$`).
const MAX_RELATION_CHARS: usize = 50;
/// Shortest and longest `object` and condition `name`, in characters (OpenFGA's
/// `TupleKey.object` and `RelationshipCondition.name`: `^[^\s]{2,256}$`).
const MIN_OBJECT_CHARS: usize = 2;
const MAX_OBJECT_CHARS: usize = 256;

/// Length of an OpenFGA id (a ULID).
const ULID_CHARS: usize = 26;

/// OpenFGA's rule for `store_id` and `authorization_model_id` in a Write:
/// `^[ABCDEFGHJKMNPQRSTVWXYZ0-9]{26}$` (a ULID in Crockford's base32, upper case).
fn is_openfga_id(s: &str) -> bool {
    s.len() == ULID_CHARS
        && s.bytes().all(|b| {
            b.is_ascii_digit()
                || (b.is_ascii_uppercase() && !matches!(b, b'I' | b'L' | b'O' | b'U'))
        })
}

/// The id at top-level key `field`: absent or null for none. An empty model id is OpenFGA's
/// "the latest" too; an empty store id names no store, and OpenFGA refuses it.
fn parse_id(
    field: &str,
    raw: Option<&&RawValue>,
    empty_is_none: bool,
) -> Result<Option<Arc<str>>, PayloadError> {
    match node(At::top(field), raw)? {
        None => Ok(None),
        Some(Node::String(s)) if s.is_empty() && empty_is_none => Ok(None),
        Some(Node::String(s)) if is_openfga_id(&s) => Ok(Some(s.into())),
        Some(Node::String(s)) => Err(bad(format!(
            "\"{field}\" {s:?} is not an OpenFGA id ({ULID_CHARS} characters of 0-9 and A-Z \
             without I, L, O, U, as OpenFGA gives them)"
        ))),
        Some(other) => Err(bad(format!(
            "\"{field}\" must be a string, found {}",
            other.type_name()
        ))),
    }
}

/// The value of a command's `--store` (`retry`, `prune`): the store id rows name, or `none` for
/// the rows that name no store (they go to the relay's configured store); as the SQL compares
/// it, `""` for `none`.
pub fn store_filter(value: &str) -> Result<String, String> {
    match value.trim() {
        "none" => Ok(String::new()),
        id if is_openfga_id(id) => Ok(id.to_owned()),
        other => Err(format!(
            "{other:?} is neither an OpenFGA store id nor \"none\" (the rows naming no store)"
        )),
    }
}

/// `\s` as OpenFGA's validation rules mean it: Go's RE2 class `[\t\n\f\r ]`, ASCII only (no
/// vertical tab, no no-break space, no U+3000: OpenFGA accepts those in a tuple).
fn is_re2_space(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\x0C' | '\r' | ' ')
}

impl Payload {
    /// Checks a payload given as a JSON value (as the tests and tools build them).
    pub fn parse(value: &Value) -> Result<Payload, PayloadError> {
        Payload::parse_text(&value.to_string())
    }

    /// Checks a payload as stored in the outbox, from its JSON text (`payload::text`). Never
    /// panics, whatever the text: a document that cannot be read is an error that says why.
    pub fn parse_text(text: &str) -> Result<Payload, PayloadError> {
        // An object (every row the relay can deliver) is read, and checked to be JSON, in one
        // walk of the text; anything else, and an object that cannot be read, is looked at
        // again step by step, to say what is wrong with it.
        let members = text.trim_start().starts_with('{');
        let Some(obj) = members
            .then(|| serde_json::from_str::<Members>(text).ok())
            .flatten()
        else {
            return Err(refusal(text));
        };
        let mut ops = Vec::new();
        for (field, is_write) in [("writes", true), ("deletes", false)] {
            let list = At::top(field);
            let items = match node(list, obj.get(field))? {
                None => continue,
                Some(Node::Array(items)) => items,
                Some(other) => {
                    return Err(bad(format!(
                        "\"{field}\" must be an array of tuple keys, found {}",
                        other.type_name()
                    )));
                }
            };
            for (i, item) in items.into_iter().enumerate() {
                ops.push(parse_op(list.index(i), item, is_write)?);
            }
        }
        if ops.is_empty() {
            return Err(bad(
                "no tuples: \"writes\" and \"deletes\" are both absent or empty",
            ));
        }
        // OpenFGA rejects a tuple that appears twice in one Write
        // (`cannot_allow_duplicate_tuples_in_one_request`); a row is one intent, so the same
        // tuple twice in it has no meaning to deliver.
        let mut seen = std::collections::HashSet::with_capacity(ops.len());
        for op in &ops {
            if !seen.insert(op.key()) {
                return Err(bad(format!(
                    "tuple {} appears more than once (OpenFGA accepts each tuple once per write)",
                    op.key()
                )));
            }
        }
        let store = parse_id("store_id", obj.get("store_id"), false)?;
        let model = parse_id(
            "authorization_model_id",
            obj.get("authorization_model_id"),
            true,
        )?;
        Ok(Payload {
            ops: ops.into(),
            store,
            model,
        })
    }
}

/// Why a payload that is not a readable JSON object is refused: text that is not JSON, a value
/// whose parts cannot be decoded (an escape that is no character), or a value of another type.
fn refusal(text: &str) -> PayloadError {
    let raw: &RawValue = match serde_json::from_str(text) {
        Ok(raw) => raw,
        Err(e) => return bad(format!("the payload is not JSON: {e}")),
    };
    match Node::read(raw) {
        Err(e) => bad(format!("the payload cannot be read: {e}")),
        // Not reached: an object read here was read above.
        Ok(Node::Object(_)) => bad("the payload cannot be read"),
        Ok(top) => bad(format!(
            "expected a JSON object with \"writes\" and/or \"deletes\", found {}",
            top.type_name()
        )),
    }
}

fn parse_op(path: At<'_>, item: &RawValue, is_write: bool) -> Result<Op, PayloadError> {
    let obj = match node(path, Some(&item))? {
        Some(Node::Object(obj)) => obj,
        other => {
            return Err(bad(format!(
                "{path} must be an object with \"user\", \"relation\" and \"object\", found {}",
                other.map_or("null", |n| n.type_name())
            )));
        }
    };
    let field = |name: &str| -> Result<String, PayloadError> {
        let at = path.key(name);
        match node(at, obj.get(name))? {
            None => Err(bad(format!("{at} is missing"))),
            Some(Node::String(s)) if s.is_empty() => Err(bad(format!("{at} is empty"))),
            Some(Node::String(s)) => Ok(s),
            Some(other) => Err(bad(format!(
                "{at} must be a string, found {}",
                other.type_name()
            ))),
        }
    };
    let key = TupleKey {
        user: field("user")?,
        relation: field("relation")?,
        object: field("object")?,
    };
    check_key(path, &key)?;
    check_no_space_len(path, "object", &key.object)?;
    if !is_write {
        // OpenFGA ignores a condition on a delete; so does the relay.
        return Ok(Op::Delete { key });
    }
    let condition = parse_condition(path, &obj)?;
    Ok(Op::Write { key, condition })
}

/// The limits OpenFGA puts on a tuple's user and relation, checked here so that a row OpenFGA
/// would refuse is dead-lettered with the reason rather than failing its whole Write.
fn check_key(path: At<'_>, key: &TupleKey) -> Result<(), PayloadError> {
    // OpenFGA's `TupleKey.user`: `max_bytes: 512`.
    if key.user.len() > MAX_USER_BYTES {
        return Err(bad(format!(
            "{path}.user is longer than {MAX_USER_BYTES} bytes"
        )));
    }
    // OpenFGA's `TupleKey.relation`: `^[^:#@\s]{1,50}$` (RE2 counts characters).
    let rel_chars = key.relation.chars().count();
    if rel_chars > MAX_RELATION_CHARS
        || key
            .relation
            .chars()
            .any(|c| c == ':' || c == '#' || c == '@' || is_re2_space(c))
    {
        return Err(bad(format!(
            "{path}.relation {:?} is not a relation name (at most {MAX_RELATION_CHARS} \
             characters, none of : # @ or ASCII whitespace)",
            key.relation
        )));
    }
    Ok(())
}

/// A write's optional condition: a name, and a context sent on as it is.
fn parse_condition(path: At<'_>, obj: &Members<'_>) -> Result<Option<Condition>, PayloadError> {
    let at = path.key("condition");
    match node(at, obj.get("condition"))? {
        None => Ok(None),
        Some(Node::Object(c)) => {
            let name = match node(at.key("name"), c.get("name"))? {
                Some(Node::String(s)) => s,
                None => return Err(bad(format!("{at}.name is missing"))),
                Some(other) => {
                    return Err(bad(format!(
                        "{at}.name must be a string, found {}",
                        other.type_name()
                    )));
                }
            };
            check_no_space_len(path, "condition.name", &name)?;
            let context = match c.get("context") {
                None => Map::new(),
                Some(raw) => parse_context(at, raw)?,
            };
            Ok(Some(Condition { name, context }))
        }
        Some(other) => Err(bad(format!(
            "{at} must be an object with \"name\" and \"context\", found {}",
            other.type_name()
        ))),
    }
}

/// The condition context, a `google.protobuf.Struct` for OpenFGA: an object (or null for none).
/// It is sent on, so it is decoded in full; a number beyond a double (which OpenFGA refuses
/// too) or nesting deeper than 128 levels makes the row undeliverable, with that reason.
fn parse_context(at: At<'_>, raw: &RawValue) -> Result<Map<String, Value>, PayloadError> {
    match serde_json::from_str::<Value>(raw.get()) {
        Ok(Value::Null) => Ok(Map::new()),
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(bad(format!("{at}.context must be an object"))),
        Err(e) => Err(bad(format!("{at}.context cannot be read: {e}"))),
    }
}

/// OpenFGA's `^[^\s]{2,256}$` rule for `TupleKey.object` and `RelationshipCondition.name`.
fn check_no_space_len(path: At<'_>, name: &str, s: &str) -> Result<(), PayloadError> {
    let n = s.chars().count();
    if !(MIN_OBJECT_CHARS..=MAX_OBJECT_CHARS).contains(&n) || s.chars().any(is_re2_space) {
        return Err(bad(format!(
            "{path}.{name} {s:?} must be {MIN_OBJECT_CHARS} to {MAX_OBJECT_CHARS} characters \
             without ASCII whitespace"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn err(v: Value) -> String {
        Payload::parse(&v).unwrap_err().to_string()
    }

    #[test]
    fn the_spec_example_parses_into_two_writes() {
        let p = Payload::parse(&json!({"writes": [
            {"user": "capture_job:7f170ae4", "relation": "parent", "object": "archive:3a4cb75c"},
            {"user": "organization:acme", "relation": "parent", "object": "capture_job:7f170ae4"}
        ]}))
        .unwrap();
        assert_eq!(p.ops.len(), 2);
        assert!(p.ops.iter().all(Op::is_write));
        assert_eq!(
            p.ops[0].key().to_string(),
            "archive:3a4cb75c#parent@capture_job:7f170ae4"
        );
    }

    #[test]
    fn keys_written_with_escapes_are_the_same_keys() {
        let p = Payload::parse_text(
            r#"{"wr\u0069tes": [{"\u0075ser": "user:a", "relation": "viewer",
                "object": "document:1"}]}"#,
        )
        .unwrap();
        assert_eq!(p.ops[0].key().to_string(), "document:1#viewer@user:a");
    }

    #[test]
    fn deletes_conditions_and_unknown_keys() {
        let p = Payload::parse(&json!({
            "writes": [{"user": "user:a", "relation": "viewer", "object": "document:1",
                        "condition": {"name": "non_expired", "context": {"x": 1}}}],
            "deletes": [{"user": "user:b", "relation": "viewer", "object": "document:1",
                         "condition": {"name": "ignored"}}],
            "trace_id": "abc"
        }))
        .unwrap();
        assert_eq!(p.ops.len(), 2);
        match &p.ops[0] {
            Op::Write {
                condition: Some(c), ..
            } => assert_eq!(c.name, "non_expired"),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            p.ops[1],
            Op::Delete {
                key: TupleKey {
                    user: "user:b".into(),
                    relation: "viewer".into(),
                    object: "document:1".into()
                }
            }
        );
    }

    #[test]
    fn malformed_payloads_say_what_is_wrong() {
        assert!(err(json!([1])).contains("expected a JSON object"));
        assert!(err(json!("x")).contains("found a string"));
        assert!(err(json!({})).contains("no tuples"));
        assert!(err(json!({"writes": []})).contains("no tuples"));
        assert!(err(json!({"writes": {"user": "u"}})).contains("\"writes\" must be an array"));
        assert!(err(json!({"writes": [1]})).contains("writes[0] must be an object"));
        assert!(
            err(json!({"writes": [{"relation": "r", "object": "o:1"}]}))
                .contains("writes[0].user is missing")
        );
        assert!(
            err(json!({"deletes": [{"user": 5, "relation": "r", "object": "o:1"}]}))
                .contains("deletes[0].user must be a string, found a number")
        );
        assert!(
            err(json!({"writes": [{"user": "", "relation": "r", "object": "o:1"}]}))
                .contains("writes[0].user is empty")
        );
        assert!(
            err(json!({"writes": [{"user": "u:1", "relation": "a:b", "object": "o:1"}]}))
                .contains("writes[0].relation")
        );
        assert!(
            err(json!({"writes": [{"user": "u:1", "relation": "r", "object": "o 1"}]}))
                .contains("writes[0].object")
        );
        assert!(
            err(
                json!({"writes": [{"user": "u:1", "relation": "r", "object": "o:1",
                                   "condition": {"context": {}}}]})
            )
            .contains("writes[0].condition.name is missing")
        );
        assert!(
            err(
                json!({"writes": [{"user": "u:1", "relation": "r", "object": "o:1",
                                   "condition": {"name": "cond", "context": [1]}}]})
            )
            .contains("condition.context must be an object")
        );
        let long = "u:".to_owned() + &"x".repeat(MAX_USER_BYTES);
        assert!(
            err(json!({"writes": [{"user": long, "relation": "r", "object": "o:1"}]}))
                .contains("longer than 512 bytes")
        );
    }

    #[test]
    fn a_row_may_name_its_store_and_model() {
        let w = json!([{"user": "u:1", "relation": "r", "object": "o:1"}]);
        let p = Payload::parse(
            &json!({"writes": w, "store_id": "01HVMMBCMGZNT3SED4Z17ECXCA",
            "authorization_model_id": "01HVMMBD01JZ9QYSA2DMB7JRY5"}),
        )
        .unwrap();
        assert_eq!(p.store.as_deref(), Some("01HVMMBCMGZNT3SED4Z17ECXCA"));
        assert_eq!(p.model.as_deref(), Some("01HVMMBD01JZ9QYSA2DMB7JRY5"));
        let p = Payload::parse(&json!({"writes": w, "store_id": null,
            "authorization_model_id": ""}))
        .unwrap();
        assert_eq!((p.store, p.model), (None, None));
        assert!(
            err(json!({"writes": w, "store_id": "01hvmmbcmgznt3sed4z17ecxca"}))
                .contains("\"store_id\" \"01hvmmbcmgznt3sed4z17ecxca\" is not an OpenFGA id")
        );
        assert!(err(json!({"writes": w, "store_id": ""})).contains("is not an OpenFGA id"));
        assert!(
            err(json!({"writes": w, "store_id": "01HVMMBCMGZNT3SED4Z17ECXCU"}))
                .contains("is not an OpenFGA id")
        );
        assert!(
            err(json!({"writes": w, "authorization_model_id": 7}))
                .contains("\"authorization_model_id\" must be a string, found a number")
        );
        assert!(
            err(json!({"writes": w, "store_id": "01HVMMBCMGZNT3SED4Z17ECXCAX"}))
                .contains("is not an OpenFGA id")
        );
    }

    #[test]
    fn a_store_filter_is_an_id_or_none() {
        assert_eq!(store_filter("none").as_deref(), Ok(""));
        assert_eq!(
            store_filter(" 01HVMMBCMGZNT3SED4Z17ECXCA").as_deref(),
            Ok("01HVMMBCMGZNT3SED4Z17ECXCA")
        );
        assert!(store_filter("tenant-a").is_err());
    }

    #[test]
    fn a_tuple_twice_in_one_row_is_rejected() {
        let t = json!({"user": "u:1", "relation": "r", "object": "o:1"});
        assert!(err(json!({"writes": [t.clone()], "deletes": [t]})).contains("more than once"));
    }

    fn text_err(text: &str) -> String {
        Payload::parse_text(text).unwrap_err().to_string()
    }

    #[test]
    fn what_jsonb_holds_under_ignored_keys_is_never_decoded() {
        let w = r#"{"user": "u:1", "relation": "r", "object": "o:1", "extra": 1e400}"#;
        let deep = "[".repeat(5000) + &"]".repeat(5000);
        for doc in [
            format!(r#"{{"meta": 1e400, "writes": [{w}]}}"#),
            format!(r#"{{"meta": {deep}, "writes": [{w}]}}"#),
            format!(r#"{{"writes": [{w}], "n": -0.000000000000000000001e-400}}"#),
            format!(
                r#"{{"writes": [{{"user": "u:1", "relation": "r", "object": "o:1", "x": {deep}}}]}}"#
            ),
        ] {
            let p = Payload::parse_text(&doc).unwrap_or_else(|e| panic!("{doc:.80}: {e}"));
            assert_eq!(p.ops.len(), 1);
        }
    }

    #[test]
    fn a_context_that_cannot_be_decoded_is_an_error_not_a_panic() {
        let deep = "[".repeat(200) + &"]".repeat(200);
        for ctx in ["{\"n\": 1e400}".to_owned(), format!("{{\"d\": {deep}}}")] {
            let doc = format!(
                r#"{{"writes": [{{"user": "u:1", "relation": "r", "object": "o:1",
                    "condition": {{"name": "c1", "context": {ctx}}}}}]}}"#
            );
            assert!(text_err(&doc).contains("writes[0].condition.context cannot be read"));
        }
        assert!(text_err("{\"writes\": [").contains("not JSON"));
        assert!(text_err("").contains("not JSON"));
        assert!(text_err("1e400").contains("expected a JSON object"));
    }

    #[test]
    fn whitespace_is_what_openfga_calls_whitespace() {
        // RE2's `\s` is ASCII: OpenFGA takes a no-break space, U+3000 or a vertical tab.
        for odd in ["\u{a0}", "\u{3000}", "\u{b}", "\u{2028}"] {
            let v = json!({"writes": [{"user": "u:1", "relation": format!("r{odd}"),
                                       "object": format!("o:{odd}1"),
                                       "condition": {"name": format!("c{odd}")}}]});
            assert!(Payload::parse(&v).is_ok(), "{odd:?}");
        }
        for space in [" ", "\t", "\n", "\r", "\u{c}"] {
            let rel = json!({"writes": [{"user": "u:1", "relation": format!("r{space}"),
                                         "object": "o:1"}]});
            assert!(err(rel).contains("writes[0].relation"), "{space:?}");
            let obj = json!({"deletes": [{"user": "u:1", "relation": "r",
                                          "object": format!("o:{space}1")}]});
            assert!(err(obj).contains("deletes[0].object"), "{space:?}");
        }
    }
}
