//! Error encoding (openfga `pkg/server/errors/encoded_errors.go`): the code and message OpenFGA
//! puts in an error answer.

/// `sanitizedMessage`: the text after the last `| caused by:`, `unexpected EOF` →
/// `malformed JSON`, no `rpc error: code = X desc = ` prefix, no leading `proto:`.
pub(super) fn sanitized_message(message: &str) -> String {
    let last = message
        .rsplit("| caused by:")
        .next()
        .unwrap_or(message)
        .trim();
    let mut s = last.replace("unexpected EOF", "malformed JSON");
    while let Some(start) = s.find("rpc error: code = ") {
        let rest = &s[start + "rpc error: code = ".len()..];
        let code_len = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '(' || c == ')'))
            .unwrap_or(rest.len());
        if !rest[code_len..].starts_with(" desc = ") {
            break;
        }
        let end = start + "rpc error: code = ".len() + code_len + " desc = ".len();
        s.replace_range(start..end, "");
    }
    s.strip_prefix("proto:").unwrap_or(&s).trim().to_owned()
}

/// `ConvertToEncodedErrorCode` for `InvalidArgument`: `invalid Msg.Field: reason` may map to
/// a field-specific code (`getCustomizedErrorCode`), anything else is `validation_error`.
pub(super) fn invalid_argument_code(sanitized: &str) -> &'static str {
    let Some((object, reason)) = sanitized.split_once(": ") else {
        return "validation_error";
    };
    let parts: Vec<&str> = object.split('.').collect();
    if parts.len() != 2 {
        return "validation_error";
    }
    let field = parts[1];
    let starts = |p: &str| reason.starts_with(p);
    match field {
        "Assertions" if starts("value must contain no more than") => "assertions_too_many_items",
        "AuthorizationModelId" if starts("value length must be at most") => {
            "authorization_model_id_too_long"
        }
        "Base" if starts("value is required") => "difference_base_missing_value",
        "Id" if starts("value length must be at most") => "id_too_long",
        "Object" if starts("value length must be at most") => "object_too_long",
        "PageSize" if starts("value must be inside range") => "page_size_invalid",
        "Params" if starts("value is required") => "param_missing_value",
        "Relation" if starts("value length must be at most") => "relation_too_long",
        "Relations" if starts("value must contain at least") => "relations_too_few_items",
        "Subtract" if starts("value is required") => "subtract_base_missing_value",
        "StoreId" if starts("value length must be") => "store_id_invalid_length",
        "TupleKey" if starts("value is required") => "tuple_key_value_not_specified",
        "TupleKeys" if starts("value must contain between") => {
            "tuple_keys_too_many_or_too_few_items"
        }
        "Type" if starts("value length must be at") => "type_invalid_length",
        "Type" if starts("value does not match regex pattern") => "type_invalid_pattern",
        "TypeDefinitions" if starts("value must contain at least") => {
            "type_definitions_too_few_items"
        }
        f if f.starts_with("Relations[") && starts("value length must be at most") => {
            "relations_too_long"
        }
        f if f.starts_with("Relations[") && starts("value does not match regex pattern") => {
            "relations_invalid_pattern"
        }
        _ => "validation_error",
    }
}

// ------------------------------------------------------------------------------------------------
// Tuple validation against the model (openfga `internal/validation/validation.go`,
// `pkg/tuple/tuple.go`)
// ------------------------------------------------------------------------------------------------
//
