//! Tuple validation against the model (openfga `internal/validation/validation.go`,
//! `pkg/tuple/tuple.go`).

use super::*;
use std::fmt::Write as _;

use serde_json::{Map, Value};

// The well-formedness rules, exactly as OpenFGA's `pkg/tuple` implements them (no control
// characters anywhere; `#`, `:`, `@` and space are the separators):
// - object (`IsValidObject`): `type:id` — exactly one `:`, not first, a non-empty id, no `#`
//   and no space. `type:*` is well-formed but rejected as an object by the validation.
// - relation (`IsValidRelation`): non-empty, no `#`, `:`, `@` or space.
// - user (`IsValidUser`): `*`, or a bare id (no `#`, `:`, space), or an object `type:id`
//   (including `type:*`), or a userset `type:id#relation` (one `:` not first, a non-empty id
//   without `*`, one `#`, a non-empty relation). A write's user must then be an object or a
//   userset (schema 1.1); a delete's user only needs to pass `IsValidUser`.

pub(super) fn split_object(s: &str) -> (&str, &str) {
    match s.bytes().position(|b| b == b':') {
        None => ("", s),
        Some(i) => (&s[..i], &s[i + 1..]),
    }
}

pub(super) fn split_object_relation(s: &str) -> (&str, &str) {
    match s.bytes().rposition(|b| b == b'#') {
        None => (s, ""),
        Some(i) if i == s.len() - 1 => (&s[..i], ""),
        Some(i) => (&s[..i], &s[i + 1..]),
    }
}

pub(super) fn is_valid_object(s: &str) -> bool {
    let (mut state, mut id_len) = (0usize, 0usize);
    for (ndx, c) in s.char_indices() {
        if c.is_control() {
            return false;
        }
        match c {
            '#' | ' ' => return false,
            ':' => {
                if state > 0 || ndx == 0 {
                    return false;
                }
                state = 1;
            }
            _ => id_len += state,
        }
    }
    id_len > 0
}

pub(super) fn is_valid_relation(s: &str) -> bool {
    !s.is_empty()
        && !s
            .chars()
            .any(|c| c.is_control() || matches!(c, '#' | ':' | '@' | ' '))
}

pub(super) fn is_valid_user_id(s: &str) -> bool {
    !s.is_empty()
        && !s
            .chars()
            .any(|c| c.is_control() || matches!(c, '#' | ':' | ' '))
}

pub(super) fn is_valid_userset(s: &str) -> bool {
    let (mut state, mut id_len, mut rel_len) = (0u8, 0usize, 0usize);
    for (ndx, c) in s.char_indices() {
        if c.is_control() {
            return false;
        }
        match c {
            ':' => {
                if state > 0 || ndx == 0 {
                    return false;
                }
                state = 1;
            }
            '#' => {
                if state > 1 || id_len == 0 {
                    return false;
                }
                state = 2;
            }
            ' ' => return false,
            '*' if state > 0 => return false,
            '*' => {}
            _ => match state {
                1 => id_len += 1,
                2 => rel_len += 1,
                _ => {}
            },
        }
    }
    rel_len > 0
}

pub(super) fn is_valid_user(s: &str) -> bool {
    s == "*" || is_valid_user_id(s) || is_valid_object(s) || is_valid_userset(s)
}

pub(super) fn is_typed_wildcard(s: &str) -> bool {
    let (t, id) = split_object(s);
    !t.is_empty() && id == "*"
}

/// `tuple.InvalidTupleError`: `Invalid tuple 'object#relation@user'. Reason: …`
pub(super) fn invalid_tuple(tk: &TK<'_>, reason: &str) -> String {
    format!(
        "Invalid tuple '{}'. Reason: {reason}",
        key_string(tk.object, tk.relation, tk.user)
    )
}

/// `tuple.InvalidConditionalTupleError`: the key is followed by ` (condition name)`.
pub(super) fn invalid_conditional_tuple(tk: &TK<'_>, reason: &str) -> String {
    let mut key = key_string(tk.object, tk.relation, tk.user);
    if let Some(c) = tk.condition {
        let _ = write!(key, " (condition {})", c.name);
    }
    format!("Invalid tuple '{key}'. Reason: {reason}")
}

/// `ValidateTupleForWrite` for a schema 1.1 model without tuple-to-userset rewrites.
pub(super) fn validate_tuple_for_write(model: &Model, tk: &TK<'_>) -> Result<(), String> {
    validate_user(model, tk.user)
        .and_then(|()| validate_object(model, tk.object))
        .and_then(|()| validate_relation(model, tk.object, tk.relation))
        .map_err(|reason| invalid_tuple(tk, &reason))?;
    validate_type_restrictions(model, tk).map_err(|reason| invalid_tuple(tk, &reason))?;
    validate_condition(model, tk).map_err(|reason| invalid_conditional_tuple(tk, &reason))
}

pub(super) fn validate_user(model: &Model, user: &str) -> Result<(), String> {
    if !is_valid_user(user) {
        return Err("the 'user' field is malformed".to_owned());
    }
    let is_object = is_valid_object(user);
    let is_userset = is_valid_userset(user);
    let (user_object, user_relation) = split_object_relation(user);
    let user_type = split_object(user_object).0;
    if !is_object && !is_userset {
        return Err("the 'user' field must be an object (e.g. document:1) or an 'object#relation' or a typed wildcard (e.g. group:*)".to_owned());
    }
    if !model.has_type(user_type) {
        return Err(format!("type '{user_type}' not found"));
    }
    if is_userset && model.relation(user_type, user_relation).is_none() {
        return Err(format!("relation '{user_type}#{user_relation}' not found"));
    }
    Ok(())
}

