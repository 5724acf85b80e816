//! The body of a Write, as the relay sends it.

use crate::payload::Op;
use serde::Serialize;
use serde_json::{Map, Value};

#[derive(Serialize)]
struct WriteBody<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    writes: Option<WriteKeys<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    deletes: Option<DeleteKeys<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    authorization_model_id: Option<&'a str>,
}

#[derive(Serialize)]
struct WriteKeys<'a> {
    tuple_keys: Vec<KeyBody<'a>>,
    on_duplicate: &'static str,
}

#[derive(Serialize)]
struct DeleteKeys<'a> {
    tuple_keys: Vec<KeyBody<'a>>,
    on_missing: &'static str,
}

#[derive(Serialize)]
struct KeyBody<'a> {
    user: &'a str,
    relation: &'a str,
    object: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    condition: Option<ConditionBody<'a>>,
}

#[derive(Serialize)]
struct ConditionBody<'a> {
    name: &'a str,
    context: &'a Map<String, Value>,
}

/// The JSON body of a Write carrying `ops`: writes with `on_duplicate: "ignore"` and deletes
/// with `on_missing: "ignore"`, so that delivering a row again changes nothing (OpenFGA ≥ 1.10).
pub fn write_body(ops: &[&Op], model_id: Option<&str>) -> Vec<u8> {
    let mut writes = Vec::new();
    let mut deletes = Vec::new();
    for op in ops {
        let key = op.key();
        match op {
            Op::Write { condition, .. } => writes.push(KeyBody {
                user: &key.user,
                relation: &key.relation,
                object: &key.object,
                condition: condition.as_ref().map(|c| ConditionBody {
                    name: &c.name,
                    context: &c.context,
                }),
            }),
            Op::Delete { .. } => deletes.push(KeyBody {
                user: &key.user,
                relation: &key.relation,
                object: &key.object,
                condition: None,
            }),
        }
    }
    let body = WriteBody {
        writes: (!writes.is_empty()).then_some(WriteKeys {
            tuple_keys: writes,
            on_duplicate: "ignore",
        }),
        deletes: (!deletes.is_empty()).then_some(DeleteKeys {
            tuple_keys: deletes,
            on_missing: "ignore",
        }),
        authorization_model_id: model_id,
    };
    serde_json::to_vec(&body).expect("a write body always serialises")
}
