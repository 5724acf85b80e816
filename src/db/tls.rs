//! TLS for the relay's PostgreSQL connections, with libpq's `sslmode` semantics.
//!
//! Users' connection strings come from libpq-land, so they mean here what they mean to `psql`:
//!
//! | `sslmode` | TLS | certificate |
//! |---|---|---|
//! | `disable` | never | – |
//! | `allow`, `prefer` (the default) | if the server offers it | not verified¹ |
//! | `require` | always | not verified¹ |
//! | `verify-ca` | always | chain verified against the roots; host name not checked |
//! | `verify-full` | always | chain verified, and it must name the host |
//!
//! ¹ Unless there are roots (`sslrootcert`, or libpq's default `~/.postgresql/root.crt` when it
//! exists): then the chain is verified, as with `verify-ca`.
//!
//! Roots: `sslrootcert=PATH` (PEM), `sslrootcert=system` (the system's trusted roots; as in
//! libpq ≥ 16 it makes `verify-full` the default and refuses a weaker mode), or else
//! `~/.postgresql/root.crt` when it exists, or else, for `verify-full` only, the system's roots
//! (where libpq would refuse to connect). `sslcert` and `sslkey` give a client certificate (PEM).
//! `sslsni=0` turns SNI off. Unix-socket connections never use TLS (libpq ignores `sslmode` there).
//!
//! Where this differs from libpq: `verify-full` without any roots uses the system's (libpq
//! refuses); `allow` tries TLS first (as `prefer`), and `prefer` does not retry without TLS
//! after a failed handshake; an `sslrootcert` that cannot be read is an error whatever the mode
//! (libpq ignores a missing file below `verify-ca`); a certificate must name the host in its
//! subjectAltName (no fallback to the common name); no `sslcrl`, `sslpassword`, and of the
//! `PGSSL*` environment variables only `PGSSLMODE`, `PGSSLROOTCERT`, `PGSSLCERT` and `PGSSLKEY`
//! (read in `conninfo`); `gssencmode` may only be `disable` or `prefer`.
//!
//! tokio-postgres' own parser knows only `disable`, `prefer` and `require` and rejects the other
//! keys, so [`split`] takes the TLS keys out of the connection string (both the URL and the
//! key=value form) before it parses the rest, and [`configure`] turns them into a rustls
//! configuration and the mode tokio-postgres should use.

use crate::config::ConfigError;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio_postgres::config::SslMode as PgSslMode;
use tokio_postgres_rustls::MakeRustlsConnect;

const SETTING: &str = "--database-url (DATABASE_URL)";

/// The keys [`split`] takes out of a connection string.
const TLS_KEYS: &[&str] = &[
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "sslsni",
    "gssencmode",
];

/// libpq's `sslmode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Allow,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

/// Why an option's value is left out of its error: in a URL whose password holds an unescaped
/// `&`, what follows it reads as more options (`...?password=a&sslmode=b`), and the value may
/// be a piece of the password.
const NOT_SHOWN: &str = " (the value given is not shown: in a malformed string it may be a \
                         piece of a password)";

impl SslMode {
    fn parse(s: &str) -> Result<SslMode, ConfigError> {
        Ok(match s {
            "disable" => SslMode::Disable,
            "allow" => SslMode::Allow,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => {
                return Err(ConfigError::new(
                    SETTING,
                    format!(
                        "sslmode is not one of disable, allow, prefer, require, verify-ca, \
                         verify-full{}",
                        NOT_SHOWN
                    ),
                ));
            }
        })
    }

    fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Allow => "allow",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// The TLS keys of a connection string, as written (not yet checked).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsParams {
    pub sslmode: Option<String>,
    pub sslrootcert: Option<String>,
    pub sslcert: Option<String>,
    pub sslkey: Option<String>,
    pub sslsni: Option<String>,
    pub gssencmode: Option<String>,
}

