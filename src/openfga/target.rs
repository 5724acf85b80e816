//! Where a Write goes: the store and model a row names, or the relay's configured ones; and what
//! OpenFGA's answer means when a row names a store or a model that OpenFGA does not have.

use super::classify::WriteError;
use super::client::FgaClient;
use std::sync::Arc;

/// A Write's store and model. Every row of a Write has the same.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Target {
    /// The store a row names; `None`: the configured store (also for a row naming it).
    pub store: Option<Arc<str>>,
    /// The model a row names; `None`: the store's default, which for the configured store is
    /// the configured model (`--model-id`, else the latest) and for another its latest.
    pub model: Option<Arc<str>>,
}

impl Target {
    /// The target of a row naming `store` and `model`, with `configured` the configured
    /// store's id: a row naming that store goes with the rows naming none.
    pub fn of(store: Option<&Arc<str>>, model: Option<&Arc<str>>, configured: &str) -> Target {
        Target {
            store: store.filter(|s| ***s != *configured).cloned(),
            model: model.cloned(),
        }
    }

    /// The store, as the order rule and the per-store judgement key it: `""` for the
    /// configured store.
    pub fn store_key(&self) -> &str {
        self.store.as_deref().unwrap_or("")
    }

    /// The store for logs: its id, or `configured`.
    pub fn store_label(&self) -> &str {
        self.store.as_deref().unwrap_or("configured")
    }
}

impl FgaClient {
    /// What a failed Write to a store or model a row names means. OpenFGA answers a Write to a
    /// store it does not have with 400 `latest_authorization_model_not_found` (it looks for the
    /// store's model first), and one naming a model the store does not have with 400
    /// `authorization_model_not_found`: for the configured store and model these are the
    /// operator's to fix, but a row naming them can never be delivered as it is
    /// ([`WriteError::UnknownTarget`]). A store that exists without a model is not the row's
    /// fault: its rows wait, as the configured store's would.
    pub(super) async fn named_target_missing(
        &self,
        target: &Target,
        store_id: &str,
        e: WriteError,
    ) -> WriteError {
        let (code, message) = match &e {
            WriteError::Configuration {
                status: 400,
                code,
                message,
            } if code == "authorization_model_not_found"
                || code == "latest_authorization_model_not_found" =>
            {
                (code.clone(), message.clone())
            }
            _ => return e,
        };
        let answer = format!("the Write was answered 400 {code}: {message}");
        if target.store.is_some() {
            match self
                .within_deadline("GetStore", self.get_store(store_id))
                .await
            {
                Ok(Ok(None)) if self.configured_store_exists().await => {
                    return WriteError::UnknownTarget {
                        message: format!("OpenFGA has no store {store_id}: {answer}"),
                    };
                }
                Ok(Ok(None)) => return super::store::neither_store(store_id),
                Ok(Ok(Some(_))) => {}
                // Whether the store exists is not known: the row waits.
                Ok(Err(_)) | Err(_) => return e,
            }
        }
        match (code.as_str(), &target.model) {
            ("authorization_model_not_found", Some(model)) => WriteError::UnknownTarget {
                message: format!("OpenFGA store {store_id} has no model {model}: {answer}"),
            },
            _ => e,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_naming_the_configured_store_goes_with_the_rows_naming_none() {
        let (home, other): (Arc<str>, Arc<str>) = ("01HOME".into(), "01OTHER".into());
        assert_eq!(Target::of(Some(&home), None, "01HOME"), Target::default());
        assert_eq!(Target::of(None, None, "01HOME").store_key(), "");
        let t = Target::of(Some(&other), Some(&home), "01HOME");
        assert_eq!(
            (t.store_key(), t.model.as_deref()),
            ("01OTHER", Some("01HOME"))
        );
        assert_eq!(t.store_label(), "01OTHER");
        assert_eq!(Target::default().store_label(), "configured");
    }
}
