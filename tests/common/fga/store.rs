//! The store the stand-in holds: its tuples, every Write it received, the changelog, and the
//! state the server threads share.

use super::*;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime};

use axum::body::Bytes;
use serde_json::{Map, Value};

/// A relationship tuple as the store holds it. Ordered by (object, relation, user, condition).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StoredTuple {
    pub object: String,
    pub relation: String,
    pub user: String,
    /// The condition as OpenFGA's Read returns it, in canonical JSON text:
    /// `{"name":"…","context":{…}}` with sorted keys and numbers printed as protojson prints a
    /// double. A stored condition always has a `context` (possibly `{}`): the SQL datastores
    /// store an empty context as NULL and read it back as an empty Struct
    /// (openfga `pkg/storage/sqlcommon/encoding.go`, `pkg/tuple/tuple.go` `NewRelationshipCondition`).
    /// Build it with [`StoredTuple::with_condition`].
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
        self.condition = Some(Cond::new(name, &context).text);
        self
    }

    /// The condition as JSON (`{"name","context"}`), if any.
    #[allow(dead_code)] // the stand-in's own tests use it; the relay's tests do not
    pub fn condition_value(&self) -> Option<Value> {
        self.condition
            .as_deref()
            .map(|text| serde_json::from_str(text).expect("condition text is JSON"))
    }
}

/// One `POST /stores/{id}/write` as received, whatever became of it.
#[derive(Clone, Debug)]
pub struct WriteRecord {
    #[allow(dead_code)] // the relay's tests use it; the stand-in's own tests do not
    pub received_at: Instant,
    /// The body's (first) JSON value; `Value::Null` for an empty body, and the body text as a
    /// `Value::String` when it is not JSON.
    pub body: Value,
    /// The HTTP status answered; 0 while unanswered, and for `Hang` and `CloseConnection`.
    pub status: u16,
    /// When it was answered (or, for a delayed write whose client left, applied); `None` while
    /// in flight and for `Hang` and `CloseConnection`.
    #[allow(dead_code)] // the relay's tests use it; the stand-in's own tests do not
    pub answered_at: Option<Instant>,
    /// The raw `Authorization` header, if any.
    pub authorization: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Write,
    Delete,
}

/// One applied operation (skipped `ignore` operations are not changes, as in OpenFGA's
/// changelog). Deletes carry no condition.
#[derive(Clone, Debug, PartialEq)]
pub struct Change {
    pub op: Op,
    pub user: String,
    pub relation: String,
    pub object: String,
    pub condition: Option<Value>,
    pub at: Instant,
}

pub(super) struct Shared {
    pub(super) auth: Auth,
    pub(super) max_tuples_per_write: usize,
    pub(super) legacy: bool,
    pub(super) model: Option<Model>,
    pub(super) created_at: SystemTime,
    pub(super) state: Mutex<Db>,
}

impl Shared {
    pub(super) fn state(&self) -> MutexGuard<'_, Db> {
        // A panicking test thread must not poison the server for the other requests.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[derive(Default)]
pub(super) struct Db {
    /// Keyed by `object#relation@user`, OpenFGA's own tuple key (`tuple.TupleKeyToString`).
    pub(super) tuples: HashMap<Arc<str>, Entry, FastBuild>,
    /// Insertion order, standing in for the SQL datastores' `ulid` column (Read orders by it).
    pub(super) seq: u64,
    pub(super) writes: Vec<RecordInner>,
    /// Bumped by `reset_requests`, so a request answered after a reset does not update a record
    /// that is no longer its own.
    pub(super) writes_epoch: u64,
    pub(super) changelog: Vec<ChangeInner>,
    pub(super) faults: VecDeque<FaultRule>,
    pub(super) random: Option<RandomFaults>,
    pub(super) body_limit: Option<usize>,
    pub(super) latency: Option<Latency>,
}

impl Db {
    /// Stores (or replaces) a tuple, next in insertion order.
    pub(super) fn put(&mut self, key: TKey, condition: Option<Arc<Cond>>, inserted_at: SystemTime) {
        self.seq += 1;
        let entry = Entry {
            key,
            seq: self.seq,
            inserted_at,
            condition,
        };
        self.tuples.insert(entry.key.s.clone(), entry);
    }
}

/// A tuple key stored once as `object#relation@user` plus the two split points.
#[derive(Clone)]
pub(super) struct TKey {
    pub(super) s: Arc<str>,
    pub(super) object_end: usize,
    pub(super) relation_end: usize,
}

impl TKey {
    pub(super) fn new(object: &str, relation: &str, user: &str) -> TKey {
        TKey::from_key_string(
            key_string(object, relation, user),
            object.len(),
            relation.len(),
        )
    }

