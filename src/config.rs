//! Settings: what the command line and the environment say, validated once.
//!
//! clap only collects raw strings (see `settings/`); they are checked with what is here, so that a
//! bad setting produces one line that names both the flag and the environment variable.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// A setting that is wrong or missing. The binary prints it on one line and exits with status 2.
#[derive(Debug, thiserror::Error)]
#[error("{setting}: {problem}")]
pub struct ConfigError {
    /// The flag and environment variable, e.g. `--store-id (FGA_STORE_ID)`.
    pub setting: String,
    /// What is wrong with it.
    pub problem: String,
}

impl ConfigError {
    pub fn new(setting: &str, problem: impl Into<String>) -> Self {
        ConfigError {
            setting: setting.to_owned(),
            problem: problem.into(),
        }
    }
}

/// A string that must never reach a log line: its `Debug` and `Display` print `[redacted]`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }
    /// The secret itself, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// The outbox table's name: a plain, lower-case SQL identifier, also used as the NOTIFY channel
/// and as the prefix of the objects `migrate` creates (`<table>_notify`, `<table>_pending_idx`,
/// `<table>_leader`). A schema is chosen with the connection's `search_path`, not here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableName(String);

/// Longest table name: leaves room for the longest suffix (`_pending_idx`) within PostgreSQL's
/// 63-byte identifiers.
const MAX_TABLE_NAME: usize = 48;

impl TableName {
    pub fn parse(s: &str) -> Result<TableName, ConfigError> {
        Self::parse_setting("--table (FGA_RELAY_OUTBOX_TABLE)", s)
    }

