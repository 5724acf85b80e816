//! Which store the relay writes to: an id as given, or a name resolved through ListStores once;
//! the check at start that it exists, and the same check again, for it and for every store a
//! row names, while it writes.

use super::answer::read_whole;
use super::classify::{ErrorBody, WriteError, excerpt};
use super::client::FgaClient;
use crate::config::{ConfigError, StoreRef};
use serde::Deserialize;
use std::time::{Duration, Instant};

/// How often a relay that writes asks again whether its store exists. OpenFGA deletes a store
/// softly: Writes to a deleted store are still answered 200 and land nowhere anyone reads, so
/// only GetStore tells. At most this long of a relay's Writes can go to a deleted store.
const STORE_CHECK_EVERY: Duration = Duration::from_secs(10);
/// Stores remembered as checked before the stale ones are forgotten.
const SEEN_MAX: usize = 4096;

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

    /// The configured store's id, if it is known already (given, or resolved from its name).
    pub fn configured_store_id(&self) -> Option<&str> {
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
            let body = read_whole(resp)
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
        match self.get_store(&id).await? {
            Some(name) => Ok(name),
            None => Err(ConfigError::new(
                "--store-id (FGA_STORE_ID)",
                format!("OpenFGA has no store {id}"),
            )
            .into()),
        }
    }

    /// GetStore: the store's name, or `None` when OpenFGA answers that it has no such store
    /// (404 `store_id_not_found`, also for a deleted store).
    pub(super) async fn get_store(&self, id: &str) -> Result<Option<String>, PreflightError> {
        let url = self.url(&format!("/stores/{id}"));
        let resp = self
            .send(|| self.http.get(url.clone()))
            .await
            .map_err(|e| PreflightError::Unavailable(e.to_string()))?;
        let status = resp.status();
        let body = read_whole(resp)
            .await
            .map_err(|e| PreflightError::Unavailable(format!("GetStore: {e}")))?;
        if status.is_success() {
            #[derive(Deserialize)]
            struct Store {
                #[serde(default)]
                name: String,
            }
            let name = serde_json::from_slice::<Store>(&body)
                .map(|s| s.name)
                .unwrap_or_default();
            return Ok(Some(name));
        }
        let code = serde_json::from_slice::<ErrorBody>(&body)
            .map(|b| b.code)
            .unwrap_or_default();
        if status == reqwest::StatusCode::NOT_FOUND && code == "store_id_not_found" {
            return Ok(None);
        }
        Err(PreflightError::Unavailable(format!(
            "GET /stores/{id} answered {status}: {}",
            excerpt(&body)
        )))
    }

    /// Whether store `id` still exists, asked at most every [`STORE_CHECK_EVERY`] per store
    /// while the relay writes to it. The configured store found missing is a configuration
    /// error, which holds its rows (no row is struck for it) until the store exists again; it
    /// is asked again before every Write meanwhile. A store a row names (`configured` false)
    /// is told apart: one that never existed (no model either) makes its rows undeliverable
    /// ([`WriteError::UnknownTarget`]); one deleted holds its rows as the configured store's
    /// are. An OpenFGA that cannot answer GetStore is no reason to hold: the Write will tell
    /// what it can.
    pub(super) async fn store_still_exists(
        &self,
        id: &str,
        configured: bool,
    ) -> Result<(), WriteError> {
        if self.store_checked(id) {
            return Ok(());
        }
        match self.get_store(id).await {
            Ok(Some(_)) => {
                self.store_seen
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(id.to_owned(), Instant::now());
                Ok(())
            }
            Ok(None) if !configured && !self.has_models(id).await => {
                if self.configured_store_exists().await {
                    Err(WriteError::UnknownTarget {
                        message: format!(
                            "OpenFGA has no store {id} (GetStore answered 404 store_id_not_found)"
                        ),
                    })
                } else {
                    Err(neither_store(id))
                }
            }
            Ok(None) => Err(WriteError::Configuration {
                status: 404,
                code: "store_id_not_found".into(),
                message: if configured {
                    format!(
                        "OpenFGA store {id} no longer exists (deleted?): delivery is held until \
                         it exists again or the relay is pointed at another store"
                    )
                } else {
                    format!(
                        "OpenFGA store {id} no longer exists (deleted): its rows are held until \
                         it exists again (dead-letter or correct them with SQL)"
                    )
                },
            }),
            Err(PreflightError::Config(_) | PreflightError::Unavailable(_)) => Ok(()),
        }
    }

    /// Whether the configured store exists, as GetStore says now (not as it was found within
    /// the last [`STORE_CHECK_EVERY`]: this decides whether rows are given up on). Asked before
    /// a row naming another store is given up on for that store missing: an OpenFGA on another
    /// datastore than the one the rows were written for (restored empty, or the wrong one) has
    /// neither, and then the rows are held, not dead-lettered.
    pub(super) async fn configured_store_exists(&self) -> bool {
        let Some(id) = self.configured_store_id() else {
            return false;
        };
        // Unanswered within a Write's deadline counts as not found: the rows are held, not
        // given up on.
        let found = matches!(
            self.within_deadline("GetStore", self.get_store(id)).await,
            Ok(Ok(Some(_)))
        );
        if found {
            self.store_seen
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(id.to_owned(), Instant::now());
        }
        found
    }

    /// Whether store `id` was found to exist within the last [`STORE_CHECK_EVERY`]: a Write to
    /// it need not ask again.
    pub(super) fn store_checked(&self, id: &str) -> bool {
        let now = Instant::now();
        let mut seen = self.store_seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen
            .get(id)
            .is_some_and(|at| now.duration_since(*at) < STORE_CHECK_EVERY)
        {
            return true;
        }
        // Thousands of stores: what is stale is asked again anyway.
        if seen.len() >= SEEN_MAX {
            seen.retain(|_, at| now.duration_since(*at) < STORE_CHECK_EVERY);
        }
        false
    }

    /// Whether OpenFGA lists a model of store `id`: OpenFGA deletes stores softly, and keeps
    /// their models, so a store GetStore does not find but with models was deleted; one with
    /// none never existed (or never had a model, so no Write to it ever succeeded). When
    /// OpenFGA cannot say, the store is taken as deleted: held, not given up on.
    async fn has_models(&self, id: &str) -> bool {
        let mut url = self.url(&format!("/stores/{id}/authorization-models"));
        url.query_pairs_mut().append_pair("page_size", "1");
        let Ok(resp) = self.send(|| self.http.get(url.clone())).await else {
            return true;
        };
        if !resp.status().is_success() {
            return true;
        }
        #[derive(Deserialize)]
        struct Models {
            #[serde(default)]
            authorization_models: Vec<serde_json::Value>,
        }
        match read_whole(resp)
            .await
            .map(|b| serde_json::from_slice::<Models>(&b))
        {
            Ok(Ok(m)) => !m.authorization_models.is_empty(),
            _ => true,
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

/// A store a row names is missing, and so is the configured store: OpenFGA is not the one (or
/// its datastore is not the one) the rows were written for, a configuration error that holds
/// the rows rather than one that makes them undeliverable.
pub(super) fn neither_store(id: &str) -> WriteError {
    WriteError::Configuration {
        status: 404,
        code: "store_id_not_found".into(),
        message: format!(
            "OpenFGA has no store {id}, and not the configured store either: is FGA_API_URL the \
             OpenFGA (and datastore) the rows were written for? Its rows are held until the \
             stores exist"
        ),
    }
}
