//! What a tuple not plainly in step is (missing, unexpected, another condition, pending, dead,
//! changed while checking), counted into the summary; conditions compared as OpenFGA holds them.

use crate::payload::TupleKey;
use serde_json::{Value, json};

/// A condition as both sides are compared: `{"name", "context"}` (an empty context is `{}`).
pub(super) fn condition_value(c: &crate::payload::Condition) -> Value {
    json!({
        "name": c.name,
        "context": Value::Object(c.context.clone()),
    })
}

/// Whether two conditions are the same for OpenFGA (see [`crate::payload::same_condition`]).
pub(super) fn same_condition(expected: Option<&Value>, held: Option<&Value>) -> bool {
    crate::payload::same_condition(expected, held)
}

/// `name {context}`, or `name` alone for an empty context, or `none`.
pub(super) fn describe_condition(c: Option<&Value>) -> String {
    let Some(c) = c else {
        return "none".to_owned();
    };
    let name = c.get("name").and_then(Value::as_str).unwrap_or("?");
    match c.get("context") {
        Some(Value::Object(m)) if !m.is_empty() => format!("{name} {}", Value::Object(m.clone())),
        _ => name.to_owned(),
    }
}

/// Rows of the comparison's cursor: a tuple not plainly in step.
pub(super) struct Candidate {
    /// Its store: the id rows name, `""` for the configured store.
    pub(super) store: String,
    pub(super) key: TupleKey,
    pub(super) present: bool,
    pub(super) condition: Option<Value>,
    pub(super) row: i64,
    pub(super) state: String,
    pub(super) held: bool,
    pub(super) held_condition: Option<Value>,
    pub(super) moved: bool,
}

/// What a reported tuple is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// The outbox wrote it last; OpenFGA does not hold it.
    Missing,
    /// The outbox deleted it last; OpenFGA holds it.
    Unexpected,
    /// Both hold it, with different conditions.
    Condition,
    /// Its last operation is in a dead row: not compared.
    Dead,
    /// OpenFGA holds it; the outbox does not speak of it (`--all`): not drift.
    Unknown,
}

impl Kind {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Kind::Missing => "missing",
            Kind::Unexpected => "unexpected",
            Kind::Condition => "condition",
            Kind::Dead => "dead",
            Kind::Unknown => "unknown",
        }
    }

    pub(super) fn is_drift(self) -> bool {
        matches!(self, Kind::Missing | Kind::Unexpected | Kind::Condition)
    }
}

/// One reported tuple.
#[derive(Debug)]
pub(super) struct Finding {
    /// The tuple's store: the id rows name, `""` for the configured store.
    pub(super) store: String,
    pub(super) kind: Kind,
    pub(super) key: TupleKey,
    /// The row of its last operation in the outbox.
    pub(super) row: Option<i64>,
    /// The condition the outbox wrote (for a tuple that must be present).
    pub(super) condition: Option<Value>,
    /// The condition OpenFGA holds (for a tuple it holds).
    pub(super) held_condition: Option<Value>,
}

/// What was found, for the closing lines and the JSON document.
#[derive(Debug, Default)]
pub(super) struct Summary {
    /// Rows `from..=through` were read.
    pub(super) from: i64,
    pub(super) through: i64,
    /// Tuples those rows touch.
    pub(super) tuples: u64,
    pub(super) in_step: u64,
    pub(super) missing: u64,
    pub(super) unexpected: u64,
    pub(super) condition: u64,
    /// Tuples whose last operation is in a pending row, or in a dead one.
    pub(super) pending: u64,
    pub(super) dead: u64,
    /// Tuples that rows after `through` touch: they changed while checking.
    pub(super) changed: u64,
    /// Tuples OpenFGA holds that the outbox does not speak of (whole store read, no --since).
    pub(super) not_in_outbox: Option<u64>,
    pub(super) repair: Option<Repair>,
}

/// What `--repair` enqueued.
#[derive(Debug, Default)]
pub(super) struct Repair {
    pub(super) rows: u64,
    /// Tuple operations in them (a condition mismatch takes a delete and a write).
    pub(super) operations: u64,
    pub(super) first_id: Option<i64>,
    pub(super) last_id: Option<i64>,
    /// Drifted tuples the application changed while checking: not corrected.
    pub(super) left_alone: u64,
}