    /// As [`TableName::parse`], naming `setting` in the error.
    pub fn parse_setting(setting: &str, s: &str) -> Result<TableName, ConfigError> {
        let ok_start = s
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
        let ok_rest = s
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !ok_start || !ok_rest {
            return Err(ConfigError::new(
                setting,
                format!(
                    "{s:?} is not a plain lower-case SQL identifier (letters, digits and _; \
                     choose the schema with search_path in DATABASE_URL)"
                ),
            ));
        }
        if s.len() > MAX_TABLE_NAME {
            return Err(ConfigError::new(
                setting,
                format!("{s:?} is longer than {MAX_TABLE_NAME} characters"),
            ));
        }
        Ok(TableName(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for TableName {
    fn default() -> Self {
        TableName("fga_outbox".to_owned())
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where the relay's PostgreSQL is and which outbox table it serves.
#[derive(Clone, Debug)]
pub struct DbSettings {
    /// The connection string, kept secret because it may carry a password; None: libpq's
    /// environment alone says where (see `db::conninfo`).
    pub url: Option<Secret>,
    pub table: TableName,
}

/// How the relay proves who it is to OpenFGA.
#[derive(Clone, Debug, PartialEq)]
pub enum Auth {
    None,
    /// A preshared key, sent as `Authorization: Bearer <key>`.
    ApiToken(Secret),
    /// OAuth2 client credentials: a token fetched from the issuer and sent as a Bearer token.
    ClientCredentials {
        client_id: String,
        client_secret: Secret,
        token_issuer: reqwest::Url,
        audience: Option<String>,
        /// OAuth2 scopes, space-separated (the token request's `scope`).
        scopes: Option<String>,
    },
}

/// Which store the relay writes to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreRef {
    Id(String),
    /// Resolved through ListStores at start.
    Name(String),
}

/// The id, or the name: what a log line shows (`store=01HZ...`, `store=prod`).
impl fmt::Display for StoreRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreRef::Id(id) => f.write_str(id),
            StoreRef::Name(name) => f.write_str(name),
        }
    }
}

/// Everything about talking to OpenFGA.
#[derive(Clone, Debug)]
pub struct FgaSettings {
    pub api_url: reqwest::Url,
    pub store: StoreRef,
    pub model_id: Option<String>,
    pub auth: Auth,
    /// One request's limit; past it the attempt counts as a transient failure.
    pub request_timeout: Duration,
    /// The server's `--max-tuples-per-write`.
    pub max_tuples_per_write: usize,
    /// Extra CA certificates (PEM) to trust for https.
    pub ca_file: Option<PathBuf>,
}

/// How the delivery loop behaves.
#[derive(Clone, Debug)]
pub struct DeliverySettings {
    /// How often to drain even without a notification.
    pub sweep_interval: Duration,
    /// How often the dedicated connection is checked; a check that takes longer than this counts
    /// the connection as dead. The leader renews its lease at each.
    pub heartbeat_interval: Duration,
    /// How long leadership lasts without a renewal: past it, another relay (or this one after a
    /// reconnect) ends the session holding the leadership lock.
    pub leader_lease: Duration,
    /// Failed attempts, made while other rows were being delivered, after which a row that keeps
    /// failing transiently is dead-lettered.
    pub max_attempts: u32,
    /// Rows read at a time to plan Writes.
    pub batch_size: usize,
    /// The most Writes in flight at once (the adaptive window's ceiling).
    pub max_in_flight: usize,
    /// The nap between passes while rows keep coming (zero: none).
    pub linger: Duration,
}

impl Default for DeliverySettings {
    fn default() -> Self {
        DeliverySettings {
            sweep_interval: Duration::from_secs(30),
            heartbeat_interval: Duration::from_secs(5),
            leader_lease: Duration::from_secs(15),
            max_attempts: 10,
            batch_size: 500,
            max_in_flight: 16,
            linger: Duration::from_millis(1),
        }
    }
}

/// What is added to one Write's deadline to make the fence: scheduling, and the clock of the
/// relay that waits running a little fast against the one that sent.
pub const FENCE_MARGIN: Duration = Duration::from_secs(1);

impl DeliverySettings {
    /// How long a new leader waits, after the end of its predecessor's lease, before its first
    /// Write: the predecessor stops starting Writes when its lease ends by its own clock, and one
    /// Write call (OIDC token and the retry after a 401 included) is over within the request
    /// timeout.
    pub fn fence(&self, request_timeout: Duration) -> Duration {
        request_timeout + FENCE_MARGIN
    }

    /// How long before the end of its lease (as PostgreSQL records it) the leader stops sending
    /// by its own clock (counted from when the renewal was sent, which is before PostgreSQL
    /// starts the lease): one heartbeat, for a clock that runs slow against the server's.
    pub fn lease_margin(&self) -> Duration {
        self.heartbeat_interval
    }

    /// Checks that the heartbeat, the lease and the request timeout can make the fence sound
    /// together. Renewals are due on a fixed cadence, one heartbeat apart, and each is answered
    /// within a heartbeat of when it was due (or the connection counts as dead); the window a
    /// renewal opens runs from when it was sent (at or after it was due) for the lease less the
    /// margin (one heartbeat). So the next renewal is answered at most two heartbeats after
    /// this one was due, inside this one's window exactly when the lease is at least three
    /// heartbeats: slow renewals never close the window of a live connection. The request
    /// timeout bounds a whole Write call, and the fence is
    /// that plus a margin; a Write call that could outlast the lease would leave the leader
    /// unable to stop sending before its lock can be freed.
    pub fn check_timing(&self, request_timeout: Duration) -> Result<(), ConfigError> {
        let lease = "--leader-lease (FGA_RELAY_LEADER_LEASE)";
        if self.leader_lease < self.heartbeat_interval * 3 {
            return Err(ConfigError::new(
                &format!("{lease} and --heartbeat-interval (FGA_RELAY_HEARTBEAT_INTERVAL)"),
                format!(
                    "a lease of {:?} cannot be renewed in time with a heartbeat every {:?}: \
                     make the lease at least three heartbeats",
                    self.leader_lease, self.heartbeat_interval
                ),
            ));
        }
        if request_timeout >= self.leader_lease {
            return Err(ConfigError::new(
                &format!("{lease} and --request-timeout (FGA_RELAY_REQUEST_TIMEOUT)"),
                format!(
                    "a Write may take up to {request_timeout:?}, as long as the whole lease \
                     ({:?}): the leader could not stop sending before its lease runs out; make \
                     the request timeout shorter than the lease",
                    self.leader_lease
                ),
            ));
        }
        Ok(())
    }
}

/// The shortest `--liveness-timeout` may be given: below it, a relay waiting as designed
/// could be found stuck. The longest step of its main loop without a beat is a stream whose
/// session is lost: a lost connection is found within two heartbeats, and the stream is given
/// up one Write's deadline and the fence's margin later. A Write's requests to OpenFGA are
/// shorter steps: each ends within the request timeout and counts as progress.
pub fn shortest_liveness_timeout(
    delivery: &DeliverySettings,
    request_timeout: Duration,
) -> Duration {
    delivery.fence(request_timeout) + delivery.heartbeat_interval * 2
}

/// `--liveness-timeout`: as given, if it is at least [`shortest_liveness_timeout`]; by default
/// `default`, or twice the shortest where the other settings make that longer.
pub fn liveness_timeout(
    given: Option<&str>,
    default: Duration,
    delivery: &DeliverySettings,
    request_timeout: Duration,
) -> Result<Duration, ConfigError> {
    let setting = "--liveness-timeout (FGA_RELAY_LIVENESS_TIMEOUT)";
    let shortest = shortest_liveness_timeout(delivery, request_timeout);
    let Some(given) = given.map(str::trim).filter(|s| !s.is_empty()) else {
        return Ok(default.max(shortest * 2));
    };
    let timeout = parse_positive_duration(setting, given)?;
    if timeout < shortest {
        return Err(ConfigError::new(
            setting,
            format!(
                "{given:?} is shorter than the longest step the relay takes without making \
                 progress with its other settings ({}: --request-timeout plus 1 s, and two \
                 --heartbeat-interval); make it at least that",
                humantime::format_duration(shortest)
            ),
        ));
    }
    Ok(timeout)
}

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

impl LogFormat {
    pub fn parse(s: &str) -> Result<LogFormat, ConfigError> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(ConfigError::new(
                "--log-format (FGA_RELAY_LOG_FORMAT)",
                format!("{other:?} is neither \"text\" nor \"json\""),
            )),
        }
    }
}

