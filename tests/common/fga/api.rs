//! The harness's own calls to a real OpenFGA, straight to the server (never through the fault
//! proxy): making stores and models, and reading what the server holds. Blocking, so that a test
//! may ask from anywhere; each call is one loopback round trip.

use std::time::Duration;

use serde_json::{Value, json};

pub(super) fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into()
}

/// One OpenFGA server as the harness calls it.
#[derive(Clone)]
pub(super) struct Api {
    agent: ureq::Agent,
    base: String,
    key: Option<String>,
}

/// An answer that is not a success: the status and OpenFGA's body.
#[derive(Debug)]
pub struct Refused {
    pub status: u16,
    pub body: Value,
}

impl Api {
    pub(super) fn new(base: &str, key: Option<String>) -> Api {
        Api {
            agent: agent(),
            base: base.to_owned(),
            key,
        }
    }

    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, Refused> {
        let url = format!("{}{path}", self.base);
        let auth = self.key.as_ref().map(|k| format!("Bearer {k}"));
        let answer = match (method, body) {
            ("GET", _) => {
                let mut r = self.agent.get(&url);
                if let Some(a) = &auth {
                    r = r.header("authorization", a);
                }
                r.call()
            }
            (_, body) => {
                let mut r = match method {
                    "DELETE" => self.agent.delete(&url).force_send_body(),
                    _ => self.agent.post(&url),
                };
                if let Some(a) = &auth {
                    r = r.header("authorization", a);
                }
                let text = body.map(Value::to_string).unwrap_or_default();
                r.header("content-type", "application/json").send(text)
            }
        };
        let mut answer = answer.unwrap_or_else(|e| panic!("OpenFGA at {url}: {e}"));
        let status = answer.status().as_u16();
        let text = answer.body_mut().read_to_string().unwrap_or_default();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if (200..300).contains(&status) {
            Ok(body)
        } else {
            Err(Refused { status, body })
        }
    }

    fn ok(&self, method: &str, path: &str, body: Option<&Value>) -> Value {
        self.call(method, path, body)
            .unwrap_or_else(|r| panic!("OpenFGA refused {method} {path}: {} {}", r.status, r.body))
    }

    pub(super) fn create_store(&self, name: &str) -> String {
        let store = self.ok("POST", "/stores", Some(&json!({ "name": name })));
        store["id"].as_str().expect("a store id").to_owned()
    }

    pub(super) fn delete_store(&self, store: &str) {
        self.ok("DELETE", &format!("/stores/{store}"), None);
    }

    pub(super) fn write_model(&self, store: &str, model: &Value) -> String {
        let path = format!("/stores/{store}/authorization-models");
        let written = self.ok("POST", &path, Some(model));
        written["authorization_model_id"]
            .as_str()
            .expect("a model id")
            .to_owned()
    }

    /// A Write as a client other than the relay sends it.
    pub(super) fn write(
        &self,
        store: &str,
        writes: Vec<Value>,
        deletes: Vec<Value>,
    ) -> Result<(), Refused> {
        let mut body = serde_json::Map::new();
        if !writes.is_empty() {
            body.insert("writes".into(), json!({ "tuple_keys": writes }));
        }
        if !deletes.is_empty() {
            body.insert("deletes".into(), json!({ "tuple_keys": deletes }));
        }
        self.call(
            "POST",
            &format!("/stores/{store}/write"),
            Some(&body.into()),
        )
        .map(drop)
    }

    /// Every tuple Read returns for `filter` (a tuple key, possibly partial; `None`: all).
    pub(super) fn read(&self, store: &str, filter: Option<Value>) -> Vec<Value> {
        let path = format!("/stores/{store}/read");
        let mut tuples = Vec::new();
        let mut token = String::new();
        loop {
            let mut body = json!({ "page_size": 100, "continuation_token": token });
            if let Some(f) = &filter {
                body["tuple_key"] = f.clone();
            }
            let page = self.ok("POST", &path, Some(&body));
            if let Some(list) = page["tuples"].as_array() {
                tuples.extend(list.iter().map(|t| t["key"].clone()));
            }
            token = page["continuation_token"].as_str().unwrap_or("").to_owned();
            if token.is_empty() {
                return tuples;
            }
        }
    }

    /// The store's whole changelog (ReadChanges), oldest first.
    pub(super) fn changes(&self, store: &str) -> Vec<Value> {
        let mut changes = Vec::new();
        let mut token = String::new();
        loop {
            let token_param =
                percent_encoding::utf8_percent_encode(&token, percent_encoding::NON_ALPHANUMERIC);
            let path =
                format!("/stores/{store}/changes?page_size=100&continuation_token={token_param}");
            let page = self.ok("GET", &path, None);
            let list = page["changes"].as_array().cloned().unwrap_or_default();
            let next = page["continuation_token"].as_str().unwrap_or("").to_owned();
            // An empty page, or the same token again, means there is nothing newer.
            let done = list.is_empty() || next.is_empty() || next == token;
            changes.extend(list);
            if done {
                return changes;
            }
            token = next;
        }
    }
}
