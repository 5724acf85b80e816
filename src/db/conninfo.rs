//! Where and how to connect, from everything libpq would read, in libpq's order: what the
//! connection string (`DATABASE_URL`) says wins; what it leaves out comes from libpq's
//! environment (`PGHOST`, `PGPORT`, `PGUSER`, `PGPASSWORD`, `PGDATABASE`, `PGSSLMODE`,
//! `PGSSLROOTCERT`, `PGSSLCERT`, `PGSSLKEY`, `PGAPPNAME`, `PGCONNECT_TIMEOUT`); then defaults.
//! The password file (`PGPASSFILE`, or `~/.pgpass`) is read only when neither gives a password.
//! Without `DATABASE_URL` the environment stands alone, as it does for `psql`.
//!
//! Defaults: the Unix sockets in `/var/run/postgresql` (Debian's libpq) then `/tmp` (upstream's),
//! port 5432, the operating system's user name, a database named as the user.

use super::pgpass;
use super::tls::{self, TlsParams};
use crate::config::ConfigError;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio_postgres::Config;
use tokio_postgres::config::Host;

const URL_SETTING: &str = "--database-url (DATABASE_URL)";

/// Where libpq's default builds put the server's socket; a socket there is `localhost` in the
/// password file, as libpq matches its compiled-in default.
pub const DEFAULT_SOCKET_DIRS: &[&str] = &["/var/run/postgresql", "/tmp"];

/// The connection settings, resolved.
pub struct Conninfo {
    pub config: Config,
    pub tls: TlsParams,
    /// The connection string or `PGCONNECT_TIMEOUT` chose the connect timeout (0: none).
    pub connect_timeout_given: bool,
    /// The TLS settings that came from the environment (to name them in errors).
    pub tls_from_env: Vec<&'static str>,
    /// The connection string chose `target_session_attrs`.
    pub target_session_attrs_given: bool,
    /// Neither the connection string nor `PGHOST` named a server: the hosts are libpq's default
    /// socket directories.
    pub hosts_defaulted: bool,
}

/// Resolves `url` (if any) with the environment `env` reads. The password file is read only
/// when `with_password_file` (the log line describing the target does not need it).
pub fn resolve(
    url: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
    with_password_file: bool,
) -> Result<Conninfo, ConfigError> {
    let env = |k: &str| env(k).filter(|v| !v.trim().is_empty());
    let (rest, mut tls) = match url {
        Some(u) => tls::split(u.trim()),
        None => (String::new(), TlsParams::default()),
    };
    let mut config = if rest.trim().is_empty() {
        Config::new()
    } else {
        rest.parse::<Config>().map_err(|e| {
            ConfigError::new(
                URL_SETTING,
                format!("not a PostgreSQL connection string: {}", parse_error(&e)),
            )
        })?
    };
    let hosts_defaulted = fill_target(&mut config, &env)?;
    let connect_timeout_given = if rest.contains("connect_timeout") {
        // libpq's minimum, as for `PGCONNECT_TIMEOUT`: 1 s means 2 s.
        if config
            .get_connect_timeout()
            .is_some_and(|t| *t < MIN_CONNECT_TIMEOUT)
        {
            config.connect_timeout(MIN_CONNECT_TIMEOUT);
        }
        true
    } else {
        connect_timeout_from_env(&mut config, &env)?
    };
    let tls_from_env = fill_tls(&mut tls, &env);
    if config.get_password().is_none() {
        if let Some(p) = env("PGPASSWORD") {
            config.password(p);
        } else if with_password_file && let Some(p) = password_from_file(&config, &env) {
            config.password(p);
        }
    }
    Ok(Conninfo {
        config,
        tls,
        connect_timeout_given,
        tls_from_env,
        target_session_attrs_given: rest.contains("target_session_attrs"),
        hosts_defaulted,
    })
}

/// libpq's connection options: an option tokio-postgres does not take is named only when it is
/// one of these (any other name in a malformed string may be a piece of a password).
const LIBPQ_OPTIONS: &[&str] = &[
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "passfile",
    "require_auth",
    "channel_binding",
    "connect_timeout",
    "client_encoding",
    "options",
    "application_name",
    "fallback_application_name",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "keepalives_retries",
    "tcp_user_timeout",
    "replication",
    "gssencmode",
    "sslmode",
    "sslnegotiation",
    "sslcompression",
    "sslcert",
    "sslkey",
    "sslkeylogfile",
    "sslpassword",
    "sslcertmode",
    "sslrootcert",
    "sslcrl",
    "sslcrldir",
    "sslsni",
    "requirepeer",
    "ssl_min_protocol_version",
    "ssl_max_protocol_version",
    "krbsrvname",
    "gsslib",
    "gssdelegation",
    "service",
    "target_session_attrs",
    "load_balance_hosts",
];

