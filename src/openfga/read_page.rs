//! A page of OpenFGA's Read, as it answers it.

use serde::Deserialize;
use serde_json::{Map, Value};

/// The largest page OpenFGA's Read returns (`page_size` is 1..=100).
pub const MAX_READ_PAGE: u32 = 100;

/// One page of a Read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReadPage {
    pub tuples: Vec<ReadTuple>,
    /// Where the next page starts; empty when this page is the last.
    pub continuation_token: String,
}

/// A tuple as OpenFGA holds it.
#[derive(Clone, Debug, PartialEq)]
pub struct ReadTuple {
    pub key: crate::payload::TupleKey,
    /// Its condition; OpenFGA returns a stored condition's context as a Struct (`{}` when
    /// empty), whose numbers are doubles.
    pub condition: Option<crate::payload::Condition>,
}

/// A Read's answer: `{"tuples": [{"key": {…, "condition"}, "timestamp"}], "continuation_token"}`.
#[derive(Deserialize)]
pub(super) struct ReadAnswer {
    #[serde(default)]
    tuples: Vec<ReadAnswerTuple>,
    #[serde(default)]
    continuation_token: Option<String>,
}

#[derive(Deserialize)]
struct ReadAnswerTuple {
    key: ReadAnswerKey,
}

#[derive(Deserialize)]
struct ReadAnswerKey {
    user: String,
    relation: String,
    object: String,
    #[serde(default)]
    condition: Option<ReadAnswerCondition>,
}

#[derive(Deserialize)]
struct ReadAnswerCondition {
    name: String,
    #[serde(default)]
    context: Option<Map<String, Value>>,
}

impl From<ReadAnswer> for ReadPage {
    fn from(a: ReadAnswer) -> ReadPage {
        ReadPage {
            tuples: a
                .tuples
                .into_iter()
                .map(|t| ReadTuple {
                    key: crate::payload::TupleKey {
                        user: t.key.user,
                        relation: t.key.relation,
                        object: t.key.object,
                    },
                    condition: t.key.condition.map(|c| crate::payload::Condition {
                        name: c.name,
                        context: c.context.unwrap_or_default(),
                    }),
                })
                .collect(),
            continuation_token: a.continuation_token.unwrap_or_default(),
        }
    }
}
