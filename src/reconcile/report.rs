//! The report on stdout: text lines, or one JSON document, written as findings come.

use super::compare::{Finding, Kind, Summary, describe_condition};
use crate::output::Stdout;
use serde_json::{Value, json};
use std::io::{BufWriter, IsTerminal, Write};

impl Summary {
    pub(super) fn to_json(&self) -> Value {
        json!({
            "rows": {"from": self.from.max(1), "through": self.through},
            "tuples": self.tuples,
            "in_step": self.in_step,
            "missing": self.missing,
            "unexpected": self.unexpected,
            "condition_mismatch": self.condition,
            "drift": self.drift(),
            "pending": self.pending,
            "dead": self.dead,
            "changed": self.changed,
            "not_in_outbox": self.not_in_outbox,
            "repair": self.repair.as_ref().map(|r| json!({
                "rows": r.rows,
                "operations": r.operations,
                "first_id": r.first_id,
                "last_id": r.last_id,
                "left_alone": r.left_alone,
            })),
        })
    }
}

/// The report on stdout, written as findings come: text lines, or one JSON document whose
/// `findings` array is written item by item.
pub(super) struct Report {
    pub(super) out: BufWriter<Stdout>,
    pub(super) json: bool,
    pub(super) first: bool,
    /// On a terminal each finding shows at once (between redraws of the progress bar).
    pub(super) flush_each: bool,
}

impl Report {
    pub(super) fn new(json: bool) -> Report {
        Report {
            out: BufWriter::new(Stdout),
            json,
            first: true,
            flush_each: std::io::stdout().is_terminal(),
        }
    }

    pub(super) fn finding(&mut self, f: &Finding) -> anyhow::Result<()> {
        if self.json {
            let item = json!({
                "status": f.kind.as_str(),
                "store_id": (!f.store.is_empty()).then_some(&f.store),
                "object": f.key.object,
                "relation": f.key.relation,
                "user": f.key.user,
                "row": f.row,
                "condition": f.condition,
                "openfga_condition": f.held_condition,
            });
            let sep = if self.first { "{\"findings\":[" } else { "," };
            write!(self.out, "{sep}{item}")?;
        } else {
            let row = f.row.unwrap_or_default();
            let detail = match f.kind {
                Kind::Missing => match &f.condition {
                    None => format!("row {row} wrote it; OpenFGA does not hold it"),
                    Some(c) => format!(
                        "row {row} wrote it with condition {}; OpenFGA does not hold it",
                        describe_condition(Some(c))
                    ),
                },
                Kind::Unexpected => format!("row {row} deleted it; OpenFGA holds it"),
                Kind::Condition => format!(
                    "row {row} wrote condition {}; OpenFGA holds condition {}",
                    describe_condition(f.condition.as_ref()),
                    describe_condition(f.held_condition.as_ref())
                ),
                Kind::Dead => format!("its last operation is in dead row {row}: not compared"),
                Kind::Unknown => "OpenFGA holds it; the outbox does not mention it".to_owned(),
            };
            if f.store.is_empty() {
                writeln!(self.out, "{:<11} {}  {detail}", f.kind.as_str(), f.key)?;
            } else {
                writeln!(
                    self.out,
                    "{:<11} {}  in store {}: {detail}",
                    f.kind.as_str(),
                    f.key,
                    f.store
                )?;
            }
        }
        self.first = false;
        if self.flush_each {
            self.out.flush()?;
        }
        Ok(())
    }

    pub(super) fn finish(mut self, s: &Summary) -> anyhow::Result<()> {
        if self.json {
            let Value::Object(fields) = s.to_json() else {
                unreachable!("the summary is an object")
            };
            write!(
                self.out,
                "{}",
                if self.first { "{\"findings\":[" } else { "" }
            )?;
            write!(self.out, "]")?;
            for (k, v) in fields {
                write!(self.out, ",{}:{v}", Value::String(k))?;
            }
            writeln!(self.out, "}}")?;
        } else {
            self.summary_text(s)?;
        }
        self.out.flush()?;
        Ok(())
    }

    pub(super) fn summary_text(&mut self, s: &Summary) -> anyhow::Result<()> {
        let o = &mut self.out;
        if s.through < s.from.max(1) {
            writeln!(o, "no rows to check")?;
        } else {
            writeln!(
                o,
                "rows {}..{}: {} tuple(s); {} in step, {} missing, {} unexpected, {} with \
                 another condition",
                s.from.max(1),
                s.through,
                s.tuples,
                s.in_step,
                s.missing,
                s.unexpected,
                s.condition
            )?;
        }
        if s.pending + s.dead + s.changed > 0 {
            writeln!(
                o,
                "not compared: {} in pending rows, {} in dead rows, {} changed while checking",
                s.pending, s.dead, s.changed
            )?;
        }
        if let Some(n) = s.not_in_outbox.filter(|n| *n > 0) {
            writeln!(
                o,
                "OpenFGA holds {n} other tuple(s) the outbox does not mention (not compared; \
                 --all lists them)"
            )?;
        }
        match (&s.repair, s.drift()) {
            (_, 0) => writeln!(o, "in step")?,
            (None, n) => writeln!(
                o,
                "drift: {n} tuple(s); `fga-relay reconcile --repair` enqueues the corrections"
            )?,
            (Some(r), n) => {
                if r.left_alone > 0 {
                    writeln!(
                        o,
                        "{} drifted tuple(s) changed in the outbox while checking: left alone",
                        r.left_alone
                    )?;
                }
                match (r.first_id, r.last_id) {
                    (Some(first), Some(last)) => writeln!(
                        o,
                        "drift: {n} tuple(s); enqueued {} corrective row(s), ids {first}..{last}, \
                         delivered in order after every earlier row; run `fga-relay reconcile` \
                         again once they are",
                        r.rows
                    )?,
                    _ => writeln!(o, "drift: {n} tuple(s); nothing left to enqueue")?,
                }
            }
        }
        Ok(())
    }
}