/// The longest duration any setting takes. Far beyond any sensible value, and far enough below
/// what a clock can hold that sums and multiples of settings (three heartbeats, a deadline from
/// now) never overflow.
pub const LONGEST_DURATION: Duration = Duration::from_secs(100 * 31_557_600);

/// Parses a humantime duration (`30s`, `1m 30s`, `250ms`) for the named setting, up to
/// [`LONGEST_DURATION`].
pub fn parse_duration(setting: &str, s: &str) -> Result<Duration, ConfigError> {
    let d = humantime::parse_duration(s.trim()).map_err(|e| {
        ConfigError::new(
            setting,
            format!("{s:?} is not a duration such as 30s or 1m ({e})"),
        )
    })?;
    at_most(
        setting,
        s,
        d,
        LONGEST_DURATION,
        ", the longest any setting takes",
    )
}

/// `d` (as `s` gave it), if it is no longer than `max` (`why`: what makes that the longest).
fn at_most(
    setting: &str,
    s: &str,
    d: Duration,
    max: Duration,
    why: &str,
) -> Result<Duration, ConfigError> {
    if d > max {
        return Err(ConfigError::new(
            setting,
            format!(
                "{s:?} is longer than {}{why}: give at most that",
                humantime::format_duration(max)
            ),
        ));
    }
    Ok(d)
}

/// Parses a positive duration: zero makes no sense for intervals and timeouts.
pub fn parse_positive_duration(setting: &str, s: &str) -> Result<Duration, ConfigError> {
    let d = parse_duration(setting, s)?;
    if d.is_zero() {
        return Err(ConfigError::new(setting, "must be longer than zero"));
    }
    Ok(d)
}

/// Parses a duration from zero up to `max`.
pub fn parse_duration_up_to(
    setting: &str,
    s: &str,
    max: Duration,
) -> Result<Duration, ConfigError> {
    at_most(setting, s, parse_duration(setting, s)?, max, "")
}

/// Parses a positive duration up to `max` (`why`: what makes that the longest).
pub fn parse_positive_duration_up_to(
    setting: &str,
    s: &str,
    max: Duration,
    why: &str,
) -> Result<Duration, ConfigError> {
    at_most(setting, s, parse_positive_duration(setting, s)?, max, why)
}

/// Parses a whole number within `min..=max`.
pub fn parse_count(setting: &str, s: &str, min: u64, max: u64) -> Result<u64, ConfigError> {
    let n: u64 = s
        .trim()
        .parse()
        .map_err(|_| ConfigError::new(setting, format!("{s:?} is not a whole number")))?;
    if n < min || n > max {
        return Err(ConfigError::new(
            setting,
            format!("{n} is outside {min}..={max}"),
        ));
    }
    Ok(n)
}

/// Parses `--http-addr`: an address to listen on, or `off`.
pub fn parse_http_addr(s: &str) -> Result<Option<SocketAddr>, ConfigError> {
    if s.trim().eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    s.trim().parse().map(Some).map_err(|_| {
        ConfigError::new(
            "--http-addr (FGA_RELAY_HTTP_ADDR)",
            format!("{s:?} is not an address such as 127.0.0.1:9464, nor \"off\""),
        )
    })
}

