//! Authentication as OpenFGA runs it: none, preshared keys, or a bearer-token check.

use super::*;
use std::sync::Arc;

use axum::http::{HeaderMap, header};

pub(super) enum Auth {
    None,
    Preshared(Vec<String>),
    Bearer(Arc<dyn Fn(&str) -> bool + Send + Sync>),
}

impl Shared {
    /// OpenFGA's preshared-key authentication: `grpcauth.AuthFromMD(ctx, "Bearer")` takes the first
    /// `authorization` value, cuts it at the first space and compares the scheme
    /// case-insensitively; any failure there is `bearer_token_missing`.
    pub(super) fn authenticate(&self, headers: &HeaderMap) -> Result<(), Reply> {
        let token = || {
            let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
            let (scheme, token) = value.split_once(' ')?;
            scheme.eq_ignore_ascii_case("Bearer").then_some(token)
        };
        let missing = || Reply::encoded(401, "bearer_token_missing", "missing bearer token");
        match &self.auth {
            Auth::None => Ok(()),
            Auth::Preshared(keys) => match token() {
                None => Err(missing()),
                Some(t) if keys.iter().any(|k| k == t) => Ok(()),
                Some(_) => Err(Reply::encoded(401, "unauthenticated", "unauthenticated")),
            },
            Auth::Bearer(accept) => match token() {
                None => Err(missing()),
                Some(t) if accept(t) => Ok(()),
                // openfga `internal/authn/oidc/oidc.go`: errInvalidClaims.
                Some(_) => Err(Reply::encoded(401, "invalid_claims", "invalid claims")),
            },
        }
    }
}
