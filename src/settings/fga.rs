//! How to reach OpenFGA: its URL, the store, the model, credentials and request limits.

use super::renamed::{CA_FILE, MAX_TUPLES_PER_WRITE};
use super::secret_file::SecretSource;
use super::{DEFAULT_API_URL, DEFAULT_MAX_TUPLES, DEFAULT_REQUEST_TIMEOUT, non_empty, or_default};
use crate::config::{self, Auth, ConfigError, FgaSettings, Secret, StoreRef};
use clap::Args;
use std::path::PathBuf;
use std::time::Duration;

/// The longest `--request-timeout`.
const LONGEST_REQUEST_TIMEOUT: Duration = Duration::from_secs(3600);

/// How to reach OpenFGA.
#[derive(Args, Debug)]
pub struct FgaArgs {
    /// OpenFGA's HTTP API (userinfo, `user:password@`, is sent as Basic credentials and never
    /// shown).
    #[arg(long, env = "FGA_API_URL", default_value = DEFAULT_API_URL, hide_env_values = true)]
    pub api_url: String,
    /// The configured store: where the rows naming no store go (for `reconcile`, the store they
    /// are compared with).
    #[arg(long, env = "FGA_STORE_ID")]
    pub store_id: Option<String>,
    /// The configured store by name (resolved through ListStores), instead of --store-id.
    #[arg(long, env = "FGA_STORE_NAME")]
    pub store_name: Option<String>,
    /// The authorization model (default: the store's latest).
    #[arg(long, env = "FGA_MODEL_ID")]
    pub model_id: Option<String>,
    /// Preshared key, sent as a Bearer token.
    #[arg(long, env = "FGA_API_TOKEN", hide_env_values = true)]
    pub api_token: Option<String>,
    /// A file holding the preshared key, instead of --api-token; or the systemd credential
    /// `fga-api-token`.
    #[arg(long, env = "FGA_API_TOKEN_FILE")]
    pub api_token_file: Option<String>,
    /// OIDC client credentials: client id.
    #[arg(long, env = "FGA_CLIENT_ID")]
    pub client_id: Option<String>,
    /// OIDC client credentials: client secret.
    #[arg(long, env = "FGA_CLIENT_SECRET", hide_env_values = true)]
    pub client_secret: Option<String>,
    /// A file holding the client secret, instead of --client-secret; or the systemd credential
    /// `fga-client-secret`.
    #[arg(long, env = "FGA_CLIENT_SECRET_FILE")]
    pub client_secret_file: Option<String>,
    /// OIDC token issuer (host or URL; the token endpoint is /oauth/token unless a path is given).
    #[arg(long, env = "FGA_API_TOKEN_ISSUER", hide_env_values = true)]
    pub api_token_issuer: Option<String>,
    /// OIDC audience.
    #[arg(long, env = "FGA_API_AUDIENCE")]
    pub api_audience: Option<String>,
    /// OIDC scopes, sent space-separated as the token request's `scope` (repeat the flag, or
    /// separate them with spaces, as for the fga CLI).
    #[arg(long, env = "FGA_API_SCOPES")]
    pub api_scopes: Vec<String>,
    /// One OpenFGA call's limit (for a Write, its token fetch and the retry after a 401
    /// included); past it the attempt counts as a transient failure.
    #[arg(long, env = "FGA_RELAY_REQUEST_TIMEOUT", default_value = DEFAULT_REQUEST_TIMEOUT)]
    pub request_timeout: String,
    /// The server's limit of tuples per Write [default: 100]; FGA_MAX_TUPLES_PER_WRITE, its
    /// former name, is still read.
    #[arg(long, env = "FGA_RELAY_MAX_TUPLES_PER_WRITE")]
    pub max_tuples_per_write: Option<String>,
    /// PEM file of CA certificates to trust for https, besides the system's; FGA_CA_FILE, its
    /// former name, is still read.
    #[arg(long, env = "FGA_RELAY_CA_FILE")]
    pub ca_file: Option<String>,
}

impl FgaArgs {
    pub fn settings(&self) -> Result<FgaSettings, ConfigError> {
        let api_url = config::parse_http_url(
            "--api-url (FGA_API_URL)",
            or_default(&self.api_url, DEFAULT_API_URL),
        )?;
        // In this order, so that the first wrong setting is the one said.
        let store = self.store()?;
        let model_id = non_empty(&self.model_id)
            .map(|m| config::check_ulid("--model-id (FGA_MODEL_ID)", m))
            .transpose()?;
        let auth = self.auth()?;
        // A delivering transaction may stay idle for twice it (`db::claim_idle_limit`), which
        // PostgreSQL takes in milliseconds that must fit an int: past about 12 days every
        // connection would fail. No Write needs an hour.
        let request_timeout = config::parse_positive_duration_up_to(
            "--request-timeout (FGA_RELAY_REQUEST_TIMEOUT)",
            or_default(&self.request_timeout, DEFAULT_REQUEST_TIMEOUT),
            LONGEST_REQUEST_TIMEOUT,
            ", the longest a Write may take",
        )?;
        let max_tuples = MAX_TUPLES_PER_WRITE.resolve(self.max_tuples_per_write.as_deref())?;
        let max_tuples_per_write = config::parse_count(
            &max_tuples.setting,
            max_tuples.value.as_deref().unwrap_or(DEFAULT_MAX_TUPLES),
            1,
            100_000,
        )? as usize;
        let ca_file = self.ca_file()?;
        Ok(FgaSettings {
            api_url,
            store,
            model_id,
            auth,
            request_timeout,
            max_tuples_per_write,
            ca_file,
        })
    }

