//! Authentication to OpenFGA: a preshared token, or client-credentials (OIDC) tokens fetched from
//! the issuer and cached until shortly before they expire.

use super::answer::read_whole;
use super::classify::{WriteError, error_chain_tls, excerpt};
use crate::config::{Auth, Secret};
use serde::Deserialize;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

/// A Bearer token fetched with the client-credentials flow, kept until shortly before it expires.
struct CachedToken {
    token: Secret,
    refresh_at: Instant,
}

/// How the client authenticates (replaced when a SIGHUP rereads the token's or the secret's
/// file), and the client-credentials token it holds.
pub(super) struct Credentials {
    auth: std::sync::RwLock<Auth>,
    token: Mutex<Option<CachedToken>>,
}

impl Credentials {
    pub(super) fn new(auth: Auth) -> Credentials {
        Credentials {
            auth: std::sync::RwLock::new(auth),
            token: Mutex::new(None),
        }
    }

    /// How the client authenticates now.
    pub(super) fn auth(&self) -> Auth {
        self.auth.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Authenticates with `auth` from the next request on; a cached token, fetched with the
    /// former secret, is dropped. Returns whether anything changed.
    pub(super) async fn replace(&self, auth: Auth) -> bool {
        {
            let mut current = self.auth.write().unwrap_or_else(|e| e.into_inner());
            if *current == auth {
                return false;
            }
            *current = auth;
        }
        self.forget_token().await;
        true
    }

    /// The Bearer token to send, if any.
    pub(super) async fn bearer(
        &self,
        http: &reqwest::Client,
    ) -> Result<Option<String>, TokenError> {
        let auth = self.auth();
        match &auth {
            Auth::None => Ok(None),
            Auth::ApiToken(t) => Ok(Some(t.expose().to_owned())),
            Auth::ClientCredentials { .. } => {
                let mut cached = self.token.lock().await;
                if let Some(t) = cached.as_ref()
                    && Instant::now() < t.refresh_at
                {
                    return Ok(Some(t.token.expose().to_owned()));
                }
                let fresh = Self::fetch_token(&auth, http).await?;
                let token = fresh.token.expose().to_owned();
                *cached = Some(fresh);
                Ok(Some(token))
            }
        }
    }

    /// Whether the next request fetches a client-credentials token first (none cached, or one
    /// due for refresh; or another request fetching one now).
    pub(super) fn token_due(&self) -> bool {
        // Asked for every Write: looked at in place, not cloned.
        let oidc = matches!(
            *self.auth.read().unwrap_or_else(|e| e.into_inner()),
            Auth::ClientCredentials { .. }
        );
        if !oidc {
            return false;
        }
        match self.token.try_lock() {
            Ok(t) => t.as_ref().is_none_or(|t| Instant::now() >= t.refresh_at),
            Err(_) => true,
        }
    }

    /// Forgets a cached token after OpenFGA refused it, so the next request fetches a new one.
    pub(super) async fn forget_token(&self) {
        *self.token.lock().await = None;
    }

    async fn fetch_token(auth: &Auth, http: &reqwest::Client) -> Result<CachedToken, TokenError> {
        let Auth::ClientCredentials {
            client_id,
            client_secret,
            token_issuer,
            audience,
            scopes,
        } = auth
        else {
            unreachable!("only called for client credentials");
        };
        let mut form = vec![
            ("grant_type", "client_credentials"),
            ("client_id", client_id.as_str()),
            ("client_secret", client_secret.expose()),
        ];
        if let Some(a) = audience {
            form.push(("audience", a.as_str()));
        }
        if let Some(s) = scopes {
            form.push(("scope", s.as_str()));
        }
        // Named in errors, which reach logs and rows' `last_error`: without its userinfo.
        let issuer = crate::config::shown_url(token_issuer);
        let started = Instant::now();
        let resp = http
            .post(token_issuer.clone())
            .form(&form)
            .send()
            .await
            .map_err(|e| {
                TokenError::unavailable(format!(
                    "token request to {issuer} failed: {}",
                    error_chain_tls(&e)
                ))
            })?;
        let status = resp.status();
        let location = resp
            .headers()
            .get(reqwest::header::LOCATION)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        let body = read_whole(resp).await.map_err(|e| {
            TokenError::unavailable(format!("token response from {issuer} failed: {e}"))
        })?;
        if !status.is_success() {
            return Err(token_refusal(&issuer, status, &body, location));
        }
        token_from(&issuer, &body, started)
    }
}

/// Why the issuer gave no token, worded for whoever must act: 4xx (but a timeout or
/// throttling) means it refuses these credentials, which only the operator can fix; 5xx, that
/// it is having trouble, and the request is retried.
fn token_refusal(
    issuer: &str,
    status: reqwest::StatusCode,
    body: &[u8],
    location: Option<String>,
) -> TokenError {
    let mut reason = format!("token issuer {issuer} answered {status}: {}", excerpt(body));
    if let Some(to) = location {
        reason.push_str(&format!(" (redirect to {to}, not followed)"));
    }
    let refused = status.is_redirection()
        || (status.is_client_error()
            && status != reqwest::StatusCode::REQUEST_TIMEOUT
            && status != reqwest::StatusCode::TOO_MANY_REQUESTS);
    if refused {
        TokenError::refused(format!(
            "{reason} (check FGA_CLIENT_ID, FGA_CLIENT_SECRET, FGA_API_AUDIENCE and \
             FGA_API_TOKEN_ISSUER)"
        ))
    } else {
        TokenError::unavailable(reason)
    }
}

/// The token in an issuer's success, asked for at `started`.
fn token_from(issuer: &str, body: &[u8], started: Instant) -> Result<CachedToken, TokenError> {
    #[derive(Deserialize)]
    struct TokenBody {
        access_token: String,
        expires_in: Option<u64>,
    }
    let t: TokenBody = serde_json::from_slice(body).map_err(|e| {
        TokenError::refused(format!(
            "token issuer {issuer} answered something that is not a token ({e})"
        ))
    })?;
    // Refresh a minute early (or at half-life for short-lived tokens), so a request never
    // carries a token that expires on its way.
    let lifetime = Duration::from_secs(t.expires_in.unwrap_or(300));
    let margin = Duration::from_secs(60).min(lifetime / 2);
    Ok(CachedToken {
        token: Secret::new(t.access_token),
        refresh_at: started + lifetime - margin,
    })
}

/// No token from the client-credentials flow.
pub(super) struct TokenError {
    pub(super) reason: String,
    /// The issuer refused the credentials (or answered garbage): a configuration error, as a
    /// 401 from OpenFGA is. Otherwise it could not be asked: transient.
    refused: bool,
}

impl TokenError {
    fn refused(reason: String) -> Self {
        TokenError {
            reason,
            refused: true,
        }
    }

    fn unavailable(reason: String) -> Self {
        TokenError {
            reason,
            refused: false,
        }
    }

    /// What it means for a Write: refused credentials are the operator's to fix (logged loudly,
    /// retried, nothing dead-lettered); an unreachable issuer is an outage.
    pub(super) fn into_write_error(self) -> WriteError {
        if self.refused {
            WriteError::Configuration {
                status: 0,
                code: "token_refused".into(),
                message: self.reason,
            }
        } else {
            WriteError::Transient {
                reason: self.reason,
                retry_after: None,
            }
        }
    }
}
