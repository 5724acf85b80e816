//! What a test reads back: tuples as OpenFGA's Read returns them, its changelog, and the Writes
//! the proxy passed on.

use std::time::{Instant, SystemTime};

use serde_json::{Map, Value, json};

/// A relationship tuple as the store holds it. Ordered by (object, relation, user, condition).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StoredTuple {
    pub object: String,
    pub relation: String,
    pub user: String,
    /// The condition as JSON text with sorted keys: `{"context":{…},"name":"…"}`. A stored
    /// condition always has a `context` (possibly `{}`), as OpenFGA's Read returns it.
    pub condition: Option<String>,
}

impl StoredTuple {
    pub fn new(user: &str, relation: &str, object: &str) -> Self {
        StoredTuple {
            object: object.to_owned(),
            relation: relation.to_owned(),
            user: user.to_owned(),
            condition: None,
        }
    }

    /// Adds a condition; `context` must be a JSON object (or null for none).
    pub fn with_condition(mut self, name: &str, context: Value) -> Self {
        let context = match context {
            Value::Object(map) => map,
            Value::Null => Map::new(),
            other => panic!("a condition context must be a JSON object, got {other}"),
        };
        self.condition = Some(json!({ "name": name, "context": context }).to_string());
        self
    }

    /// From a `tuple_key` as OpenFGA returns it.
    pub(super) fn from_key(key: &Value) -> Self {
        let text = |k: &str| key[k].as_str().unwrap_or_default().to_owned();
        let condition = condition_of_key(key).map(|c| c.to_string());
        StoredTuple {
            object: text("object"),
            relation: text("relation"),
            user: text("user"),
            condition,
        }
    }

    /// As a `tuple_key` to write.
    pub(super) fn to_key(&self) -> Value {
        let mut key =
            json!({ "user": self.user, "relation": self.relation, "object": self.object });
        if let Some(c) = &self.condition {
            key["condition"] = serde_json::from_str(c).expect("condition text is JSON");
        }
        key
    }
}

/// A key's condition with its context always present, as the SQL datastores read it back.
pub(super) fn condition_of_key(key: &Value) -> Option<Value> {
    let c = key.get("condition")?;
    let context = c.get("context").cloned().unwrap_or_else(|| json!({}));
    Some(json!({ "name": c["name"], "context": context }))
}

/// One `POST /stores/{id}/write` as the proxy received it, whatever became of it.
#[derive(Clone, Debug)]
pub struct WriteRecord {
    pub received_at: Instant,
    /// The store of its path (`/stores/{store}/write`).
    pub store: String,
    /// The body's JSON value; `Value::Null` for an empty body, and the body text as a
    /// `Value::String` when it is not JSON.
    pub body: Value,
    /// The HTTP status answered; 0 while unanswered, and for `Hang` and `CloseConnection`.
    pub status: u16,
    /// When it was answered (or, for a delayed write whose client left, applied); `None` while
    /// in flight and for `Hang` and `CloseConnection`.
    pub answered_at: Option<Instant>,
    /// The raw `Authorization` header, if any.
    pub authorization: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Write,
    Delete,
}

/// One applied operation, from OpenFGA's changelog (ReadChanges). Deletes carry no condition.
#[derive(Clone, Debug, PartialEq)]
pub struct Change {
    pub op: Op,
    pub user: String,
    pub relation: String,
    pub object: String,
    pub condition: Option<Value>,
    pub at: SystemTime,
}

impl Change {
    pub(super) fn from_json(change: &Value) -> Change {
        let key = &change["tuple_key"];
        let text = |k: &str| key[k].as_str().unwrap_or_default().to_owned();
        let at = change["timestamp"]
            .as_str()
            .and_then(|t| humantime::parse_rfc3339(t).ok())
            .unwrap_or(SystemTime::UNIX_EPOCH);
        Change {
            op: if change["operation"] == "TUPLE_OPERATION_DELETE" {
                Op::Delete
            } else {
                Op::Write
            },
            user: text("user"),
            relation: text("relation"),
            object: text("object"),
            condition: condition_of_key(key),
            at,
        }
    }
}