    /// The store, by id or by name: one of the two.
    fn store(&self) -> Result<StoreRef, ConfigError> {
        match (non_empty(&self.store_id), non_empty(&self.store_name)) {
            (Some(id), None) => Ok(StoreRef::Id(config::check_ulid(
                "--store-id (FGA_STORE_ID)",
                id,
            )?)),
            (None, Some(name)) => Ok(StoreRef::Name(name.to_owned())),
            (Some(_), Some(_)) => Err(ConfigError::new(
                "--store-id (FGA_STORE_ID)",
                "give either a store id or a store name (FGA_STORE_NAME), not both",
            )),
            (None, None) => Err(ConfigError::new(
                "--store-id (FGA_STORE_ID)",
                "is required (or --store-name / FGA_STORE_NAME)",
            )),
        }
    }

    /// How the relay authenticates to OpenFGA: a preshared key, OIDC client credentials, or
    /// nothing; never both.
    fn auth(&self) -> Result<Auth, ConfigError> {
        let api_token =
            API_TOKEN.resolve(self.api_token.as_deref(), self.api_token_file.as_deref())?;
        let client_secret = CLIENT_SECRET.resolve(
            self.client_secret.as_deref(),
            self.client_secret_file.as_deref(),
        )?;
        match (non_empty(&api_token), non_empty(&self.client_id)) {
            (Some(_), Some(_)) => Err(ConfigError::new(
                "--api-token (FGA_API_TOKEN)",
                "give either a preshared key or OIDC client credentials (FGA_CLIENT_ID), not both",
            )),
            (Some(token), None) => Ok(Auth::ApiToken(Secret::new(token))),
            (None, Some(client_id)) => {
                let secret = non_empty(&client_secret).ok_or_else(|| {
                    ConfigError::new(
                        "--client-secret (FGA_CLIENT_SECRET)",
                        "is required with FGA_CLIENT_ID (or FGA_CLIENT_SECRET_FILE)",
                    )
                })?;
                let issuer = non_empty(&self.api_token_issuer).ok_or_else(|| {
                    ConfigError::new(
                        "--api-token-issuer (FGA_API_TOKEN_ISSUER)",
                        "is required with FGA_CLIENT_ID",
                    )
                })?;
                Ok(Auth::ClientCredentials {
                    client_id: client_id.to_owned(),
                    client_secret: Secret::new(secret),
                    token_issuer: token_endpoint(issuer)?,
                    audience: non_empty(&self.api_audience).map(str::to_owned),
                    scopes: scopes(&self.api_scopes),
                })
            }
            (None, None) => Ok(Auth::None),
        }
    }

    /// The CA file to trust besides the system's, if given: it must be a readable file.
    fn ca_file(&self) -> Result<Option<PathBuf>, ConfigError> {
        let ca = CA_FILE.resolve(self.ca_file.as_deref())?;
        let ca_file = ca.value.map(PathBuf::from);
        if let Some(path) = &ca_file
            && !path.is_file()
        {
            return Err(ConfigError::new(
                &ca.setting,
                format!("{} is not a readable file", path.display()),
            ));
        }
        Ok(ca_file)
    }

    /// The settings read from files (a `_FILE` or a systemd credential), by name.
    pub fn secret_files(&self) -> Vec<String> {
        [
            API_TOKEN.file_origin(self.api_token.as_deref(), self.api_token_file.as_deref()),
            CLIENT_SECRET.file_origin(
                self.client_secret.as_deref(),
                self.client_secret_file.as_deref(),
            ),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

/// The preshared key's sources.
const API_TOKEN: SecretSource<'static> = SecretSource {
    setting: "--api-token (FGA_API_TOKEN)",
    file_setting: "--api-token-file (FGA_API_TOKEN_FILE)",
    credential: "fga-api-token",
};

/// The OIDC client secret's sources.
const CLIENT_SECRET: SecretSource<'static> = SecretSource {
    setting: "--client-secret (FGA_CLIENT_SECRET)",
    file_setting: "--client-secret-file (FGA_CLIENT_SECRET_FILE)",
    credential: "fga-client-secret",
};

/// `--api-scopes a --api-scopes "b c"` (or `FGA_API_SCOPES="a b c"`) as the token request's
/// `scope`: `a b c`, as the fga CLI sends them.
fn scopes(given: &[String]) -> Option<String> {
    let all: Vec<&str> = given.iter().flat_map(|s| s.split_whitespace()).collect();
    (!all.is_empty()).then(|| all.join(" "))
}

/// The token endpoint for `FGA_API_TOKEN_ISSUER`, as the OpenFGA SDKs build it: a bare host gets
/// `https://` and `/oauth/token`; a URL without a path gets `/oauth/token`.
fn token_endpoint(issuer: &str) -> Result<reqwest::Url, ConfigError> {
    let setting = "--api-token-issuer (FGA_API_TOKEN_ISSUER)";
    let with_scheme = if issuer.contains("://") {
        issuer.to_owned()
    } else {
        format!("https://{issuer}")
    };
    let mut url = config::parse_http_url(setting, &with_scheme)?;
    if url.path() == "/" || url.path().is_empty() {
        url.set_path("/oauth/token");
    }
    Ok(url)
}
