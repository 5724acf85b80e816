//! Write: decoding, the receive limit, validation, authentication, faults, then applying the
//! operations as `WriteCommand.Execute` does.

use super::*;
use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use axum::body::Bytes;
use axum::http::HeaderMap;
use serde_json::Map;

/// `proto.Equal(existing.condition, incoming.condition)` as the SQL datastores evaluate it for
/// `on_duplicate: "ignore"`. A stored condition always reads back with a non-nil
/// (possibly empty) context, so an incoming condition *without* a `context` field is unequal
/// to it — `proto.Equal` tells a nil message from an empty one. Send `"context": {}`.
pub(super) fn same_condition(
    existing: Option<&Cond>,
    incoming: Option<&(Arc<Cond>, bool)>,
) -> bool {
    match (existing, incoming) {
        (None, None) => true,
        (Some(e), Some((c, has_context))) => {
            *has_context && e.name == c.name && e.context == c.context
        }
        _ => false,
    }
}

impl Shared {
    pub(super) fn record_write(&self, body: Bytes, authorization: Option<String>) -> (u64, usize) {
        let mut state = self.state();
        state.writes.push(RecordInner {
            received_at: Instant::now(),
            answered_at: None,
            body,
            status: 0,
            authorization,
        });
        (state.writes_epoch, state.writes.len() - 1)
    }

    pub(super) fn finish_write(&self, (epoch, index): (u64, usize), status: u16) {
        let mut state = self.state();
        if state.writes_epoch == epoch
            && let Some(record) = state.writes.get_mut(index)
        {
            record.status = status;
            record.answered_at = Some(Instant::now());
        }
    }
}

impl Shared {
    pub(super) async fn write(
        self: &Arc<Self>,
        store_id: &str,
        headers: &HeaderMap,
        body: &Bytes,
        conn: &ConnCtl,
        record: (u64, usize),
    ) -> Reply {
        // 0. A proxy in front with a body limit answers before OpenFGA sees anything.
        let limit = self.state().body_limit;
        if limit.is_some_and(|l| body.len() > l) {
            let Fault::Garbage {
                status,
                content_type,
                body,
            } = Fault::html(413, "Request Entity Too Large")
            else {
                unreachable!("html() is a Garbage fault")
            };
            let mut reply = Reply::json(status, body);
            reply.content_type = Cow::Owned(content_type);
            return reply;
        }
        // 1. grpc-gateway decodes the body.
        let parsed = match ParsedWrite::decode(body) {
            Ok(p) => p,
            Err(reply) => return reply,
        };
        let req = parsed.request();
        // 2. gRPC's receive limit, checked before any interceptor.
        let size = req.proto_size(store_id);
        if size > MAX_RECV_MSG_SIZE {
            return Reply::encoded(
                500,
                "resource_exhausted",
                &format!("grpc: received message larger than max ({size} vs. {MAX_RECV_MSG_SIZE})"),
            );
        }
        let rid = request_id();
        // 3. PGV, all rules, before authentication.
        if let Some(msg) = pgv_write(store_id, &req) {
            return Reply::invalid_argument(&msg).header(REQUEST_ID_HEADER, &rid);
        }
        // 4. Authentication.
        if let Err(reply) = self.authenticate(headers) {
            return reply.header(REQUEST_ID_HEADER, &rid);
        }
        // 5. Injected faults.
        let fault = self.take_fault(&req);
        let reply = match fault {
            None => self.execute_write(store_id, &req),
            Some(Fault::Status {
                status,
                code,
                message,
                retry_after,
            }) => {
                let reply = Reply::error(status, &code, &message);
                match retry_after {
                    Some(secs) => reply.header("retry-after", &secs),
                    None => reply,
                }
            }
            Some(Fault::Garbage {
                status,
                content_type,
                body,
            }) => {
                let mut reply = Reply::json(status, body);
                reply.content_type = Cow::Owned(content_type);
                return reply;
            }
            Some(Fault::Delay(delay)) => {
                // Processed on a task of its own: the write lands after the delay even if the
                // client stops waiting and this handler is dropped with its connection.
                let fga = Arc::clone(self);
                let store_id = store_id.to_owned();
                let body = body.clone();
                let task = tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    let reply = fga.execute_write_bytes(&store_id, &body);
                    // Recorded here too: the client may have left (killed), and the write still
                    // lands now.
                    fga.finish_write(record, reply.status);
                    reply
                });
                match task.await {
                    Ok(reply) => reply,
                    Err(_) => Reply::encoded(500, "internal_error", "Internal Server Error"),
                }
            }
            Some(Fault::Redirect { status, location }) => {
                return Reply::json(status, Bytes::new()).header("location", &location);
            }
            Some(Fault::Hang) => return std::future::pending().await,
            Some(Fault::CloseConnection) => {
                conn.kill.cancel();
                return std::future::pending().await;
            }
        };
        reply.header(REQUEST_ID_HEADER, &rid)
    }
}

