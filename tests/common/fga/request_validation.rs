//! PGV validation (api `proto/openfga/v1/*.pb.validate.go`, `ValidateAll`): the rules every
//! request's fields must pass before anything else runs.

use super::*;

pub(super) fn pgv_leaf(message: &str, field: &str, reason: &str) -> String {
    format!("invalid {message}.{field}: {reason}")
}

pub(super) fn pgv_embedded(message: &str, field: &str, cause: &str) -> String {
    format!("invalid {message}.{field}: embedded message failed validation | caused by: {cause}")
}

/// RE2's `\s`: `[\t\n\f\r ]`.
pub(super) fn is_re2_space(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\u{c}' | '\r' | ' ')
}

/// `^[ABCDEFGHJKMNPQRSTVWXYZ0-9]{26}$`
pub(super) fn is_ulid(s: &str) -> bool {
    s.len() == 26
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b.is_ascii_uppercase() && !b"ILOU".contains(&b)))
}

/// The number of characters (RE2 counts runes).
pub(super) fn char_len(s: &str) -> usize {
    if s.is_ascii() {
        s.len()
    } else {
        s.chars().count()
    }
}

/// RE2's `\s` and the other excluded characters are all ASCII, so bytes can be tested directly
/// (no byte of a multi-byte UTF-8 sequence is ASCII).
pub(super) fn is_re2_space_byte(b: u8) -> bool {
    matches!(b, b'\t' | b'\n' | 0x0c | b'\r' | b' ')
}

/// `^[^:#@\s]{1,50}$`
pub(super) fn relation_pattern_ok(s: &str) -> bool {
    (1..=50).contains(&char_len(s))
        && !s
            .bytes()
            .any(|b| matches!(b, b':' | b'#' | b'@') || is_re2_space_byte(b))
}

/// `^[^\s]{2,256}$` (objects and condition names)
pub(super) fn nonspace_2_256(s: &str) -> bool {
    (2..=256).contains(&char_len(s)) && !s.bytes().any(is_re2_space_byte)
}

/// `^[^\s]{1,511}:[^\s]{1,511}$` (Read's user filter)
pub(super) fn read_user_pattern_ok(s: &str) -> bool {
    if s.chars().any(is_re2_space) {
        return false;
    }
    let n = s.chars().count();
    s.chars()
        .enumerate()
        .any(|(p, c)| c == ':' && (1..=511).contains(&p) && (1..=511).contains(&(n - p - 1)))
}

/// `^[a-zA-Z0-9\s\.\-\/^_&@]{3,64}$`
pub(super) fn store_name_ok(s: &str) -> bool {
    let n = s.chars().count();
    (3..=64).contains(&n)
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || is_re2_space(c) || ".-/^_&@".contains(c))
}

/// `max_bytes: 5120` and `^$|^[A-Za-z0-9-_]+={0,2}$`
pub(super) fn pgv_token(message: &str, token: &str, errs: &mut Vec<String>) {
    if token.len() > 5120 {
        errs.push(pgv_leaf(
            message,
            "ContinuationToken",
            "value length must be at most 5120 bytes",
        ));
    }
    let body = token.trim_end_matches('=');
    let ok = token.is_empty()
        || (!body.is_empty()
            && token.len() - body.len() <= 2
            && body
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
    if !ok {
        errs.push(pgv_leaf(message, "ContinuationToken", TOKEN_REASON));
    }
}

pub(super) fn pgv_write(store_id: &str, req: &WriteReq<'_>) -> Option<String> {
    let mut errs = Vec::new();
    if !is_ulid(store_id) {
        errs.push(pgv_leaf("WriteRequest", "StoreId", ULID_REASON));
    }
    for (list, field, message, key_message) in [
        (&req.writes, "Writes", "WriteRequestWrites", "TupleKey"),
        (
            &req.deletes,
            "Deletes",
            "WriteRequestDeletes",
            "TupleKeyWithoutCondition",
        ),
    ] {
        let Some(list) = list else { continue };
        let mut inner = Vec::new();
        if list.keys.is_empty() {
            inner.push(pgv_leaf(message, "TupleKeys", MIN_ITEMS_REASON));
        }
        for (i, tk) in list.keys.iter().enumerate() {
            if let Some(e) = pgv_tuple_key(key_message, tk) {
                inner.push(pgv_embedded(message, &format!("TupleKeys[{i}]"), &e));
            }
        }
        if !inner.is_empty() {
            errs.push(pgv_embedded("WriteRequest", field, &inner.join("; ")));
        }
    }
    if !req.model_id.is_empty() && !is_ulid(req.model_id) {
        errs.push(pgv_leaf(
            "WriteRequest",
            "AuthorizationModelId",
            ULID_REASON,
        ));
    }
    (!errs.is_empty()).then(|| errs.join("; "))
}

pub(super) fn pgv_tuple_key(message: &str, tk: &TK<'_>) -> Option<String> {
    let mut errs = Vec::new();
    if tk.user.len() > 512 {
        errs.push(pgv_leaf(message, "User", USER_LENGTH_REASON));
    }
    if !tk.relation.is_empty() && !relation_pattern_ok(tk.relation) {
        errs.push(pgv_leaf(message, "Relation", RELATION_REASON));
    }
    if !tk.object.is_empty() && !nonspace_2_256(tk.object) {
        errs.push(pgv_leaf(message, "Object", OBJECT_REASON));
    }
    if let Some(c) = tk.condition
        && !nonspace_2_256(c.name)
    {
        let cause = pgv_leaf("RelationshipCondition", "Name", CONDITION_NAME_REASON);
        errs.push(pgv_embedded(message, "Condition", &cause));
    }
    (!errs.is_empty()).then(|| errs.join("; "))
}

pub(super) fn pgv_read(store_id: &str, req: &ReadReq<'_>) -> Option<String> {
    let mut errs = Vec::new();
    if !is_ulid(store_id) {
        errs.push(pgv_leaf("ReadRequest", "StoreId", ULID_REASON));
    }
    if let Some(tk) = req.tuple_key {
        let mut inner = Vec::new();
        if !tk.user.is_empty() {
            if tk.user.len() > 512 {
                inner.push(pgv_leaf("ReadRequestTupleKey", "User", USER_LENGTH_REASON));
            }
            if !read_user_pattern_ok(tk.user) {
                inner.push(pgv_leaf("ReadRequestTupleKey", "User", READ_USER_REASON));
            }
        }
        if !tk.relation.is_empty() && !relation_pattern_ok(tk.relation) {
            inner.push(pgv_leaf("ReadRequestTupleKey", "Relation", RELATION_REASON));
        }
        if !tk.object.is_empty() && !nonspace_2_256(tk.object) {
            inner.push(pgv_leaf("ReadRequestTupleKey", "Object", OBJECT_REASON));
        }
        if !inner.is_empty() {
            errs.push(pgv_embedded("ReadRequest", "TupleKey", &inner.join("; ")));
        }
    }
    if let Some(n) = req.page_size
        && !(1..=100).contains(&n)
    {
        errs.push(pgv_leaf("ReadRequest", "PageSize", PAGE_SIZE_REASON));
    }
    pgv_token("ReadRequest", req.token, &mut errs);
    if ![0, 100, 200].contains(&req.consistency) {
        errs.push(pgv_leaf(
            "ReadRequest",
            "Consistency",
            "value must be one of the defined enum values",
        ));
    }
    (!errs.is_empty()).then(|| errs.join("; "))
}
