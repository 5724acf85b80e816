//! The outbox payload: `{"writes": [TupleKey...], "deletes": [TupleKey...]}`.
//!
//! A payload that OpenFGA could never accept is rejected here, with a reason that names the
//! offending field, so that its row is dead-lettered at once instead of being sent again and
//! again. The field rules are OpenFGA's own request validation (reference/openfga-api.md §1):
//! checking them here is never stricter than the server.

use serde_json::{Map, Value};
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

/// A valid payload: its operations, writes first, each tuple at most once.
#[derive(Clone, Debug, PartialEq)]
pub struct Payload {
    pub ops: Arc<[Op]>,
}

/// Why a payload can never be delivered.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("malformed payload: {0}")]
pub struct PayloadError(pub String);

fn bad(msg: impl Into<String>) -> PayloadError {
    PayloadError(msg.into())
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Longest `user`, in bytes (OpenFGA: `max_bytes: 512`).
const MAX_USER_BYTES: usize = 512;
/// Longest `relation`, in characters (OpenFGA: `^[^:#@\s]{1,50}$`).
const MAX_RELATION_CHARS: usize = 50;
/// Shortest and longest `object` and condition `name`, in characters (`^[^\s]{2,256}$`).
const MIN_OBJECT_CHARS: usize = 2;
const MAX_OBJECT_CHARS: usize = 256;

impl Payload {
    /// Checks a payload as stored in the outbox.
    pub fn parse(value: &Value) -> Result<Payload, PayloadError> {
        let Value::Object(obj) = value else {
            return Err(bad(format!(
                "expected a JSON object with \"writes\" and/or \"deletes\", found {}",
                type_name(value)
            )));
        };
        let mut ops = Vec::new();
        for (field, is_write) in [("writes", true), ("deletes", false)] {
            let items = match obj.get(field) {
                None | Some(Value::Null) => continue,
                Some(Value::Array(items)) => items,
                Some(other) => {
                    return Err(bad(format!(
                        "\"{field}\" must be an array of tuple keys, found {}",
                        type_name(other)
                    )));
                }
            };
            for (i, item) in items.iter().enumerate() {
                let path = format!("{field}[{i}]");
                ops.push(parse_op(&path, item, is_write)?);
            }
        }
        if ops.is_empty() {
            return Err(bad(
                "no tuples: \"writes\" and \"deletes\" are both absent or empty",
            ));
        }
        // OpenFGA rejects a tuple that appears twice in one Write; a row is one intent, so the
        // same tuple twice in it has no meaning to deliver.
        let mut seen = std::collections::HashSet::with_capacity(ops.len());
        for op in &ops {
            if !seen.insert(op.key()) {
                return Err(bad(format!(
                    "tuple {} appears more than once (OpenFGA accepts each tuple once per write)",
                    op.key()
                )));
            }
        }
        Ok(Payload { ops: ops.into() })
    }
}

fn parse_op(path: &str, item: &Value, is_write: bool) -> Result<Op, PayloadError> {
    let Value::Object(obj) = item else {
        return Err(bad(format!(
            "{path} must be an object with \"user\", \"relation\" and \"object\", found {}",
            type_name(item)
        )));
    };
    let field = |name: &str| -> Result<String, PayloadError> {
        match obj.get(name) {
            None | Some(Value::Null) => Err(bad(format!("{path}.{name} is missing"))),
            Some(Value::String(s)) if s.is_empty() => Err(bad(format!("{path}.{name} is empty"))),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(other) => Err(bad(format!(
                "{path}.{name} must be a string, found {}",
                type_name(other)
            ))),
        }
    };
    let key = TupleKey {
        user: field("user")?,
        relation: field("relation")?,
        object: field("object")?,
    };
    if key.user.len() > MAX_USER_BYTES {
        return Err(bad(format!(
            "{path}.user is longer than {MAX_USER_BYTES} bytes"
        )));
    }
    let rel_chars = key.relation.chars().count();
    if rel_chars > MAX_RELATION_CHARS
        || key
            .relation
            .chars()
            .any(|c| c == ':' || c == '#' || c == '@' || c.is_whitespace())
    {
        return Err(bad(format!(
            "{path}.relation {:?} is not a relation name (at most {MAX_RELATION_CHARS} \
             characters, none of : # @ or whitespace)",
            key.relation
        )));
    }
    check_no_space_len(path, "object", &key.object)?;
    if !is_write {
        // OpenFGA ignores a condition on a delete; so does the relay.
        return Ok(Op::Delete { key });
    }
    let condition = match obj.get("condition") {
        None | Some(Value::Null) => None,
        Some(Value::Object(c)) => {
            let name = match c.get("name") {
                Some(Value::String(s)) => s.clone(),
                None | Some(Value::Null) => {
                    return Err(bad(format!("{path}.condition.name is missing")));
                }
                Some(other) => {
                    return Err(bad(format!(
                        "{path}.condition.name must be a string, found {}",
                        type_name(other)
                    )));
                }
            };
            check_no_space_len(path, "condition.name", &name)?;
            let context = match c.get("context") {
                None | Some(Value::Null) => Map::new(),
                Some(Value::Object(m)) => m.clone(),
                Some(other) => {
                    return Err(bad(format!(
                        "{path}.condition.context must be an object, found {}",
                        type_name(other)
                    )));
                }
            };
            Some(Condition { name, context })
        }
        Some(other) => {
            return Err(bad(format!(
                "{path}.condition must be an object with \"name\" and \"context\", found {}",
                type_name(other)
            )));
        }
    };
    Ok(Op::Write { key, condition })
}

/// OpenFGA's `^[^\s]{2,256}$` rule for objects and condition names.
fn check_no_space_len(path: &str, name: &str, s: &str) -> Result<(), PayloadError> {
    let n = s.chars().count();
    if !(MIN_OBJECT_CHARS..=MAX_OBJECT_CHARS).contains(&n) || s.chars().any(char::is_whitespace) {
        return Err(bad(format!(
            "{path}.{name} {s:?} must be {MIN_OBJECT_CHARS} to {MAX_OBJECT_CHARS} characters \
             without whitespace"
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
    fn a_tuple_twice_in_one_row_is_rejected() {
        let t = json!({"user": "u:1", "relation": "r", "object": "o:1"});
        assert!(err(json!({"writes": [t.clone()], "deletes": [t]})).contains("more than once"));
    }
}
