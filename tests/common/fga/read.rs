//! Read: one page of the store's tuples.

use super::*;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::SystemTime;

use axum::http::HeaderMap;
use serde_json::{Map, Value};

impl Shared {
    pub(super) fn read(&self, store_id: &str, headers: &HeaderMap, body: &[u8]) -> Reply {
        let value = match gw_decode(body, schema::READ_REQUEST) {
            Ok(Some(raw)) => match accepted_json(raw) {
                Ok(v) => v,
                Err(reply) => return reply,
            },
            Ok(None) => Value::Object(Map::new()),
            Err(reply) => return reply,
        };
        let empty = Map::new();
        let req = ReadReq::from_value(value.as_object().unwrap_or(&empty));
        let rid = request_id();
        if let Some(msg) = pgv_read(store_id, &req) {
            return Reply::invalid_argument(&msg).header(REQUEST_ID_HEADER, &rid);
        }
        if let Err(reply) = self.authenticate(headers) {
            return reply.header(REQUEST_ID_HEADER, &rid);
        }
        let reply = self.read_page(store_id, &req);
        reply.header(REQUEST_ID_HEADER, &rid)
    }

    /// openfga `pkg/server/commands/read.go` `ReadQuery.Execute` over the SQL datastores'
    /// `read` (openfga `pkg/storage/postgres/postgres.go`): filter, order by insertion, one
    /// page, and a token only when more rows follow.
    pub(super) fn read_page(&self, store_id: &str, req: &ReadReq<'_>) -> Reply {
        let filter = req.tuple_key.unwrap_or_default();
        let (object_type, object_id) = split_object(filter.object);
        if req.tuple_key.is_some()
            && (object_type.is_empty() || (object_id.is_empty() && filter.user.is_empty()))
        {
            return Reply::encoded(
                400,
                "validation_error",
                "the 'tuple_key' field was provided but the object type field is required and both the object id and user cannot be empty",
            );
        }
        let from = match decode_token(req.token) {
            Some(t) if t.is_empty() => 0,
            Some(t) => match t.parse::<u64>() {
                Ok(seq) => seq,
                Err(_) => {
                    return Reply::encoded(
                        400,
                        "invalid_continuation_token",
                        "Invalid continuation token",
                    );
                }
            },
            None => {
                return Reply::encoded(
                    400,
                    "invalid_continuation_token",
                    "Invalid continuation token",
                );
            }
        };
        let page_size = req.page_size.map_or(DEFAULT_PAGE_SIZE, |n| n as usize);
        let mut rows: Vec<(u64, TKey, SystemTime, Option<Arc<Cond>>)> = Vec::new();
        if store_id == STORE_ID {
            let state = self.state();
            for e in state.tuples.values() {
                if e.seq < from {
                    continue;
                }
                let (t, id) = split_object(e.key.object());
                if (!object_type.is_empty() && t != object_type)
                    || (!object_id.is_empty() && id != object_id)
                    || (!filter.relation.is_empty() && e.key.relation() != filter.relation)
                    || (!filter.user.is_empty() && e.key.user() != filter.user)
                {
                    continue;
                }
                rows.push((e.seq, e.key.clone(), e.inserted_at, e.condition.clone()));
            }
        }
        rows.sort_unstable_by_key(|r| r.0);
        let next = rows
            .get(page_size)
            .map(|r| b64url_encode(r.0.to_string().as_bytes()))
            .unwrap_or_default();
        let mut out = String::with_capacity(64 + rows.len().min(page_size) * 160);
        out.push_str("{\"tuples\":[");
        for (i, (_, key, at, cond)) in rows.iter().take(page_size).enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str("{\"key\":{\"user\":");
            write_json_str(key.user(), &mut out);
            out.push_str(",\"relation\":");
            write_json_str(key.relation(), &mut out);
            out.push_str(",\"object\":");
            write_json_str(key.object(), &mut out);
            out.push_str(",\"condition\":");
            match cond {
                Some(c) => out.push_str(&c.text),
                None => out.push_str("null"),
            }
            let _ = write!(out, "}},\"timestamp\":\"{}\"}}", rfc3339(*at));
        }
        out.push_str("],\"continuation_token\":");
        write_json_str(&next, &mut out);
        out.push('}');
        Reply::json(200, out)
    }
}