/// What the parser found wrong with a connection string, said without any piece of the string.
/// tokio-postgres' own words quote pieces of it (an option it does not take, the character it
/// tripped on), and in a malformed string those may be pieces of the password: one holding an
/// unescaped `&`, `=` or space is read as more options. Its error's own text ("invalid connection
/// string") says nothing of what is wrong; its source does.
fn parse_error(e: &tokio_postgres::Error) -> String {
    match std::error::Error::source(e) {
        Some(detail) => without_the_string(&detail.to_string()),
        None => e.to_string(),
    }
}

/// [`parse_error`]'s detail with every piece of the string left out, and what to do.
fn without_the_string(detail: &str) -> String {
    const VALUES: &str = "a value holding `&`, `=` or a space must be percent-encoded in a \
                          URL (%26, %3D, %20), or quoted in the key=value form (password='a b')";
    if let Some(option) = detail
        .strip_prefix("unknown option `")
        .and_then(|rest| rest.strip_suffix('`'))
    {
        return if LIBPQ_OPTIONS.contains(&option) {
            format!("libpq's option `{option}` is not one the relay takes: leave it out")
        } else {
            format!(
                "an option libpq does not know either (not shown: it may be a piece of a \
                 password); {VALUES}"
            )
        };
    }
    // "unexpected character at byte N: expected `=` but got `c`": the character is the string's.
    if let Some((expected, _)) = detail.split_once(" but got `") {
        return format!("{expected}; {VALUES}");
    }
    // Any other quoted piece is shown only when it is an option's name.
    detail
        .split('`')
        .enumerate()
        .map(|(i, piece)| match i % 2 {
            0 => piece.to_owned(),
            _ if LIBPQ_OPTIONS.contains(&piece) || piece == "=" => format!("`{piece}`"),
            _ => "`…`".to_owned(),
        })
        .collect()
}

/// Fills in what the connection string left out of where to connect and as whom from libpq's
/// environment (`PGHOST`, `PGPORT`, `PGUSER`, `PGDATABASE`, `PGAPPNAME`), then its defaults.
/// Returns whether the hosts are libpq's default socket directories (no server was named).
fn fill_target(
    config: &mut Config,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<bool, ConfigError> {
    let hosts_defaulted = config.get_hosts().is_empty() && env("PGHOST").is_none();
    if config.get_hosts().is_empty() {
        match env("PGHOST") {
            Some(hosts) => hosts.split(',').for_each(|h| {
                config.host(h.trim());
            }),
            None => DEFAULT_SOCKET_DIRS.iter().for_each(|d| {
                config.host(*d);
            }),
        }
    }
    if config.get_ports().is_empty()
        && let Some(ports) = env("PGPORT")
    {
        for p in ports.split(',') {
            let port = p
                .trim()
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| ConfigError::new("PGPORT", format!("{p:?} is not a port")))?;
            config.port(port);
        }
    }
    if config.get_user().is_none() {
        match env("PGUSER") {
            Some(u) => {
                config.user(u);
            }
            None => {
                if let Ok(u) = whoami::username() {
                    config.user(u);
                }
            }
        }
    }
    if config.get_dbname().is_none()
        && let Some(d) = env("PGDATABASE")
    {
        config.dbname(d);
    }
    if config.get_application_name().is_none()
        && let Some(a) = env("PGAPPNAME")
    {
        config.application_name(a);
    }
    Ok(hosts_defaulted)
}

