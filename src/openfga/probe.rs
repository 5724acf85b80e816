//! What `fga-relay check` asks OpenFGA, without changing anything: whether it answers and takes
//! the credentials, whether the store exists, and whether it has the model the relay writes
//! against.

use super::answer::read_whole;
use super::classify::{ErrorBody, excerpt};
use super::client::{FgaClient, SendError};
use super::store::PreflightError;
use std::collections::{BTreeMap, BTreeSet};

/// What one probe found: passed (with what it saw), or failed (with why).
pub type Probe = Result<String, String>;

/// What asking for the store found.
pub struct StoreProbe {
    /// OpenFGA answered and took the credentials.
    pub openfga: Probe,
    /// The store exists (None when OpenFGA could not be asked).
    pub store: Option<Probe>,
}

/// What `check` says, and `run` at start, of a store with no authorization model.
pub const NO_MODEL: &str = "the store has no authorization model: write one (fga model write)";

/// A type no model has (types are names a model's author chose; this one says where it came
/// from): a Write of it is refused after the model is found, and applies nothing.
const NO_SUCH_TYPE: &str = "fga_relay_check_no_such_type";

impl FgaClient {
    /// `GET /stores/{id}` (after ListStores, for a store given by name).
    pub async fn probe_store(&self) -> StoreProbe {
        let id = match self.store_id().await {
            Ok(id) => id.to_owned(),
            Err(PreflightError::Config(e)) => {
                return StoreProbe {
                    openfga: Ok("answers (ListStores)".into()),
                    store: Some(Err(e.problem)),
                };
            }
            Err(PreflightError::Unavailable(e)) => {
                return StoreProbe {
                    openfga: Err(e),
                    store: None,
                };
            }
        };
        let url = self.url(&format!("/stores/{id}"));
        let resp = match self.send(|| self.http.get(url.clone())).await {
            Ok(r) => r,
            Err(e @ SendError::Token(_)) => {
                return StoreProbe {
                    openfga: Err(format!("the token issuer refused: {e}")),
                    store: None,
                };
            }
            Err(e) => {
                return StoreProbe {
                    openfga: Err(e.to_string()),
                    store: None,
                };
            }
        };
        let status = resp.status();
        let body = read_whole(resp).await.unwrap_or_default();
        let code = serde_json::from_slice::<ErrorBody>(&body)
            .map(|b| b.code)
            .unwrap_or_default();
        match status.as_u16() {
            200..=299 => {
                #[derive(serde::Deserialize)]
                struct Store {
                    #[serde(default)]
                    name: String,
                }
                let name = serde_json::from_slice::<Store>(&body)
                    .map(|s| s.name)
                    .unwrap_or_default();
                StoreProbe {
                    openfga: Ok("answers and accepts the credentials".into()),
                    store: Some(Ok(format!("{id} ({name})"))),
                }
            }
            401 | 403 => StoreProbe {
                openfga: Err(format!(
                    "refused the credentials: {status}: {}",
                    excerpt(&body)
                )),
                store: None,
            },
            404 if code == "store_id_not_found" => StoreProbe {
                openfga: Ok("answers and accepts the credentials".into()),
                store: Some(Err(format!("OpenFGA has no store {id}"))),
            },
            _ => StoreProbe {
                openfga: Err(format!(
                    "GET /stores/{id} answered {status}: {}",
                    excerpt(&body)
                )),
                store: None,
            },
        }
    }