pub(super) fn validate_object(model: &Model, object: &str) -> Result<(), String> {
    if !is_valid_object(object) {
        return Err("invalid 'object' field format".to_owned());
    }
    let (object_type, id) = split_object(object);
    if id == "*" {
        return Err("the 'object' field cannot reference a typed wildcard".to_owned());
    }
    if !model.has_type(object_type) {
        return Err(format!("type '{object_type}' not found"));
    }
    Ok(())
}

pub(super) fn validate_relation(model: &Model, object: &str, relation: &str) -> Result<(), String> {
    if !is_valid_relation(relation) {
        return Err("the 'relation' field is malformed".to_owned());
    }
    let object_type = split_object(object).0;
    if !model.has_type(object_type) {
        return Err(format!("type '{object_type}' not found"));
    }
    if model.relation(object_type, relation).is_none() {
        return Err(format!("relation '{object_type}#{relation}' not found"));
    }
    Ok(())
}

pub(super) fn validate_type_restrictions(model: &Model, tk: &TK<'_>) -> Result<(), String> {
    let object_type = split_object(tk.object).0;
    let (user_object, user_relation) = split_object_relation(tk.user);
    let user_type = split_object(user_object).0;
    let allowed = model.relation(object_type, tk.relation).unwrap_or(&[]);
    if is_valid_userset(tk.user) {
        if allowed
            .iter()
            .any(|r| r.user_type == user_type && r.relation.as_deref() == Some(user_relation))
        {
            return Ok(());
        }
        return Err(format!(
            "'{user_type}#{user_relation}' is not an allowed type restriction for '{object_type}#{}'",
            tk.relation
        ));
    }
    if is_typed_wildcard(tk.user) {
        if allowed
            .iter()
            .any(|r| r.user_type == user_type && r.wildcard)
        {
            return Ok(());
        }
        return Err(format!(
            "the typed wildcard '{}' is not an allowed type restriction for '{object_type}#{}'",
            tk.user, tk.relation
        ));
    }
    if allowed
        .iter()
        .any(|r| r.user_type == user_type && !r.wildcard && r.relation.is_none())
    {
        return Ok(());
    }
    Err(format!(
        "type '{user_type}' is not an allowed type restriction for '{object_type}#{}'",
        tk.relation
    ))
}

pub(super) fn validate_condition(model: &Model, tk: &TK<'_>) -> Result<(), String> {
    let object_type = split_object(tk.object).0;
    let user_type = split_object(tk.user).0;
    let user_relation = split_object_relation(tk.user).1;
    let allowed = model.relation(object_type, tk.relation).unwrap_or(&[]);
    let Some(condition) = tk.condition else {
        for r in allowed {
            if r.condition.is_some() || r.user_type != user_type {
                continue;
            }
            if r.relation.is_some() || r.wildcard {
                if r.relation
                    .as_deref()
                    .is_some_and(|rel| rel != user_relation)
                {
                    continue;
                }
                if r.wildcard && !is_typed_wildcard(tk.user) {
                    continue;
                }
            } else if is_typed_wildcard(tk.user) {
                continue;
            }
            return Ok(());
        }
        return Err("condition is missing".to_owned());
    };
    if condition.name.chars().any(char::is_control) {
        return Err("condition name contains forbidden characters".to_owned());
    }
    let Some(params) = model.conditions.get(condition.name) else {
        return Err("undefined condition".to_owned());
    };
    if !allowed
        .iter()
        .any(|r| r.user_type == user_type && r.condition.as_deref() == Some(condition.name))
    {
        return Err("invalid condition for type restriction".to_owned());
    }
    let Some(context) = condition.context else {
        return Ok(());
    };
    validate_struct_chars(context)?;
    if context.is_empty() {
        return Ok(());
    }
    if params.is_empty() {
        return Err(format!(
            "parameter type error on condition '{}' - no parameters defined for the condition",
            condition.name
        ));
    }
    // Go iterates a map in random order; with several bad keys the one named here is the
    // smallest.
    let mut keys: Vec<&String> = context.keys().collect();
    keys.sort();
    if let Some(bad) = keys.into_iter().find(|k| !params.contains(k)) {
        return Err(format!("found invalid context parameter: {bad}"));
    }
    Ok(())
}

/// `ValidateStruct`: no control characters in context keys or string values.
pub(super) fn validate_struct_chars(m: &Map<String, Value>) -> Result<(), String> {
    let mut keys: Vec<&String> = m.keys().collect();
    keys.sort();
    for k in keys {
        if k.chars().any(char::is_control) {
            return Err(format!(
                "context key {} contains forbidden characters",
                go_quote(k)
            ));
        }
        validate_value_chars(&m[k])?;
    }
    Ok(())
}

pub(super) fn validate_value_chars(v: &Value) -> Result<(), String> {
    match v {
        Value::String(s) if s.chars().any(char::is_control) => Err(format!(
            "context value {} contains forbidden characters",
            go_quote(s)
        )),
        Value::Array(items) => items.iter().try_for_each(validate_value_chars),
        Value::Object(m) => validate_struct_chars(m),
        _ => Ok(()),
    }
}