/// Parses an http(s) URL for the named setting.
pub fn parse_http_url(setting: &str, s: &str) -> Result<reqwest::Url, ConfigError> {
    let shown = shown_url_text(s);
    // `host:port` alone, as a listen address is written: say what it was meant to be.
    let with_scheme = |problem: String| {
        if s.contains("://") {
            problem
        } else {
            format!(
                "{problem}: write it with its scheme, \"http://{}\" (or https://)",
                shown.trim()
            )
        }
    };
    let url = reqwest::Url::parse(s.trim()).map_err(|e| {
        ConfigError::new(
            setting,
            with_scheme(format!("{shown:?} is not a URL ({e})")),
        )
    })?;
    if url.scheme() != "http" && url.scheme() != "https" {
        return Err(ConfigError::new(
            setting,
            with_scheme(format!("{shown:?} must start with http:// or https://")),
        ));
    }
    if url.host_str().is_none() {
        return Err(ConfigError::new(setting, format!("{shown:?} has no host")));
    }
    Ok(url)
}

/// What replaces a URL's userinfo where it is shown.
const USERINFO_SHOWN: &str = "[redacted]@";

/// A URL as logs and errors may show it: its userinfo (`user:password@`, which reqwest sends as
/// Basic credentials) replaced. Errors end up in rows' `last_error`, which `fga_outbox_wait`
/// returns to writers.
pub fn shown_url(url: &reqwest::Url) -> String {
    if url.username().is_empty() && url.password().is_none() {
        return url.to_string();
    }
    let mut bare = url.clone();
    // Only URLs that cannot have userinfo refuse these, and this one has some.
    let _ = bare.set_username("");
    let _ = bare.set_password(None);
    let bare = bare.to_string();
    match bare.split_once("://") {
        Some((scheme, rest)) => format!("{scheme}://{USERINFO_SHOWN}{rest}"),
        None => bare,
    }
}

/// [`shown_url`] for text that may not parse as a URL: everything from `://` to the last `@`
/// goes (more than the userinfo where a path holds an `@`, never less).
pub fn shown_url_text(s: &str) -> String {
    match s.split_once("://") {
        Some((scheme, rest)) => match rest.rsplit_once('@') {
            Some((_, host)) => format!("{scheme}://{USERINFO_SHOWN}{host}"),
            None => s.to_owned(),
        },
        None => match s.rsplit_once('@') {
            Some((_, host)) => format!("{USERINFO_SHOWN}{host}"),
            None => s.to_owned(),
        },
    }
}

