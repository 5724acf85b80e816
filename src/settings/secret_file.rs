//! Secrets the way deployments pass them: the variable itself, a file named by `<VAR>_FILE`
//! (Docker and Kubernetes secrets), or a systemd credential (`LoadCredential=` puts it in
//! `$CREDENTIALS_DIRECTORY`). Giving a variable and its `_FILE` both is an error (which one was
//! meant?); a credential is read only when neither is given. A file's trailing newline is not part
//! of the secret (`echo secret > file` writes one). A file that holds nothing else is an error, not
//! "no secret": caught half-written by a rewrite that is not atomic, it would otherwise turn into
//! Writes without credentials, or connections to libpq's defaults.

use crate::config::ConfigError;
use std::path::{Path, PathBuf};

/// Where one secret may come from.
pub struct SecretSource<'a> {
    /// `--api-token (FGA_API_TOKEN)`.
    pub setting: &'a str,
    /// `--api-token-file (FGA_API_TOKEN_FILE)`.
    pub file_setting: &'a str,
    /// The systemd credential's name, e.g. `fga-api-token`.
    pub credential: &'a str,
}

impl SecretSource<'_> {
    /// The secret, from the value, the file or the credential; None when none gives one.
    pub fn resolve(
        &self,
        value: Option<&str>,
        file: Option<&str>,
    ) -> Result<Option<String>, ConfigError> {
        let value = value.filter(|s| !s.trim().is_empty());
        let file = file.filter(|s| !s.trim().is_empty());
        match (value, file) {
            (Some(_), Some(_)) => Err(ConfigError::new(
                self.setting,
                format!("give either it or {}, not both", self.file_setting),
            )),
            (Some(v), None) => Ok(Some(v.to_owned())),
            (None, Some(path)) => read(self.file_setting, Path::new(path.trim())).map(Some),
            (None, None) => match credential_path(self.credential) {
                Some(path) => read(
                    &format!("the systemd credential {}", self.credential),
                    &path,
                )
                .map(Some),
                None => Ok(None),
            },
        }
    }
}

impl SecretSource<'_> {
    /// Where the secret is read from, when that is a file: the `_FILE` setting, or the systemd
    /// credential. None when it is given as a value, or not at all.
    pub fn file_origin(&self, value: Option<&str>, file: Option<&str>) -> Option<String> {
        let value = value.filter(|s| !s.trim().is_empty());
        let file = file.filter(|s| !s.trim().is_empty());
        match (value, file) {
            (None, Some(_)) => Some(self.file_setting.to_owned()),
            (None, None) => credential_path(self.credential)
                .map(|_| format!("the systemd credential {}", self.credential)),
            (Some(_), _) => None,
        }
    }
}

/// `$CREDENTIALS_DIRECTORY/<name>`, when systemd passed that credential.
fn credential_path(name: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("CREDENTIALS_DIRECTORY").filter(|d| !d.is_empty())?;
    let path = Path::new(&dir).join(name);
    path.exists().then_some(path)
}

/// The file's contents without one trailing newline; an error when nothing else is left. Errors
/// name the file, never its contents.
fn read(setting: &str, path: &Path) -> Result<String, ConfigError> {
    let mut s = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::new(setting, format!("cannot read {}: {e}", path.display())))?;
    if s.ends_with('\n') {
        s.pop();
        if s.ends_with('\r') {
            s.pop();
        }
    }
    if s.trim().is_empty() {
        return Err(ConfigError::new(
            setting,
            format!("{} is empty", path.display()),
        ));
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOURCE: SecretSource<'static> = SecretSource {
        setting: "--api-token (FGA_API_TOKEN)",
        file_setting: "--api-token-file (FGA_API_TOKEN_FILE)",
        credential: "no-such-credential-in-unit-tests",
    };

    #[test]
    fn a_value_or_a_file_not_both_and_the_newline_goes() {
        let dir = std::env::temp_dir().join(format!("secret-file-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, "s3cret\n").unwrap();
        let f = file.to_str().unwrap();
        assert_eq!(
            SOURCE.resolve(Some("v"), None).unwrap().as_deref(),
            Some("v")
        );
        assert_eq!(
            SOURCE.resolve(None, Some(f)).unwrap().as_deref(),
            Some("s3cret")
        );
        std::fs::write(&file, "two\nlines\r\n").unwrap();
        assert_eq!(
            SOURCE.resolve(None, Some(f)).unwrap().as_deref(),
            Some("two\nlines")
        );
        assert_eq!(SOURCE.resolve(Some(""), Some("")).unwrap(), None);
        let both = SOURCE.resolve(Some("v"), Some(f)).err().unwrap();
        assert!(both.to_string().contains("FGA_API_TOKEN_FILE"), "{both}");
        assert!(both.to_string().contains("(FGA_API_TOKEN)"), "{both}");
        for empty in ["", "\n", " \r\n"] {
            std::fs::write(&file, empty).unwrap();
            let e = SOURCE.resolve(None, Some(f)).err().unwrap();
            assert!(e.to_string().contains("is empty"), "{empty:?}: {e}");
        }
        let missing = SOURCE.resolve(None, Some("/nonexistent/x")).err().unwrap();
        assert!(
            missing.to_string().contains("FGA_API_TOKEN_FILE"),
            "{missing}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