impl TlsParams {
    fn set(&mut self, key: &str, value: String) {
        let slot = match key {
            "sslmode" => &mut self.sslmode,
            "sslrootcert" => &mut self.sslrootcert,
            "sslcert" => &mut self.sslcert,
            "sslkey" => &mut self.sslkey,
            "sslsni" => &mut self.sslsni,
            "gssencmode" => &mut self.gssencmode,
            _ => unreachable!("only TLS_KEYS are set"),
        };
        // As in libpq, the last occurrence wins.
        *slot = Some(value);
    }
}

/// Splits a connection string into what tokio-postgres should parse and the TLS keys it does
/// not understand. The rest of the string is kept byte for byte. A string this cannot read is
/// returned unchanged, for tokio-postgres to report on.
pub fn split(conn: &str) -> (String, TlsParams) {
    let mut params = TlsParams::default();
    let spans = if conn.starts_with("postgres://") || conn.starts_with("postgresql://") {
        url_params(conn)
    } else {
        key_value_params(conn)
    };
    let Some(spans) = spans else {
        return (conn.to_owned(), params);
    };
    let mut rest = conn.to_owned();
    // Back to front, so that earlier spans stay where they are.
    for (key, value, span) in spans.into_iter().rev() {
        if TLS_KEYS.contains(&key.as_str()) {
            params.set(&key, value);
            rest.replace_range(span, "");
        }
    }
    (tidy(&rest, conn), params)
}

/// After removing parameters: a URL's `?&a=b&` becomes `?a=b`, and a lone `?` goes.
fn tidy(rest: &str, original: &str) -> String {
    if !(original.starts_with("postgres://") || original.starts_with("postgresql://")) {
        return rest.trim().to_owned();
    }
    let Some(q) = query_start(rest) else {
        return rest.to_owned();
    };
    let query: Vec<&str> = rest[q + 1..].split('&').filter(|p| !p.is_empty()).collect();
    if query.is_empty() {
        rest[..q].to_owned()
    } else {
        format!("{}?{}", &rest[..q], query.join("&"))
    }
}

/// Where a URL's query starts (the `?`). As tokio-postgres does, the credentials run to the
/// first `@`, so a `?` in a password is not the query.
fn query_start(url: &str) -> Option<usize> {
    let after_scheme = url.find("://")? + 3;
    let from = url[after_scheme..]
        .find('@')
        .map_or(after_scheme, |i| after_scheme + i);
    url[from..].find('?').map(|i| from + i)
}

/// A parameter: key, value (decoded) and the bytes it occupies (with one `&` for a URL).
type Param = (String, String, Range<usize>);

/// The parameters of a URL's query.
fn url_params(url: &str) -> Option<Vec<Param>> {
    let Some(q) = query_start(url) else {
        return Some(Vec::new());
    };
    let mut out = Vec::new();
    let mut at = q + 1;
    for pair in url[q + 1..].split('&') {
        let span = at..(at + pair.len() + 1).min(url.len());
        at += pair.len() + 1;
        let Some((key, value)) = pair.split_once('=') else {
            continue;
        };
        let key = percent_encoding::percent_decode_str(key)
            .decode_utf8()
            .ok()?;
        let value = percent_encoding::percent_decode_str(value)
            .decode_utf8()
            .ok()?;
        out.push((key.into_owned(), value.into_owned(), span));
    }
    Some(out)
}

