//! The authorization model a test store gets: types, relations with their type restrictions, and
//! conditions, written to the real server as JSON.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

/// One entry of a relation's type restrictions (OpenFGA's `RelationReference`): `user`,
/// `user:*`, `group#member`, optionally followed by ` with <condition>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TypeRestriction {
    pub user_type: String,
    pub relation: Option<String>,
    pub wildcard: bool,
    pub condition: Option<String>,
}

impl TypeRestriction {
    /// Parses the DSL form: `user`, `user:*`, `group#member`, `user with non_expired`.
    pub fn parse(spec: &str) -> Self {
        let (base, condition) = match spec.split_once(" with ") {
            Some((b, c)) => (b.trim(), Some(c.trim().to_owned())),
            None => (spec.trim(), None),
        };
        if let Some(t) = base.strip_suffix(":*") {
            TypeRestriction {
                user_type: t.to_owned(),
                relation: None,
                wildcard: true,
                condition,
            }
        } else if let Some((t, r)) = base.split_once('#') {
            TypeRestriction {
                user_type: t.to_owned(),
                relation: Some(r.to_owned()),
                wildcard: false,
                condition,
            }
        } else {
            TypeRestriction {
                user_type: base.to_owned(),
                relation: None,
                wildcard: false,
                condition,
            }
        }
    }
}

/// An authorization model (schema 1.1) of directly assignable relations with their type
/// restrictions, and conditions: what the relay's Writes are validated against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Model {
    types: BTreeMap<String, BTreeMap<String, Vec<TypeRestriction>>>,
    /// name -> (parameters with their type names, CEL expression)
    conditions: BTreeMap<String, (Vec<(String, String)>, String)>,
}

impl Model {
    /// A model with no types at all.
    pub fn empty() -> Self {
        Model {
            types: BTreeMap::new(),
            conditions: BTreeMap::new(),
        }
    }

    /// Declares a type (with no relations yet).
    pub fn with_type(mut self, type_name: &str) -> Self {
        self.types.entry(type_name.to_owned()).or_default();
        self
    }

    /// Declares `type_name#relation: [allowed...]` (declaring the type if needed); each allowed
    /// entry is in [`TypeRestriction::parse`] form.
    pub fn with_relation(mut self, type_name: &str, relation: &str, allowed: &[&str]) -> Self {
        self.types.entry(type_name.to_owned()).or_default().insert(
            relation.to_owned(),
            allowed.iter().map(|a| TypeRestriction::parse(a)).collect(),
        );
        self
    }

    /// Declares a condition whose parameters may hold anything, and which always holds.
    pub fn with_condition(self, name: &str, params: &[&str]) -> Self {
        let params: Vec<(&str, &str)> = params.iter().map(|p| (*p, "TYPE_NAME_ANY")).collect();
        self.with_typed_condition(name, &params, "true")
    }

    /// Declares a condition with typed parameters (`TYPE_NAME_TIMESTAMP`, ...) and its CEL
    /// expression.
    pub fn with_typed_condition(
        mut self,
        name: &str,
        params: &[(&str, &str)],
        expression: &str,
    ) -> Self {
        let params = params
            .iter()
            .map(|(p, t)| ((*p).to_owned(), (*t).to_owned()))
            .collect();
        self.conditions
            .insert(name.to_owned(), (params, expression.to_owned()));
        self
    }

    /// The model as `WriteAuthorizationModel` takes it.
    pub fn to_json(&self) -> Value {
        let type_definitions: Vec<Value> = self
            .types
            .iter()
            .map(|(name, relations)| {
                if relations.is_empty() {
                    return json!({ "type": name });
                }
                let this: Map<String, Value> = relations
                    .keys()
                    .map(|r| (r.clone(), json!({ "this": {} })))
                    .collect();
                let metadata: Map<String, Value> = relations
                    .iter()
                    .map(|(r, allowed)| {
                        let refs: Vec<Value> =
                            allowed.iter().map(TypeRestriction::to_json).collect();
                        (r.clone(), json!({ "directly_related_user_types": refs }))
                    })
                    .collect();
                json!({ "type": name, "relations": this, "metadata": { "relations": metadata } })
            })
            .collect();
        let conditions: Map<String, Value> = self
            .conditions
            .iter()
            .map(|(name, (params, expression))| {
                let parameters: Map<String, Value> = params
                    .iter()
                    .map(|(p, t)| (p.clone(), json!({ "type_name": t })))
                    .collect();
                let condition =
                    json!({ "name": name, "expression": expression, "parameters": parameters });
                (name.clone(), condition)
            })
            .collect();
        json!({
            "schema_version": "1.1",
            "type_definitions": type_definitions,
            "conditions": conditions,
        })
    }
}

impl TypeRestriction {
    fn to_json(&self) -> Value {
        let mut r = json!({ "type": self.user_type });
        if let Some(relation) = &self.relation {
            r["relation"] = json!(relation);
        }
        if self.wildcard {
            r["wildcard"] = json!({});
        }
        if let Some(condition) = &self.condition {
            r["condition"] = json!(condition);
        }
        r
    }
}

impl Default for Model {
    /// user; organization{member}; capture_job{parent}; archive{parent}; group{member};
    /// document{viewer, editor, owner, parent}; condition non_expired(current_time, expires_at).
    fn default() -> Self {
        Model::empty()
            .with_type("user")
            .with_relation("organization", "member", &["user"])
            .with_relation("capture_job", "parent", &["organization"])
            .with_relation("archive", "parent", &["capture_job"])
            .with_relation("group", "member", &["user"])
            .with_relation(
                "document",
                "viewer",
                &["user", "user:*", "group#member", "user with non_expired"],
            )
            .with_relation("document", "editor", &["user"])
            .with_relation("document", "owner", &["user"])
            .with_relation("document", "parent", &["organization"])
            .with_typed_condition(
                "non_expired",
                &[
                    ("current_time", "TYPE_NAME_TIMESTAMP"),
                    ("expires_at", "TYPE_NAME_TIMESTAMP"),
                ],
                "current_time < expires_at",
            )
    }
}
