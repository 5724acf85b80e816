//! Typed, borrowing deserialisation of a WriteRequest body that protojson's rules already
//! accepted (`gojson::check_protojson`): unknown fields skipped, `null` meaning unset,
//! messages only from JSON objects (never serde's "struct from a sequence"). It declines
//! (and the caller falls back to `serde_json::Value`) where one type serves two messages
//! here but not in the proto: an `on_missing` among the writes, a delete's `condition`.

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::{Map, Value};

use super::{CondIn, TK, TupleList, WriteReq};

/// A JSON string, borrowed from the body unless it has escapes.
pub struct Str<'a>(pub Cow<'a, str>);

impl<'de> Deserialize<'de> for Str<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Str<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Str<'de>, E> {
                Ok(Str(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Str<'de>, E> {
                Ok(Str(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Str<'de>, E> {
                Ok(Str(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

fn text<'v>(s: &'v Option<Str<'_>>) -> &'v str {
    s.as_ref().map_or("", |s| s.0.as_ref())
}

/// Implements `Deserialize` for a message from a JSON object only.
macro_rules! message {
    ($ty:ident { $($json:literal => $field:ident : $fty:ty),* $(,)? }) => {
        #[derive(Default)]
        pub struct $ty<'a> {
            $(pub $field: Option<$fty>,)*
            _marker: std::marker::PhantomData<&'a ()>,
        }

        impl<'de> Deserialize<'de> for $ty<'de> {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl<'de> Visitor<'de> for V {
                    type Value = $ty<'de>;
                    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                        f.write_str("an object")
                    }
                    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<$ty<'de>, A::Error> {
                        let mut out = $ty::default();
                        while let Some(key) = map.next_key::<Str<'de>>()? {
                            match key.0.as_ref() {
                                $($json => out.$field = map.next_value()?,)*
                                _ => {
                                    map.next_value::<IgnoredAny>()?;
                                }
                            }
                        }
                        Ok(out)
                    }
                }
                d.deserialize_map(V)
            }
        }
    };
}

message!(WriteBody {
    "store_id" => store_id: Str<'a>,
    "writes" => writes: ListBody<'a>,
    "deletes" => deletes: ListBody<'a>,
    "authorization_model_id" => model_id: Str<'a>,
});
// One type for both lists: a badly typed option of the other list (an unknown field there)
// sends the body to the slow path, which ignores it.
message!(ListBody {
    "tuple_keys" => keys: Vec<KeyBody<'a>>,
    "on_duplicate" => on_duplicate: Str<'a>,
    "on_missing" => on_missing: Str<'a>,
});
message!(KeyBody {
    "user" => user: Str<'a>,
    "relation" => relation: Str<'a>,
    "object" => object: Str<'a>,
    "condition" => condition: CondBody<'a>,
});
message!(CondBody {
    "name" => name: Str<'a>,
    "context" => context: Map<String, Value>,
});

impl WriteBody<'_> {
    pub fn request(&self) -> WriteReq<'_> {
        WriteReq {
            writes: list(&self.writes, true),
            deletes: list(&self.deletes, false),
            model_id: text(&self.model_id),
        }
    }
}

fn list<'v>(l: &'v Option<ListBody<'_>>, writes: bool) -> Option<TupleList<'v>> {
    l.as_ref().map(|l| TupleList {
        keys: l.keys.iter().flatten().map(|k| key(k, writes)).collect(),
        option: text(if writes {
            &l.on_duplicate
        } else {
            &l.on_missing
        }),
    })
}

fn key<'v>(k: &'v KeyBody<'_>, with_condition: bool) -> TK<'v> {
    TK {
        user: text(&k.user),
        relation: text(&k.relation),
        object: text(&k.object),
        condition: k
            .condition
            .as_ref()
            .filter(|_| with_condition)
            .map(|c| CondIn {
                name: text(&c.name),
                context: c.context.as_ref(),
            }),
    }
}