impl Summary {
    pub(super) fn drift(&self) -> u64 {
        self.missing + self.unexpected + self.condition
    }

    /// Counts a candidate of the comparison and says what to report about it, if anything.
    pub(super) fn classify(&mut self, c: Candidate) -> Option<Finding> {
        let finding = |kind| Finding {
            store: c.store.clone(),
            kind,
            key: c.key.clone(),
            row: Some(c.row),
            condition: c.condition.clone().filter(|_| c.present),
            held_condition: c.held_condition.clone().filter(|_| c.held),
        };
        if c.moved {
            self.changed += 1;
            return None;
        }
        match c.state.as_str() {
            "pending" => {
                self.pending += 1;
                return None;
            }
            "dead" => {
                self.dead += 1;
                return Some(finding(Kind::Dead));
            }
            _ => {}
        }
        let kind = match (c.present, c.held) {
            (true, false) => Kind::Missing,
            (false, true) => Kind::Unexpected,
            (true, true) if !same_condition(c.condition.as_ref(), c.held_condition.as_ref()) => {
                Kind::Condition
            }
            _ => {
                // Different as jsonb, the same as OpenFGA's doubles.
                self.in_step += 1;
                return None;
            }
        };
        match kind {
            Kind::Missing => self.missing += 1,
            Kind::Unexpected => self.unexpected += 1,
            _ => self.condition += 1,
        }
        Some(finding(kind))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_compare_as_openfga_holds_them() {
        let c = |v: Value| Some(v);
        let a = json!({"name": "non_expired", "context": {"n": 1, "s": "x", "l": [2, {"m": 3}]}});
        let b =
            json!({"name": "non_expired", "context": {"n": 1.0, "s": "x", "l": [2.0, {"m": 3.0}]}});
        assert!(same_condition(c(a.clone()).as_ref(), c(b).as_ref()));
        // An integer beyond 2^53 comes back as the nearest double.
        let big = json!({"name": "c", "context": {"n": 12345678901234567890u64}});
        let rounded = json!({"name": "c", "context": {"n": 1.2345678901234567e19}});
        assert!(same_condition(Some(&big), Some(&rounded)));
        assert!(!same_condition(
            Some(&a),
            Some(&json!({"name": "non_expired", "context": {}}))
        ));
        assert!(!same_condition(Some(&a), None));
        assert!(same_condition(None, None));
        let empty = crate::payload::Condition {
            name: "c".into(),
            context: serde_json::Map::new(),
        };
        assert_eq!(condition_value(&empty), json!({"name": "c", "context": {}}));
        assert_eq!(describe_condition(Some(&condition_value(&empty))), "c");
        assert_eq!(describe_condition(None), "none");
    }

    fn candidate(state: &str, present: bool, held: bool) -> Candidate {
        Candidate {
            store: String::new(),
            key: TupleKey {
                object: "document:1".into(),
                relation: "viewer".into(),
                user: "user:anne".into(),
            },
            present,
            condition: None,
            row: 7,
            state: state.into(),
            held,
            held_condition: None,
            moved: false,
        }
    }

    #[test]
    fn pending_dead_and_changed_tuples_are_not_drift() {
        let mut s = Summary::default();
        assert!(s.classify(candidate("pending", true, false)).is_none());
        assert_eq!(
            s.classify(candidate("dead", true, false)).unwrap().kind,
            Kind::Dead
        );
        let mut moved = candidate("delivered", true, false);
        moved.moved = true;
        assert!(s.classify(moved).is_none());
        assert_eq!((s.pending, s.dead, s.changed, s.drift()), (1, 1, 1, 0));
        assert_eq!(
            s.classify(candidate("delivered", true, false))
                .unwrap()
                .kind,
            Kind::Missing
        );
        assert_eq!(
            s.classify(candidate("delivered", false, true))
                .unwrap()
                .kind,
            Kind::Unexpected
        );
        let mut cond = candidate("delivered", true, true);
        cond.condition = Some(json!({"name": "c", "context": {"n": 1}}));
        cond.held_condition = Some(json!({"name": "c", "context": {"n": 1.0}}));
        assert!(s.classify(cond).is_none(), "1 and 1.0 are one double");
        assert_eq!((s.drift(), s.in_step), (2, 1));
    }
}
