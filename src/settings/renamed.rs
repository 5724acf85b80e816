//! Settings that moved under the relay's own prefix: `FGA_OUTBOX_TABLE`, `FGA_CA_FILE` and
//! `FGA_MAX_TUPLES_PER_WRITE` sat in the `FGA_` namespace the OpenFGA SDKs and CLI use, where
//! another tool could give them another meaning. clap reads the flag and the new variable; the
//! old variable is still read here, with a warning, so that 0.1 deployments keep working.
//!
//! Precedence: the flag, then the new variable, then the old one, then the default. When the
//! new and the old are both set the new wins, with a warning that the old is ignored (a rename
//! half done is common while a deployment is being changed; refusing to start would turn it into
//! an outage). An empty value is unset, for the old names as for the new.

use crate::config::ConfigError;
use std::ffi::OsString;
use tracing::warn;

/// A setting's flag, its variable, and the variable it had before.
pub(crate) struct Renamed {
    pub flag: &'static str,
    pub new: &'static str,
    pub old: &'static str,
}

pub(crate) const TABLE: Renamed = Renamed {
    flag: "--table",
    new: "FGA_RELAY_OUTBOX_TABLE",
    old: "FGA_OUTBOX_TABLE",
};

pub(crate) const CA_FILE: Renamed = Renamed {
    flag: "--ca-file",
    new: "FGA_RELAY_CA_FILE",
    old: "FGA_CA_FILE",
};

pub(crate) const MAX_TUPLES_PER_WRITE: Renamed = Renamed {
    flag: "--max-tuples-per-write",
    new: "FGA_RELAY_MAX_TUPLES_PER_WRITE",
    old: "FGA_MAX_TUPLES_PER_WRITE",
};

/// The value a renamed setting has, and how to name it in an error: by the name it came from.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Found {
    pub value: Option<String>,
    pub setting: String,
}

impl Renamed {
    /// `--table (FGA_RELAY_OUTBOX_TABLE)`.
    pub fn setting(&self) -> String {
        format!("{} ({})", self.flag, self.new)
    }

    /// The value: `given` (what clap read from the flag or the new variable), else the old
    /// variable's, else none. Warns when the old variable is set.
    pub fn resolve(&self, given: Option<&str>) -> Result<Found, ConfigError> {
        let found = self.resolve_from(given, std::env::var_os(self.old))?;
        if let Some(warning) = found.1 {
            warn!("{warning}");
        }
        Ok(found.0)
    }

    fn resolve_from(
        &self,
        given: Option<&str>,
        old: Option<OsString>,
    ) -> Result<(Found, Option<String>), ConfigError> {
        let given = given.map(str::trim).filter(|s| !s.is_empty());
        let old = match old {
            None => None,
            Some(v) => Some(v.into_string().map_err(|_| {
                ConfigError::new(
                    self.old,
                    format!("is not valid UTF-8 (and is deprecated: use {})", self.new),
                )
            })?),
        };
        let old = old.map(|s| s.trim().to_owned()).filter(|s| !s.is_empty());
        Ok(match (given, old) {
            (Some(v), old) => (
                Found {
                    value: Some(v.to_owned()),
                    setting: self.setting(),
                },
                old.map(|_| {
                    format!(
                        "{} is deprecated and ignored: {} or {} is set and wins",
                        self.old, self.new, self.flag
                    )
                }),
            ),
            (None, Some(v)) => (
                Found {
                    value: Some(v),
                    setting: format!("{} (deprecated: rename it {})", self.old, self.new),
                },
                Some(format!(
                    "{} is deprecated and will be removed: rename it {}",
                    self.old, self.new
                )),
            ),
            (None, None) => (
                Found {
                    value: None,
                    setting: self.setting(),
                },
                None,
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(s: &str) -> Option<OsString> {
        Some(OsString::from(s))
    }

    #[test]
    fn the_new_name_wins_then_the_old_one_then_nothing_and_empty_is_unset() {
        let t = &TABLE;
        let (f, w) = t.resolve_from(Some("a"), None).unwrap();
        assert_eq!(f.value.as_deref(), Some("a"));
        assert_eq!(f.setting, "--table (FGA_RELAY_OUTBOX_TABLE)");
        assert!(w.is_none());

        let (f, w) = t.resolve_from(Some("a"), os("b")).unwrap();
        assert_eq!(f.value.as_deref(), Some("a"));
        assert!(
            w.unwrap()
                .contains("FGA_OUTBOX_TABLE is deprecated and ignored")
        );

        let (f, w) = t.resolve_from(None, os(" b ")).unwrap();
        assert_eq!(f.value.as_deref(), Some("b"));
        assert!(f.setting.starts_with("FGA_OUTBOX_TABLE"), "{}", f.setting);
        assert!(w.unwrap().contains("rename it FGA_RELAY_OUTBOX_TABLE"));

        // Empty is unset, for either name.
        let (f, w) = t.resolve_from(Some(" "), os("b")).unwrap();
        assert_eq!(f.value.as_deref(), Some("b"));
        assert!(w.is_some());
        let (f, w) = t.resolve_from(Some(""), os("")).unwrap();
        assert_eq!(f.value, None);
        assert!(w.is_none());
        let (f, w) = t.resolve_from(None, None).unwrap();
        assert_eq!(f.value, None);
        assert!(w.is_none());
    }
}
