//! The one authorization model of the store: types, relations with their type restrictions, and
//! conditions.

use std::collections::BTreeMap;

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

/// An authorization model (schema 1.1) restricted to what a Write validates: types, their
/// directly assignable relations with type restrictions, and conditions with parameter names.
/// Computed relations, tuple-to-userset rewrites and parameter types are not modelled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Model {
    pub(super) types: BTreeMap<String, BTreeMap<String, Vec<TypeRestriction>>>,
    pub(super) conditions: BTreeMap<String, Vec<String>>,
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

    /// Declares a condition and its parameter names.
    pub fn with_condition(mut self, name: &str, params: &[&str]) -> Self {
        self.conditions.insert(
            name.to_owned(),
            params.iter().map(|p| (*p).to_owned()).collect(),
        );
        self
    }

    pub(super) fn has_type(&self, type_name: &str) -> bool {
        self.types.contains_key(type_name)
    }

    pub(super) fn relation(&self, type_name: &str, relation: &str) -> Option<&[TypeRestriction]> {
        self.types.get(type_name)?.get(relation).map(Vec::as_slice)
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
            .with_condition("non_expired", &["current_time", "expires_at"])
    }
}