/// OpenFGA's pattern for store and model ids: `^[ABCDEFGHJKMNPQRSTVWXYZ0-9]{26}$` (a ULID).
pub fn check_ulid(setting: &str, s: &str) -> Result<String, ConfigError> {
    let ok = s.len() == 26
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b.is_ascii_uppercase() && !b"ILOU".contains(&b)));
    if ok {
        Ok(s.to_owned())
    } else {
        Err(ConfigError::new(
            setting,
            format!("{s:?} is not an OpenFGA id (26 characters of 0-9 and A-Z without I, L, O, U)"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_must_be_plain_identifiers() {
        assert!(TableName::parse("fga_outbox").is_ok());
        assert!(TableName::parse("_x9").is_ok());
        for bad in ["", "9x", "Fga", "a.b", "a-b", "a b", "x\"; drop table y"] {
            let e = TableName::parse(bad).unwrap_err();
            assert!(
                e.to_string()
                    .starts_with("--table (FGA_RELAY_OUTBOX_TABLE)"),
                "{e}"
            );
        }
        assert!(TableName::parse(&"a".repeat(49)).is_err());
    }

    #[test]
    fn durations_name_the_setting() {
        assert_eq!(
            parse_duration("--sweep-interval", "1m 30s").unwrap(),
            Duration::from_secs(90)
        );
        let e = parse_duration("--sweep-interval (FGA_RELAY_SWEEP_INTERVAL)", "soon").unwrap_err();
        assert!(e.to_string().contains("FGA_RELAY_SWEEP_INTERVAL"), "{e}");
        assert!(parse_positive_duration("--x", "0s").is_err());
    }

    #[test]
    fn ids_follow_openfga_pattern() {
        assert!(check_ulid("--store-id", "01ARZ3NDEKTSV4RRFFQ69G5FAV").is_ok());
        assert!(check_ulid("--store-id", "01ARZ3NDEKTSV4RRFFQ69G5FAI").is_err());
        assert!(check_ulid("--store-id", "short").is_err());
        assert!(check_ulid("--store-id", "01arz3ndektsv4rrffq69g5fav").is_err());
    }

    #[test]
    fn secrets_print_as_redacted() {
        assert_eq!(format!("{:?}", Secret::new("tok")), "[redacted]");
    }

    #[test]
    fn heartbeat_lease_and_request_timeout_are_checked_together() {
        let d = DeliverySettings::default();
        assert!(d.check_timing(Duration::from_secs(10)).is_ok());
        let short = DeliverySettings {
            leader_lease: Duration::from_secs(12),
            ..DeliverySettings::default()
        };
        let e = short.check_timing(Duration::from_secs(2)).unwrap_err();
        assert!(e.to_string().contains("FGA_RELAY_LEADER_LEASE"), "{e}");
        assert!(
            e.to_string().contains("FGA_RELAY_HEARTBEAT_INTERVAL"),
            "{e}"
        );
        let e = d.check_timing(Duration::from_secs(15)).unwrap_err();
        assert!(e.to_string().contains("FGA_RELAY_REQUEST_TIMEOUT"), "{e}");
    }

    #[test]
    fn the_liveness_timeout_is_above_the_longest_step() {
        let d = DeliverySettings::default();
        let timeout = Duration::from_secs(10);
        let default = Duration::from_secs(120);
        // 10 s + 1 s + 2 × 5 s.
        assert_eq!(
            shortest_liveness_timeout(&d, timeout),
            Duration::from_secs(21)
        );
        assert_eq!(
            liveness_timeout(None, default, &d, timeout).unwrap(),
            default
        );
        assert_eq!(
            liveness_timeout(Some(" "), default, &d, timeout).unwrap(),
            default
        );
        assert_eq!(
            liveness_timeout(Some("30s"), default, &d, timeout).unwrap(),
            Duration::from_secs(30)
        );
        let e = liveness_timeout(Some("20s"), default, &d, timeout).unwrap_err();
        assert!(e.to_string().contains("FGA_RELAY_LIVENESS_TIMEOUT"), "{e}");
        // A long request timeout makes the default longer rather than refusing to start.
        let long = DeliverySettings {
            leader_lease: Duration::from_secs(600),
            ..DeliverySettings::default()
        };
        assert_eq!(
            liveness_timeout(None, default, &long, Duration::from_secs(300)).unwrap(),
            Duration::from_secs(2 * 311)
        );
    }

    #[test]
    fn urls_are_shown_without_their_userinfo() {
        let url = |s| reqwest::Url::parse(s).unwrap();
        assert_eq!(
            shown_url(&url("https://user:pw@fga.internal:8443/a?b=c")),
            "https://[redacted]@fga.internal:8443/a?b=c"
        );
        assert_eq!(
            shown_url(&url("https://pw@fga.internal/")),
            "https://[redacted]@fga.internal/"
        );
        assert_eq!(
            shown_url(&url("https://:pw@fga.internal/")),
            "https://[redacted]@fga.internal/"
        );
        assert_eq!(
            shown_url(&url("http://fga.internal/")),
            "http://fga.internal/"
        );
        assert_eq!(
            shown_url_text("ftp://u:p/w@x@host"),
            "ftp://[redacted]@host"
        );
        assert_eq!(shown_url_text("u:pw@host"), "[redacted]@host");
        let e = parse_http_url("--api-url", "ftp://user:s3cret@fga").unwrap_err();
        assert!(!e.to_string().contains("s3cret"), "{e}");
        let e = parse_http_url("--api-url", "https://user:s3cret@[fga").unwrap_err();
        assert!(!e.to_string().contains("s3cret"), "{e}");
    }

    #[test]
    fn a_url_without_its_scheme_is_shown_with_it() {
        for (given, meant) in [
            ("127.0.0.1:18080", "http://127.0.0.1:18080"),
            ("localhost:8080", "http://localhost:8080"),
            ("fga.internal", "http://fga.internal"),
            ("u:s3cret@fga:8080", "http://[redacted]@fga:8080"),
        ] {
            let e = parse_http_url("--api-url", given).unwrap_err().to_string();
            assert!(
                e.contains(&format!("\"{meant}\" (or https://)")),
                "{given}: {e}"
            );
            assert!(!e.contains("s3cret"), "{e}");
        }
        let e = parse_http_url("--api-url", "ftp://fga")
            .unwrap_err()
            .to_string();
        assert!(
            !e.contains("write it"),
            "a scheme given is not second-guessed: {e}"
        );
    }

    #[test]
    fn http_addr_can_be_off() {
        assert_eq!(parse_http_addr("off").unwrap(), None);
        assert!(parse_http_addr("127.0.0.1:9464").unwrap().is_some());
        assert!(parse_http_addr("localhost").is_err());
    }
}