    pub(super) fn from_key_string(key: String, object_len: usize, relation_len: usize) -> TKey {
        TKey {
            s: Arc::from(key),
            object_end: object_len,
            relation_end: object_len + 1 + relation_len,
        }
    }

    pub(super) fn object(&self) -> &str {
        &self.s[..self.object_end]
    }

    pub(super) fn relation(&self) -> &str {
        &self.s[self.object_end + 1..self.relation_end]
    }

    pub(super) fn user(&self) -> &str {
        &self.s[self.relation_end + 1..]
    }
}

/// `tuple.TupleKeyToString`: `object#relation@user`.
pub(super) fn key_string(object: &str, relation: &str, user: &str) -> String {
    let mut s = String::with_capacity(object.len() + relation.len() + user.len() + 2);
    s.push_str(object);
    s.push('#');
    s.push_str(relation);
    s.push('@');
    s.push_str(user);
    s
}

pub(super) struct Entry {
    pub(super) key: TKey,
    pub(super) seq: u64,
    pub(super) inserted_at: SystemTime,
    pub(super) condition: Option<Arc<Cond>>,
}

impl Entry {
    pub(super) fn to_stored(&self) -> StoredTuple {
        StoredTuple {
            object: self.key.object().to_owned(),
            relation: self.key.relation().to_owned(),
            user: self.key.user().to_owned(),
            condition: self.condition.as_ref().map(|c| c.text.clone()),
        }
    }
}

#[derive(Clone)]
pub(super) struct RecordInner {
    pub(super) received_at: Instant,
    pub(super) answered_at: Option<Instant>,
    pub(super) body: Bytes,
    pub(super) status: u16,
    pub(super) authorization: Option<String>,
}

pub(super) struct ChangeInner {
    pub(super) op: Op,
    pub(super) key: TKey,
    pub(super) condition: Option<Arc<Cond>>,
    pub(super) at: Instant,
}

/// A stored condition, kept in canonical form for comparisons and output.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Cond {
    pub(super) name: String,
    /// Canonical JSON text of the context object (`{}` when empty or absent).
    pub(super) context: String,
    /// Canonical JSON text of `{"name":…,"context":…}`.
    pub(super) text: String,
}

impl Cond {
    pub(super) fn new(name: &str, context: &Map<String, Value>) -> Cond {
        let mut ctx = String::new();
        write_canonical_object(context, &mut ctx);
        let mut text = String::with_capacity(name.len() + ctx.len() + 24);
        text.push_str("{\"name\":");
        write_json_str(name, &mut text);
        text.push_str(",\"context\":");
        text.push_str(&ctx);
        text.push('}');
        Cond {
            name: name.to_owned(),
            context: ctx,
            text,
        }
    }

    pub(super) fn from_text(text: &str) -> Cond {
        let v: Value = serde_json::from_str(text).expect("a condition is JSON");
        let name = v
            .get("name")
            .and_then(Value::as_str)
            .expect("a condition has a name");
        let empty = Map::new();
        let ctx = v
            .get("context")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        Cond::new(name, ctx)
    }
}