/// The parameters of a key=value string, read as tokio-postgres (and libpq) reads them: values
/// bare or in single quotes, `\` escaping the next character.
fn key_value_params(s: &str) -> Option<Vec<Param>> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    loop {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        // `>=`: a value ending in a lone `\` steps one past the end.
        if i >= b.len() {
            return Some(out);
        }
        let start = i;
        while i < b.len() && !b[i].is_ascii_whitespace() && b[i] != b'=' {
            i += 1;
        }
        let key = s[start..i].to_owned();
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        if b.get(i) != Some(&b'=') {
            return None;
        }
        i += 1;
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        let mut value = Vec::new();
        if b.get(i) == Some(&b'\'') {
            i += 1;
            loop {
                match b.get(i)? {
                    b'\'' => {
                        i += 1;
                        break;
                    }
                    b'\\' => {
                        value.push(*b.get(i + 1)?);
                        i += 2;
                    }
                    c => {
                        value.push(*c);
                        i += 1;
                    }
                }
            }
        } else {
            while i < b.len() && !b[i].is_ascii_whitespace() {
                if b[i] == b'\\' {
                    i += 1;
                }
                if let Some(c) = b.get(i) {
                    value.push(*c);
                }
                i += 1;
            }
            if value.is_empty() {
                return None;
            }
        }
        out.push((key, String::from_utf8(value).ok()?, start..i.min(b.len())));
    }
}

/// How the relay's PostgreSQL connections use TLS.
#[derive(Clone)]
pub struct PgTls {
    /// What tokio-postgres is told: `Disable`, `Prefer` or `Require`.
    pub mode: PgSslMode,
    /// The rustls connector, with the verifier the `sslmode` asks for.
    pub connector: MakeRustlsConnect,
}

/// Turns the TLS keys into a rustls configuration. `unix_only`: every host is a Unix socket,
/// where TLS is never used and nothing else is looked at.
pub fn configure(params: &TlsParams, unix_only: bool) -> Result<PgTls, ConfigError> {
    let given = params.sslmode.as_deref().map(SslMode::parse).transpose()?;
    let root = params.sslrootcert.as_deref().filter(|s| !s.is_empty());
    let mode = match (given, root) {
        (Some(m), _) => m,
        (None, Some("system")) => SslMode::VerifyFull,
        (None, _) => SslMode::Prefer,
    };
    check_gssencmode(params)?;
    let provider = provider();
    if unix_only || mode == SslMode::Disable {
        return Ok(PgTls {
            mode: PgSslMode::Disable,
            connector: MakeRustlsConnect::new(client_config(
                &provider,
                Arc::new(LibpqVerifier {
                    roots: None,
                    provider: provider.clone(),
                }),
                None,
                true,
            )?),
        });
    }
    if root == Some("system") && mode != SslMode::VerifyFull {
        return Err(ConfigError::new(
            SETTING,
            format!(
                "weak sslmode \"{}\" may not be used with sslrootcert=system (use \"verify-full\")",
                mode.as_str()
            ),
        ));
    }
    let verifier = verifier(mode, roots(mode, root)?, &provider)?;
    let client_cert = client_cert(params)?;
    let sni = sni(params)?;
    Ok(PgTls {
        mode: match mode {
            SslMode::Allow | SslMode::Prefer => PgSslMode::Prefer,
            _ => PgSslMode::Require,
        },
        connector: MakeRustlsConnect::new(client_config(&provider, verifier, client_cert, sni)?),
    })
}

/// GSSAPI encryption is not done: only `gssencmode` disable or prefer (which falls back) pass.
fn check_gssencmode(params: &TlsParams) -> Result<(), ConfigError> {
    match params.gssencmode.as_deref() {
        None | Some("disable" | "prefer") => Ok(()),
        Some(_) => Err(ConfigError::new(
            SETTING,
            format!(
                "gssencmode is neither disable nor prefer: fga-relay does not do GSSAPI \
                 encryption (use gssencmode=disable, and sslmode for TLS){NOT_SHOWN}"
            ),
        )),
    }
}