    /// Whether the store has the model the relay writes against (`--model-id`, or the latest):
    /// a Write of a type no model has, which OpenFGA refuses once it has found the model (and
    /// refuses differently when it has not). Nothing is applied either way. It also shows that
    /// the credentials may Write, not only read.
    pub async fn probe_model(&self) -> Probe {
        let store_id = self.store_id().await.map_err(|e| e.to_string())?;
        let url = self.url(&format!("/stores/{store_id}/write"));
        let mut body = serde_json::json!({"writes": {"tuple_keys": [{
            "user": format!("{NO_SUCH_TYPE}:check"),
            "relation": "check",
            "object": format!("{NO_SUCH_TYPE}:check"),
        }]}});
        if let Some(model) = &self.model_id {
            body["authorization_model_id"] = serde_json::Value::String(model.clone());
        }
        let body = serde_json::to_vec(&body).map_err(|e| e.to_string())?;
        let (status, _, answer) = self
            .post_json(url, body, None, None)
            .await
            .map_err(|e| e.to_string())?;
        let error = serde_json::from_slice::<ErrorBody>(&answer).unwrap_or_default();
        let which = self.model_id.as_deref().unwrap_or("the latest");
        match (status, error.code.as_str()) {
            (400, "validation_error") if error.message.contains(NO_SUCH_TYPE) => {
                Ok(format!("{which} model found"))
            }
            (400, "latest_authorization_model_not_found") => Err(NO_MODEL.into()),
            (400, "authorization_model_not_found") => Err(format!(
                "the store has no model {which}: check --model-id (FGA_MODEL_ID)"
            )),
            (401 | 403, _) => Err(format!(
                "the credentials may not Write: {status}: {}",
                excerpt(&answer)
            )),
            (200..=299, _) => Err(format!(
                "OpenFGA accepted a Write of a type no model has ({NO_SUCH_TYPE}): \
                 is FGA_API_URL OpenFGA?"
            )),
            _ => Err(format!("the Write answered {status}: {}", excerpt(&answer))),
        }
    }

    /// The model's object types and their relations (`--model-id`, or the store's latest), as
    /// ReadAuthorizationModel(s) answers.
    pub async fn model_relations(&self) -> Result<ModelRelations, String> {
        let store_id = self.store_id().await.map_err(|e| e.to_string())?;
        let url = match &self.model_id {
            Some(id) => self.url(&format!("/stores/{store_id}/authorization-models/{id}")),
            None => {
                let mut url = self.url(&format!("/stores/{store_id}/authorization-models"));
                url.query_pairs_mut().append_pair("page_size", "1");
                url
            }
        };
        let resp = self
            .send(|| self.http.get(url.clone()))
            .await
            .map_err(|e| e.to_string())?;
        let status = resp.status();
        let body = read_whole(resp).await?;
        if !status.is_success() {
            return Err(format!(
                "reading the model answered {status}: {}",
                excerpt(&body)
            ));
        }
        #[derive(serde::Deserialize)]
        struct TypeDefinition {
            #[serde(rename = "type")]
            name: String,
            #[serde(default)]
            relations: BTreeMap<String, serde::de::IgnoredAny>,
        }
        #[derive(serde::Deserialize)]
        struct Model {
            #[serde(default)]
            id: String,
            #[serde(default)]
            type_definitions: Vec<TypeDefinition>,
        }
        #[derive(serde::Deserialize)]
        struct Answer {
            authorization_model: Option<Model>,
            #[serde(default)]
            authorization_models: Vec<Model>,
        }
        let answer: Answer = serde_json::from_slice(&body)
            .map_err(|e| format!("the model's answer is not OpenFGA's: {e}"))?;
        let model = answer
            .authorization_model
            .or_else(|| answer.authorization_models.into_iter().next())
            .ok_or(NO_MODEL)?;
        Ok(ModelRelations {
            id: model.id,
            types: model
                .type_definitions
                .into_iter()
                .map(|t| (t.name, t.relations.into_keys().collect()))
                .collect(),
        })
    }
}

/// A model's object types, each with its relations.
pub struct ModelRelations {
    pub id: String,
    pub types: BTreeMap<String, BTreeSet<String>>,
}

impl ModelRelations {
    /// Of `pairs` (object type, relation), those the model does not know, in words.
    pub fn unknown(&self, pairs: &[(String, String)]) -> Vec<String> {
        pairs
            .iter()
            .filter_map(|(t, r)| match self.types.get(t) {
                None => Some(format!("type {t}")),
                Some(relations) if !relations.contains(r) => Some(format!("{t}#{r}")),
                Some(_) => None,
            })
            .collect()
    }
}
