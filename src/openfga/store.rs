//! Which store the relay writes to: an id as given, or a name resolved through ListStores once;
//! the check at start that it exists, and the same check again while it writes.

use super::classify::{ErrorBody, WriteError, excerpt};
use super::client::FgaClient;
use crate::config::{ConfigError, StoreRef};
use serde::Deserialize;
use std::time::{Duration, Instant};

/// How often a relay that writes asks again whether its store exists. OpenFGA deletes a store
/// softly: Writes to a deleted store are still answered 200 and land nowhere anyone reads, so
/// only GetStore tells. At most this long of a relay's Writes can go to a deleted store.
const STORE_CHECK_EVERY: Duration = Duration::from_secs(10);

/// Why the store could not be checked at start.
#[derive(Debug, thiserror::Error)]
pub enum PreflightError {
    /// Definitive: the store does not exist. Bad configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// OpenFGA could not be asked (down, auth, garbage): not bad configuration, keep going.
    #[error("{0}")]
    Unavailable(String),
}

impl FgaClient {
    /// The store id, resolving `--store-name` through ListStores the first time.
    pub async fn store_id(&self) -> Result<&str, PreflightError> {
        self.store_id
            .get_or_try_init(|| async {
                match &self.store {
                    StoreRef::Id(id) => Ok(id.clone()),
                    StoreRef::Name(name) => self.find_store(name).await,
                }
            })
            .await
            .map(String::as_str)
    }

    /// The store id, if it is known already (given, or resolved).
    pub fn known_store_id(&self) -> Option<&str> {
        self.store_id.get().map(String::as_str)
    }

    async fn find_store(&self, name: &str) -> Result<String, PreflightError> {
        let mut found = Vec::new();
        let mut token = String::new();
        loop {
            let mut url = self.url("/stores");
            url.query_pairs_mut()
                .append_pair("name", name)
                .append_pair("page_size", "100");
            if !token.is_empty() {
                url.query_pairs_mut()
                    .append_pair("continuation_token", &token);
            }
            let resp = self
                .send(|| self.http.get(url.clone()))
                .await
                .map_err(|e| PreflightError::Unavailable(e.to_string()))?;
            let status = resp.status();
            let body = resp
                .bytes()
                .await
                .map_err(|e| PreflightError::Unavailable(format!("ListStores: {e}")))?;
            if !status.is_success() {
                return Err(PreflightError::Unavailable(format!(
                    "ListStores answered {status}: {}",
                    excerpt(&body)
                )));
            }
            #[derive(Deserialize)]
            struct Store {
                id: String,
                name: String,
            }
            #[derive(Deserialize)]
            struct Stores {
                #[serde(default)]
                stores: Vec<Store>,
                #[serde(default)]
                continuation_token: String,
            }
            let page: Stores = serde_json::from_slice(&body).map_err(|e| {
                PreflightError::Unavailable(format!("ListStores answered garbage: {e}"))
            })?;
            // Older servers ignore the name filter: filter again here.
            found.extend(page.stores.into_iter().filter(|s| s.name == name));
            if page.continuation_token.is_empty() || page.continuation_token == token {
                break;
            }
            token = page.continuation_token;
        }
        let setting = "--store-name (FGA_STORE_NAME)";
        match found.len() {
            1 => Ok(found.remove(0).id),
            0 => {
                Err(ConfigError::new(setting, format!("no OpenFGA store is named {name:?}")).into())
            }
            n => Err(ConfigError::new(
                setting,
                format!("{n} OpenFGA stores are named {name:?}: give --store-id instead"),
            )
            .into()),
        }
    }

    /// Checks at start that the store exists. A missing store is bad configuration; OpenFGA
    /// being unreachable is not (the relay starts and keeps retrying).
    pub async fn preflight(&self) -> Result<String, PreflightError> {
        let id = self.store_id().await?.to_owned();
        let url = self.url(&format!("/stores/{id}"));
        let resp = self
            .send(|| self.http.get(url.clone()))
            .await
            .map_err(|e| PreflightError::Unavailable(e.to_string()))?;
        let status = resp.status();
        let body = resp.bytes().await.unwrap_or_default();
        if status.is_success() {
            #[derive(Deserialize)]
            struct Store {
                #[serde(default)]
                name: String,
            }
            let name = serde_json::from_slice::<Store>(&body)
                .map(|s| s.name)
                .unwrap_or_default();
            return Ok(name);
        }
        let code = serde_json::from_slice::<ErrorBody>(&body)
            .map(|b| b.code)
            .unwrap_or_default();
        if status == reqwest::StatusCode::NOT_FOUND && code == "store_id_not_found" {
            return Err(ConfigError::new(
                "--store-id (FGA_STORE_ID)",
                format!("OpenFGA has no store {id}"),
            )
            .into());
        }
        Err(PreflightError::Unavailable(format!(
            "GET /stores/{id} answered {status}: {}",
            excerpt(&body)
        )))
    }

    /// Whether the store still exists, asked at most every [`STORE_CHECK_EVERY`] while the relay
    /// writes. A store found missing is a configuration error, which holds delivery (no row is
    /// struck for it) until the store exists again; it is asked again before every Write
    /// meanwhile. An OpenFGA that cannot answer GetStore is no reason to hold: the Write will
    /// tell what it can.
    pub(super) async fn store_still_exists(&self, id: &str) -> Result<(), WriteError> {
        let fresh =
            |seen: &Option<Instant>| seen.is_some_and(|at| at.elapsed() < STORE_CHECK_EVERY);
        if fresh(&self.store_seen.lock().unwrap_or_else(|e| e.into_inner())) {
            return Ok(());
        }
        match self.preflight().await {
            Ok(_) => {
                *self.store_seen.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
                Ok(())
            }
            Err(PreflightError::Config(_)) => Err(WriteError::Configuration {
                status: 404,
                code: "store_id_not_found".into(),
                message: format!(
                    "OpenFGA store {id} no longer exists (deleted?): delivery is held until it \
                     exists again or the relay is pointed at another store"
                ),
            }),
            Err(PreflightError::Unavailable(_)) => Ok(()),
        }
    }

    /// The store id for a request; a store that cannot be resolved is classified as a Write's
    /// failure would be (missing: configuration; ListStores unavailable: transient).
    pub(super) async fn request_store_id(&self) -> Result<&str, WriteError> {
        match self.store_id().await {
            Ok(id) => Ok(id),
            Err(PreflightError::Config(e)) => Err(WriteError::Configuration {
                status: 0,
                code: "store_not_found".into(),
                message: e.to_string(),
            }),
            Err(PreflightError::Unavailable(e)) => Err(WriteError::Transient {
                reason: e,
                retry_after: None,
            }),
        }
    }
}