impl Shared {
    /// The back half of a Write, from a body that already passed decoding, PGV and auth.
    pub(super) fn execute_write_bytes(&self, store_id: &str, body: &[u8]) -> Reply {
        let parsed = match ParsedWrite::decode(body) {
            Ok(p) => p,
            Err(reply) => return reply,
        };
        self.execute_write(store_id, &parsed.request())
    }

    /// `Server.Write` then `WriteCommand.Execute`.
    pub(super) fn execute_write(&self, store_id: &str, req: &WriteReq<'_>) -> Reply {
        // Step 2: resolve the model, even for delete-only requests (openfga `pkg/server/server.go`
        // `resolveTypesystem`; a missing store surfaces here too).
        let model = if store_id == STORE_ID {
            self.model.as_ref()
        } else {
            None
        };
        let model = match (model, req.model_id) {
            (Some(m), "") => m,
            (Some(m), id) if id == MODEL_ID => m,
            (_, "") => {
                return Reply::encoded(
                    400,
                    "latest_authorization_model_not_found",
                    &format!("No authorization models found for store '{store_id}'"),
                );
            }
            (_, id) => {
                return Reply::encoded(
                    400,
                    "authorization_model_not_found",
                    &format!("Authorization Model '{id}' not found"),
                );
            }
        };
        // From here on the resolved model id is a response header, errors included: the custom
        // error handler copies the gRPC header metadata (openfga `pkg/middleware/http/handler.go`).
        self.apply_write(model, req)
            .header(MODEL_ID_HEADER, MODEL_ID)
    }

