//! The request messages protojson decodes (api `openfga/v1/openfga_service.proto`,
//! `openfga.proto`). Every json_name there is the snake_case proto name.

use super::gojson::{Field, Kind};

const fn f(name: &'static str, kind: Kind) -> Field {
    Field { name, kind }
}

const RELATIONSHIP_CONDITION: &[Field] = &[f("name", Kind::Str), f("context", Kind::Struct)];
const TUPLE_KEY: &[Field] = &[
    f("user", Kind::Str),
    f("relation", Kind::Str),
    f("object", Kind::Str),
    f("condition", Kind::Message(RELATIONSHIP_CONDITION)),
];
const TUPLE_KEY_WITHOUT_CONDITION: &[Field] = &[
    f("user", Kind::Str),
    f("relation", Kind::Str),
    f("object", Kind::Str),
];
const WRITE_REQUEST_WRITES: &[Field] = &[
    f("tuple_keys", Kind::Repeated(TUPLE_KEY)),
    f("on_duplicate", Kind::Str),
];
const WRITE_REQUEST_DELETES: &[Field] = &[
    f("tuple_keys", Kind::Repeated(TUPLE_KEY_WITHOUT_CONDITION)),
    f("on_missing", Kind::Str),
];
pub const WRITE_REQUEST: &[Field] = &[
    f("store_id", Kind::Str),
    f("writes", Kind::Message(WRITE_REQUEST_WRITES)),
    f("deletes", Kind::Message(WRITE_REQUEST_DELETES)),
    f("authorization_model_id", Kind::Str),
];
const READ_REQUEST_TUPLE_KEY: &[Field] = &[
    f("user", Kind::Str),
    f("relation", Kind::Str),
    f("object", Kind::Str),
];
pub const READ_REQUEST: &[Field] = &[
    f("store_id", Kind::Str),
    f("tuple_key", Kind::Message(READ_REQUEST_TUPLE_KEY)),
    f("page_size", Kind::Int32Wrapper),
    f("continuation_token", Kind::Str),
    f("consistency", Kind::Enum),
];