/// The shortest connect timeout libpq takes: a shorter one given means this.
const MIN_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// `PGCONNECT_TIMEOUT`, as libpq reads it: 0 or less waits for ever, and less than 2 s means
/// 2 s. Returns whether it was given.
fn connect_timeout_from_env(
    config: &mut Config,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<bool, ConfigError> {
    let Some(t) = env("PGCONNECT_TIMEOUT") else {
        return Ok(false);
    };
    let secs: i64 = t.trim().parse().map_err(|_| {
        ConfigError::new(
            "PGCONNECT_TIMEOUT",
            format!("{t:?} is not a number of seconds"),
        )
    })?;
    if secs > 0 {
        config.connect_timeout(Duration::from_secs(secs as u64).max(MIN_CONNECT_TIMEOUT));
    }
    Ok(true)
}

/// Fills in the TLS settings the connection string left out from libpq's environment
/// (`PGSSLMODE`, `PGSSLROOTCERT`, `PGSSLCERT`, `PGSSLKEY`); returns the variables it took.
fn fill_tls(tls: &mut TlsParams, env: &dyn Fn(&str) -> Option<String>) -> Vec<&'static str> {
    let mut from_env = Vec::new();
    for (slot, var) in [
        (&mut tls.sslmode, "PGSSLMODE"),
        (&mut tls.sslrootcert, "PGSSLROOTCERT"),
        (&mut tls.sslcert, "PGSSLCERT"),
        (&mut tls.sslkey, "PGSSLKEY"),
    ] {
        if slot.is_none() {
            *slot = env(var);
            if slot.is_some() {
                from_env.push(var);
            }
        }
    }
    from_env
}

/// The password file's password for the first host that has one (a connection carries one
/// password for all its hosts).
fn password_from_file(config: &Config, env: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    let path = match env("PGPASSFILE") {
        Some(p) => PathBuf::from(p),
        None => env("HOME")
            .map(PathBuf::from)
            .or_else(std::env::home_dir)?
            .join(".pgpass"),
    };
    let contents = pgpass::read(&path)?;
    let user = config.get_user().unwrap_or_default();
    let database = config.get_dbname().unwrap_or(user);
    let ports = config.get_ports();
    let found = config.get_hosts().iter().enumerate().find_map(|(i, host)| {
        let host = match host {
            Host::Tcp(name) => name.clone(),
            #[cfg(unix)]
            Host::Unix(dir) => socket_host(dir),
        };
        let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
        pgpass::lookup(
            &contents,
            &pgpass::Target {
                host: &host,
                port: &port.to_string(),
                database,
                user,
            },
        )
    });
    if found.is_some() {
        tracing::debug!(file = %path.display(), "password from the password file");
    }
    found
}