/// The root certificates to verify the server with (`root`: sslrootcert), if any.
fn roots(mode: SslMode, root: Option<&str>) -> Result<Option<RootCertStore>, ConfigError> {
    Ok(match root {
        Some("system") => Some(system_roots()?),
        Some(path) => Some(file_roots(Path::new(path))?),
        None => match default_root_file().filter(|p| p.is_file()) {
            Some(path) => Some(file_roots(&path)?),
            // libpq refuses here; the system's roots are as safe with a host name to check (it
            // is what sslrootcert=system means) and what an operator expects of verify-full.
            None if mode == SslMode::VerifyFull => Some(system_roots()?),
            None if mode == SslMode::VerifyCa => {
                return Err(ConfigError::new(
                    SETTING,
                    "sslmode=verify-ca needs root certificates: give sslrootcert=PATH (PEM) \
                     (~/.postgresql/root.crt does not exist). With the system's roots any \
                     public CA's certificate would do: use sslmode=verify-full for those",
                ));
            }
            None => None,
        },
    })
}

/// How the server's certificate is checked, as `mode` asks, with `roots`.
fn verifier(
    mode: SslMode,
    roots: Option<RootCertStore>,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<dyn ServerCertVerifier>, ConfigError> {
    Ok(match (mode, roots) {
        (SslMode::VerifyFull, Some(roots)) => {
            rustls::client::WebPkiServerVerifier::builder_with_provider(
                Arc::new(roots),
                provider.clone(),
            )
            .build()
            .map_err(|e| ConfigError::new(SETTING, format!("sslrootcert: {e}")))?
        }
        (SslMode::VerifyCa | SslMode::VerifyFull, None) => {
            unreachable!("a verifying mode without roots was refused above")
        }
        (_, roots) => Arc::new(LibpqVerifier {
            roots: roots.map(Arc::new),
            provider: provider.clone(),
        }),
    })
}

/// The client certificate and key (sslcert, sslkey), which go together.
fn client_cert(params: &TlsParams) -> Result<Option<ClientIdentity>, ConfigError> {
    match (params.sslcert.as_deref(), params.sslkey.as_deref()) {
        (None, None) => Ok(None),
        (Some(cert), Some(key)) => Ok(Some(client_identity(Path::new(cert), Path::new(key))?)),
        _ => Err(ConfigError::new(
            SETTING,
            "sslcert and sslkey go together: give both, or neither",
        )),
    }
}

/// Whether to send the host name in the TLS handshake (sslsni, on by default).
fn sni(params: &TlsParams) -> Result<bool, ConfigError> {
    match params.sslsni.as_deref() {
        None | Some("1") => Ok(true),
        Some("0") => Ok(false),
        Some(_) => Err(ConfigError::new(
            SETTING,
            format!("sslsni is neither 0 nor 1{NOT_SHOWN}"),
        )),
    }
}

/// The crypto provider: aws-lc-rs, the one reqwest uses too, installed as the process default
/// the first time (so nothing else in the process can pick another).
pub fn provider() -> Arc<CryptoProvider> {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    CryptoProvider::get_default()
        .cloned()
        .expect("a default provider was installed just above")
}

type ClientIdentity = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

fn client_config(
    provider: &Arc<CryptoProvider>,
    verifier: Arc<dyn ServerCertVerifier>,
    client_cert: Option<ClientIdentity>,
    sni: bool,
) -> Result<ClientConfig, ConfigError> {
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| ConfigError::new(SETTING, format!("TLS: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let mut config = match client_cert {
        None => builder.with_no_client_auth(),
        Some((certs, key)) => builder
            .with_client_auth_cert(certs, key)
            .map_err(|e| ConfigError::new(SETTING, format!("sslcert/sslkey: {e}")))?,
    };
    config.enable_sni = sni;
    // As libpq ≥ 17 does; PostgreSQL 17 checks it on direct TLS, older servers ignore it.
    config.alpn_protocols = vec![b"postgresql".to_vec()];
    Ok(config)
}

/// libpq's default root file, `~/.postgresql/root.crt`.
fn default_root_file() -> Option<PathBuf> {
    let home = std::env::var_os("HOME").filter(|h| !h.is_empty())?;
    Some(PathBuf::from(home).join(".postgresql").join("root.crt"))
}

fn file_roots(path: &Path) -> Result<RootCertStore, ConfigError> {
    let certs = read_certs(path, "sslrootcert")?;
    let mut roots = RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(ConfigError::new(
            SETTING,
            format!(
                "sslrootcert: {} holds no usable CA certificate",
                path.display()
            ),
        ));
    }
    Ok(roots)
}

fn system_roots() -> Result<RootCertStore, ConfigError> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    roots.add_parsable_certificates(found.certs);
    if roots.is_empty() {
        let why = found
            .errors
            .first()
            .map(|e| format!(" ({e})"))
            .unwrap_or_default();
        return Err(ConfigError::new(
            SETTING,
            format!("sslrootcert=system: no trusted roots found on this system{why}"),
        ));
    }
    Ok(roots)
}