    pub(super) fn apply_write(&self, model: &Model, req: &WriteReq<'_>) -> Reply {
        let no_keys: &[TK<'_>] = &[];
        let writes = req.writes.as_ref().map_or(no_keys, |l| &l.keys[..]);
        let deletes = req.deletes.as_ref().map_or(no_keys, |l| &l.keys[..]);
        // Step 4.
        if writes.is_empty() && deletes.is_empty() {
            return Reply::encoded(
                400,
                "invalid_write_input",
                "Invalid input. Make sure you provide at least one write, or at least one delete",
            );
        }
        // Step 5: each write against the model, first failure wins.
        for tk in writes {
            if let Err(msg) = validate_tuple_for_write(model, tk) {
                return Reply::encoded(400, "validation_error", &msg);
            }
            // `validateNotImplicit`.
            let (user_object, user_relation) = split_object_relation(tk.user);
            if tk.relation == user_relation && tk.object == user_object {
                return Reply::encoded(
                    400,
                    "validation_error",
                    &invalid_tuple(tk, "cannot write a tuple that is implicit"),
                );
            }
            if let Some(ctx) = tk.condition.and_then(|c| c.context) {
                let size = struct_size(ctx);
                if size > CONDITION_CONTEXT_BYTE_LIMIT {
                    return Reply::encoded(
                        400,
                        "validation_error",
                        &invalid_tuple(
                            tk,
                            &format!(
                                "condition context size limit exceeded: {size} bytes exceeds {CONDITION_CONTEXT_BYTE_LIMIT} bytes"
                            ),
                        ),
                    );
                }
            }
        }
        // Step 6: deletes are only checked for a well-formed user.
        for tk in deletes {
            if !is_valid_user(tk.user) {
                return Reply::encoded(
                    400,
                    "validation_error",
                    &invalid_tuple(tk, "the 'user' field is malformed"),
                );
            }
        }
        // Steps 7 and 8: duplicates across deletes then writes (condition ignored), then the
        // number of unique tuples.
        let delete_keys: Vec<String> = deletes
            .iter()
            .map(|tk| key_string(tk.object, tk.relation, tk.user))
            .collect();
        let write_keys: Vec<String> = writes
            .iter()
            .map(|tk| key_string(tk.object, tk.relation, tk.user))
            .collect();
        let mut seen: HashSet<&str, FastBuild> =
            HashSet::with_capacity_and_hasher(deletes.len() + writes.len(), FastBuild::default());
        for (tk, key) in deletes
            .iter()
            .zip(&delete_keys)
            .chain(writes.iter().zip(&write_keys))
        {
            if !seen.insert(key.as_str()) {
                return tuple_error(
                    400,
                    "cannot_allow_duplicate_tuples_in_one_request",
                    "duplicate tuple in write: ",
                    tk,
                    "",
                );
            }
        }
        if seen.len() > self.max_tuples_per_write {
            return Reply::encoded(
                400,
                "exceeded_entity_limit",
                &format!(
                    "The number of write operations exceeds the allowed limit of {}",
                    self.max_tuples_per_write
                ),
            );
        }
        // Step 9: the options; a legacy server never saw them (they were unknown fields).
        let (on_duplicate, on_missing) = if self.legacy {
            ("", "")
        } else {
            (
                req.writes.as_ref().map_or("", |l| l.option),
                req.deletes.as_ref().map_or("", |l| l.option),
            )
        };
        let ignore_duplicates = match ignore_option("on_duplicate", on_duplicate) {
            Ok(b) => b,
            Err(reply) => return reply,
        };
        let ignore_missing = match ignore_option("on_missing", on_missing) {
            Ok(b) => b,
            Err(reply) => return reply,
        };
        // Step 10: the transaction. Conditions are canonicalised before taking the lock.
        let conditions: Vec<Option<(Arc<Cond>, bool)>> = writes
            .iter()
            .map(|tk| {
                tk.condition.map(|c| {
                    let empty = Map::new();
                    let cond = Cond::new(c.name, c.context.unwrap_or(&empty));
                    (Arc::new(cond), c.context.is_some())
                })
            })
            .collect();
        let now = SystemTime::now();
        let at = Instant::now();
        let mut state = self.state();
        // openfga `pkg/storage/sqlcommon/sqlcommon.go` `GetDeleteWriteChangelogItems`: decide
        // everything against the rows as they were, deletes first, first offender named.
        let mut apply_delete = Vec::with_capacity(deletes.len());
        for (tk, key) in deletes.iter().zip(&delete_keys) {
            let exists = state.tuples.contains_key(key.as_str());
            if !exists && !ignore_missing {
                return tuple_error(
                    400,
                    "write_failed_due_to_invalid_input",
                    "cannot delete a tuple which does not exist: ",
                    tk,
                    ": tuple to be written already existed or the tuple to be deleted did not exist",
                );
            }
            apply_delete.push(exists);
        }
        let mut apply_write = Vec::with_capacity(writes.len());
        for ((tk, key), incoming) in writes.iter().zip(&write_keys).zip(&conditions) {
            let Some(existing) = state.tuples.get(key.as_str()) else {
                apply_write.push(true);
                continue;
            };
            if !ignore_duplicates {
                return tuple_error(
                    400,
                    "write_failed_due_to_invalid_input",
                    "cannot write a tuple which already exists: ",
                    tk,
                    ": tuple to be written already existed or the tuple to be deleted did not exist",
                );
            }
            if !same_condition(existing.condition.as_deref(), incoming.as_ref()) {
                return tuple_error(
                    409,
                    "Aborted",
                    "transactional write failed due to conflict: attempted to write a tuple which already exists with a different condition: ",
                    tk,
                    "",
                );
            }
            apply_write.push(false);
        }
        for (key, apply) in delete_keys.iter().zip(apply_delete) {
            if !apply {
                continue;
            }
            if let Some(entry) = state.tuples.remove(key.as_str()) {
                state.changelog.push(ChangeInner {
                    op: Op::Delete,
                    key: entry.key,
                    condition: None,
                    at,
                });
            }
        }
        for (((key, tk), apply), incoming) in write_keys
            .into_iter()
            .zip(writes)
            .zip(apply_write)
            .zip(conditions)
        {
            if !apply {
                continue;
            }
            let key = TKey::from_key_string(key, tk.object.len(), tk.relation.len());
            let condition = incoming.map(|(c, _)| c);
            state.changelog.push(ChangeInner {
                op: Op::Write,
                key: key.clone(),
                condition: condition.clone(),
                at,
            });
            state.put(key, condition, now);
        }
        drop(state);
        // OpenFGA's answer to a successful Write: 200 `{}`.
        Reply::json(200, "{}")
    }
}

/// OpenFGA's error naming one tuple of the request: `{before}user: '…', relation: '…', object:
/// '…'{after}`.
fn tuple_error(status: u16, code: &str, before: &str, tk: &TK<'_>, after: &str) -> Reply {
    Reply::encoded(
        status,
        code,
        &format!(
            "{before}user: '{}', relation: '{}', object: '{}'{after}",
            tk.user, tk.relation, tk.object
        ),
    )
}

/// `on_duplicate` / `on_missing`: absent or `error` is strict, `ignore` is lenient, anything else
/// is OpenFGA's validation error naming the option.
fn ignore_option(name: &str, value: &str) -> Result<bool, Reply> {
    match value {
        "" | "error" => Ok(false),
        "ignore" => Ok(true),
        other => Err(Reply::encoded(
            400,
            "validation_error",
            &format!("invalid {name} option: {other}"),
        )),
    }
}