/// A socket directory as the password file names it.
fn socket_host(dir: &Path) -> String {
    if DEFAULT_SOCKET_DIRS.iter().any(|d| Path::new(d) == dir) {
        "localhost".to_owned()
    } else {
        dir.display().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn with(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    fn hosts(c: &Config) -> Vec<String> {
        c.get_hosts()
            .iter()
            .map(|h| match h {
                Host::Tcp(n) => n.clone(),
                Host::Unix(p) => p.display().to_string(),
            })
            .collect()
    }

    #[test]
    fn hosts_are_defaulted_only_when_neither_the_string_nor_pghost_names_one() {
        let defaulted = |url: Option<&str>, vars: &[(&str, &str)]| {
            resolve(url, &with(vars), false).unwrap().hosts_defaulted
        };
        assert!(defaulted(None, &[]));
        assert!(defaulted(Some("user=relay dbname=app"), &[("PGUSER", "x")]));
        assert!(defaulted(None, &[("PGHOST", " ")]), "empty is unset");
        assert!(!defaulted(None, &[("PGHOST", "db")]));
        assert!(!defaulted(Some("host=/run/pg"), &[]));
        assert!(!defaulted(Some("postgres://db/app"), &[]));
    }

    #[test]
    fn the_connection_string_wins_then_the_environment_then_defaults() {
        let env = with(&[
            ("PGHOST", "envhost"),
            ("PGPORT", "6000"),
            ("PGUSER", "envuser"),
            ("PGPASSWORD", "envpw"),
            ("PGDATABASE", "envdb"),
            ("PGAPPNAME", "envapp"),
            ("PGSSLMODE", "verify-full"),
            ("PGSSLROOTCERT", "/env/root.crt"),
            ("PGCONNECT_TIMEOUT", "1"),
        ]);
        let full = resolve(
            Some("postgres://u:p@h:1/d?application_name=a&sslmode=require&connect_timeout=9&sslrootcert=/u.crt"),
            &env,
            true,
        )
        .unwrap();
        assert_eq!(hosts(&full.config), ["h"]);
        assert_eq!(full.config.get_ports(), [1]);
        assert_eq!(full.config.get_user(), Some("u"));
        assert_eq!(full.config.get_password(), Some(&b"p"[..]));
        assert_eq!(full.config.get_dbname(), Some("d"));
        assert_eq!(full.config.get_application_name(), Some("a"));
        assert_eq!(full.tls.sslmode.as_deref(), Some("require"));
        assert_eq!(full.tls.sslrootcert.as_deref(), Some("/u.crt"));
        assert_eq!(
            full.config.get_connect_timeout(),
            Some(&Duration::from_secs(9))
        );

        // libpq's minimum, from the URL as from the environment.
        let short = resolve(Some("host=h connect_timeout=1"), &env, true).unwrap();
        assert_eq!(
            short.config.get_connect_timeout(),
            Some(&Duration::from_secs(2))
        );

        let empty = resolve(Some("postgresql://"), &env, true).unwrap();
        let none = resolve(None, &env, true).unwrap();
        for r in [empty, none] {
            assert_eq!(hosts(&r.config), ["envhost"]);
            assert_eq!(r.config.get_ports(), [6000]);
            assert_eq!(r.config.get_user(), Some("envuser"));
            assert_eq!(r.config.get_password(), Some(&b"envpw"[..]));
            assert_eq!(r.config.get_dbname(), Some("envdb"));
            assert_eq!(r.config.get_application_name(), Some("envapp"));
            assert_eq!(r.tls.sslmode.as_deref(), Some("verify-full"));
            assert_eq!(r.tls.sslrootcert.as_deref(), Some("/env/root.crt"));
            // libpq's minimum.
            assert_eq!(
                r.config.get_connect_timeout(),
                Some(&Duration::from_secs(2))
            );
            assert!(r.connect_timeout_given);
        }

        let defaults = resolve(None, &with(&[("HOME", "/nonexistent")]), true).unwrap();
        assert_eq!(hosts(&defaults.config), DEFAULT_SOCKET_DIRS);
        assert!(defaults.config.get_ports().is_empty());
        assert!(defaults.config.get_password().is_none());
        assert!(!defaults.connect_timeout_given);
    }

    #[test]
    fn several_hosts_and_ports_and_bad_values_name_the_variable() {
        let r = resolve(
            None,
            &with(&[("PGHOST", "a,/sock"), ("PGPORT", "1,2")]),
            false,
        )
        .unwrap();
        assert_eq!(hosts(&r.config), ["a", "/sock"]);
        assert_eq!(r.config.get_ports(), [1, 2]);
        for (var, value) in [
            ("PGPORT", "x"),
            ("PGPORT", "0"),
            ("PGCONNECT_TIMEOUT", "soon"),
        ] {
            let err = resolve(None, &with(&[(var, value)]), false).err().unwrap();
            assert_eq!(err.setting, var);
        }
        let err = resolve(Some("postgres://[bad"), &with(&[]), false)
            .err()
            .unwrap();
        assert!(err.setting.contains("DATABASE_URL"));
    }

    #[test]
    fn a_malformed_string_is_said_without_any_piece_of_it() {
        // (the string, what is said, pieces of it never said)
        let cases: [(&str, &str, &[&str]); 7] = [
            (
                "postgresql://relay:urlSecret1@db:54x2/app",
                "invalid value for option `port`",
                &["urlSecret1", "54x2"],
            ),
            (
                "postgresql://relay@db/app?password=Qx7&Secret2zz=1",
                "an option libpq does not know either",
                &["Qx7", "Secret2zz"],
            ),
            (
                "host=db password=kv Secret3=x",
                "an option libpq does not know either",
                &["kv", "Secret3"],
            ),
            (
                "host=db password=kv Sec4 Sec5=x",
                "expected `=`; a value holding",
                &["Sec4", "`S`"],
            ),
            (
                "host=db password='unterminated Secret6",
                "unterminated quoted connection parameter value",
                &["Secret6"],
            ),
            (
                "postgresql://relay@db/app?service=prod&password=Secret7",
                "libpq's option `service` is not one the relay takes",
                &["Secret7"],
            ),
            (
                "postgresql://re%FFlay:Secret8@db/app",
                "invalid utf-8",
                &["Secret8"],
            ),
        ];
        for (url, says, never) in cases {
            let err = resolve(Some(url), &with(&[]), false)
                .err()
                .unwrap_or_else(|| panic!("{url} parsed"));
            let line = err.to_string();
            assert!(line.contains(says), "{url}: {line}");
            for piece in never.iter().chain(&[url]) {
                assert!(!line.contains(piece), "{url}: {piece:?} in {line}");
            }
        }
        assert_eq!(
            without_the_string("invalid value `Secret9` for `sslmode`"),
            "invalid value `…` for `sslmode`"
        );
    }
}