fn read_certs(path: &Path, key: &str) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| ConfigError::new(SETTING, format!("{key}: {}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(ConfigError::new(
            SETTING,
            format!("{key}: {} holds no PEM certificate", path.display()),
        ));
    }
    Ok(certs)
}

fn client_identity(cert: &Path, key: &Path) -> Result<ClientIdentity, ConfigError> {
    let certs = read_certs(cert, "sslcert")?;
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| ConfigError::new(SETTING, format!("sslkey: {}: {e}", key.display())))?;
    Ok((certs, key))
}

/// libpq's checks short of `verify-full`. Without roots (`prefer`, `require`): any certificate,
/// so the connection is encrypted but the server not authenticated. With roots (`verify-ca`, and
/// `prefer`/`require` given roots): the chain must lead to one of them; the host name is not
/// checked. Either way the handshake's signatures are checked with the provider's algorithms, so
/// the session belongs to whoever holds the certificate's key.
#[derive(Debug)]
struct LibpqVerifier {
    roots: Option<Arc<RootCertStore>>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for LibpqVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if let Some(roots) = &self.roots {
            let cert = rustls::server::ParsedCertificate::try_from(end_entity)?;
            rustls::client::verify_server_cert_signed_by_trust_anchor(
                &cert,
                roots,
                intermediates,
                now,
                self.provider.signature_verification_algorithms.all,
            )?;
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, &str)]) -> TlsParams {
        let mut p = TlsParams::default();
        for (k, v) in pairs {
            p.set(k, (*v).to_owned());
        }
        p
    }

    /// A key=value string whose last value ends in a lone `\\` (a password
    /// ending in a backslash) panicked, and the panic message quoted the whole string, password
    /// included, on stderr.
    #[test]
    fn a_trailing_backslash_neither_panics_nor_shows_the_string() {
        let conn = "host=db password=Secret\\";
        let out = std::panic::catch_unwind(|| split(conn));
        assert!(out.is_ok(), "split panicked on {conn:?}");
    }

    #[test]
    fn urls_lose_their_tls_keys_and_keep_the_rest() {
        let (rest, p) = split(
            "postgres://app:p%40ss@db.internal:5432/app?sslmode=verify-full&application_name=x\
             &sslrootcert=%2Fetc%2Fca.pem&target_session_attrs=any",
        );
        assert_eq!(
            rest,
            "postgres://app:p%40ss@db.internal:5432/app?application_name=x&target_session_attrs=any"
        );
        assert_eq!(
            p,
            params(&[("sslmode", "verify-full"), ("sslrootcert", "/etc/ca.pem")])
        );

        let (rest, p) =
            split("postgresql://db/app?sslmode=require&sslcert=c.pem&sslkey=k.pem&sslsni=0");
        assert_eq!(rest, "postgresql://db/app");
        assert_eq!(p.sslmode.as_deref(), Some("require"));
        assert_eq!(p.sslcert.as_deref(), Some("c.pem"));
        assert_eq!(p.sslkey.as_deref(), Some("k.pem"));
        assert_eq!(p.sslsni.as_deref(), Some("0"));

        // Nothing to take: unchanged, even a `?` inside the password.
        for url in [
            "postgres://db/app",
            "postgres://u:a?b@db/app?application_name=x",
            "postgres://db",
        ] {
            assert_eq!(split(url), (url.to_owned(), TlsParams::default()));
        }
        let (rest, p) = split("postgres://u:a?b@db/app?sslmode=disable");
        assert_eq!(rest, "postgres://u:a?b@db/app");
        assert_eq!(p.sslmode.as_deref(), Some("disable"));
    }

    #[test]
    fn key_value_strings_lose_their_tls_keys_and_keep_the_rest() {
        let (rest, p) = split(
            "host=db.internal  sslmode = verify-ca password='it\\'s me' \
             sslrootcert='/etc/my ca/root.pem' user=app dbname=x sslcert=a\\ b.pem",
        );
        assert_eq!(
            rest,
            "host=db.internal   password='it\\'s me'  user=app dbname=x"
        );
        assert_eq!(p.sslmode.as_deref(), Some("verify-ca"));
        assert_eq!(p.sslrootcert.as_deref(), Some("/etc/my ca/root.pem"));
        assert_eq!(p.sslcert.as_deref(), Some("a b.pem"));
        // What is left parses, the password intact.
        let cfg: tokio_postgres::Config = rest.parse().unwrap();
        assert_eq!(cfg.get_password(), Some(&b"it's me"[..]));

        let (rest, p) = split("host=/run/postgresql gssencmode=disable");
        assert_eq!(rest, "host=/run/postgresql");
        assert_eq!(p.gssencmode.as_deref(), Some("disable"));

        // Unreadable: left for tokio-postgres to report.
        let bad = "host=db sslmode='require";
        assert_eq!(split(bad).0, bad);
    }

    #[test]
    fn modes_map_to_what_tokio_postgres_can_do() {
        let mode = |pairs: &[(&str, &str)]| configure(&params(pairs), false).map(|t| t.mode);
        assert_eq!(mode(&[]).unwrap(), PgSslMode::Prefer);
        assert_eq!(mode(&[("sslmode", "disable")]).unwrap(), PgSslMode::Disable);
        assert_eq!(mode(&[("sslmode", "allow")]).unwrap(), PgSslMode::Prefer);
        assert_eq!(mode(&[("sslmode", "require")]).unwrap(), PgSslMode::Require);
        // Unix sockets: never TLS, nothing else checked.
        let unix = configure(&params(&[("sslmode", "verify-full")]), true).unwrap();
        assert_eq!(unix.mode, PgSslMode::Disable);
    }

    #[test]
    fn bad_tls_settings_name_the_setting() {
        let err = |pairs: &[(&str, &str)]| {
            configure(&params(pairs), false)
                .err()
                .expect("an error")
                .to_string()
        };
        let e = err(&[("sslmode", "verify_full")]);
        assert!(e.starts_with(SETTING) && e.contains("verify-full"), "{e}");
        let e = err(&[("sslmode", "require"), ("sslrootcert", "system")]);
        assert!(e.contains("weak sslmode \"require\""), "{e}");
        let e = err(&[("sslrootcert", "/nonexistent/ca.pem")]);
        assert!(e.contains("/nonexistent/ca.pem"), "{e}");
        let e = err(&[("sslmode", "require"), ("sslcert", "c.pem")]);
        assert!(e.contains("sslcert and sslkey"), "{e}");
        let e = err(&[("sslsni", "yes")]);
        assert!(e.contains("sslsni"), "{e}");
        let e = err(&[("gssencmode", "require")]);
        assert!(e.contains("GSSAPI"), "{e}");
        // A value is never shown: it may be a piece of a password.
        for (key, value) in [
            ("sslmode", "hunter2"),
            ("sslsni", "hunter2"),
            ("gssencmode", "hunter2"),
        ] {
            let e = err(&[(key, value)]);
            assert!(e.contains(key) && !e.contains(value), "{e}");
        }
    }
}
