//! GetStore and ListStores.

use super::*;
use std::fmt::Write as _;

use axum::http::HeaderMap;

impl Shared {
    pub(super) fn get_store(&self, store_id: &str, headers: &HeaderMap) -> Reply {
        let rid = request_id();
        if !is_ulid(store_id) {
            let msg = pgv_leaf("GetStoreRequest", "StoreId", ULID_REASON);
            return Reply::invalid_argument(&msg).header(REQUEST_ID_HEADER, &rid);
        }
        if let Err(reply) = self.authenticate(headers) {
            return reply.header(REQUEST_ID_HEADER, &rid);
        }
        if store_id != STORE_ID {
            // openfga `pkg/server/commands/get_store.go`: ErrStoreIDNotFound.
            return Reply::encoded(404, "store_id_not_found", "Store ID not found")
                .header(REQUEST_ID_HEADER, &rid);
        }
        let mut out = String::with_capacity(160);
        self.write_store_json(&mut out);
        Reply::json(200, out).header(REQUEST_ID_HEADER, &rid)
    }

    /// `Store` / `GetStoreResponse` as protojson with `EmitUnpopulated` prints them: fields in
    /// number order, the unset `deleted_at` as null.
    pub(super) fn write_store_json(&self, out: &mut String) {
        let ts = rfc3339(self.created_at);
        out.push_str("{\"id\":");
        write_json_str(STORE_ID, out);
        out.push_str(",\"name\":");
        write_json_str(STORE_NAME, out);
        let _ = write!(
            out,
            ",\"created_at\":\"{ts}\",\"updated_at\":\"{ts}\",\"deleted_at\":null}}"
        );
    }

    pub(super) fn list_stores(&self, query: &str, headers: &HeaderMap) -> Reply {
        // Query parameters as grpc-gateway's `PopulateQueryParameters` reads them: unknown
        // names ignored, a repeated scalar an error, `page_size` parsed by `strconv.ParseInt`.
        let pairs = match parse_query(query) {
            Ok(p) => p,
            Err(msg) => return Reply::invalid_argument(&msg),
        };
        let mut page_size: Option<i64> = None;
        let mut token = String::new();
        let mut name = String::new();
        for field in ["page_size", "continuation_token", "name"] {
            let values: Vec<&str> = pairs
                .iter()
                .filter(|(k, _)| k == field)
                .map(|(_, v)| v.as_str())
                .collect();
            if values.len() > 1 {
                return Reply::invalid_argument(&format!(
                    "too many values for field \"{field}\": {}",
                    values.join(", ")
                ));
            }
            let Some(value) = values.first().copied() else {
                continue;
            };
            if value.is_empty() {
                continue;
            }
            match field {
                "page_size" => match parse_go_int32(value) {
                    Ok(n) => page_size = Some(n),
                    Err(e) => {
                        return Reply::invalid_argument(&format!(
                            "parsing field \"page_size\": {e}"
                        ));
                    }
                },
                "continuation_token" => token = value.to_owned(),
                _ => name = value.to_owned(),
            }
        }
        let rid = request_id();
        // PGV ListStoresRequest.
        let mut errs = Vec::new();
        if let Some(n) = page_size
            && !(1..=100).contains(&n)
        {
            errs.push(pgv_leaf("ListStoresRequest", "PageSize", PAGE_SIZE_REASON));
        }
        pgv_token("ListStoresRequest", &token, &mut errs);
        if !name.is_empty() && !store_name_ok(&name) {
            errs.push(pgv_leaf("ListStoresRequest", "Name", STORE_NAME_REASON));
        }
        if !errs.is_empty() {
            return Reply::invalid_argument(&errs.join("; ")).header(REQUEST_ID_HEADER, &rid);
        }
        if let Err(reply) = self.authenticate(headers) {
            return reply.header(REQUEST_ID_HEADER, &rid);
        }
        // The token is the base64url of the first store id of the next page.
        let from = match decode_token(&token) {
            Some(from) => from,
            None => {
                return Reply::encoded(
                    400,
                    "invalid_continuation_token",
                    "Invalid continuation token",
                )
                .header(REQUEST_ID_HEADER, &rid);
            }
        };
        let page_size = page_size.map_or(DEFAULT_PAGE_SIZE, |n| n as usize);
        let ids: Vec<&str> = [STORE_ID]
            .into_iter()
            .filter(|id| (name.is_empty() || name == STORE_NAME) && *id >= from.as_str())
            .collect();
        let mut out = String::from("{\"stores\":[");
        for (i, _id) in ids.iter().take(page_size).enumerate() {
            if i > 0 {
                out.push(',');
            }
            self.write_store_json(&mut out);
        }
        out.push_str("],\"continuation_token\":");
        let next = ids
            .get(page_size)
            .map(|id| b64url_encode(id.as_bytes()))
            .unwrap_or_default();
        write_json_str(&next, &mut out);
        out.push('}');
        Reply::json(200, out).header(REQUEST_ID_HEADER, &rid)
    }
}
