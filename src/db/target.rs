//! What the logs may say about where the relay connects: the servers, database and user that
//! `DATABASE_URL` and libpq's environment name, read from the resolved settings. The string itself never reaches a log line: libpq takes a password
//! in too many places (URL user info, `%`-encoded, `?password=`, `password = x`, quoted
//! `password='a b'`) for a hand-made redaction to find them all.

use crate::config::DbSettings;
use tokio_postgres::config::Host;

/// `host=a,b port=5432 dbname=app user=relay` for the startup log line, or a placeholder when
/// the settings cannot be resolved (their error is reported, without the string, when
/// connecting).
pub fn summary(db: &DbSettings) -> String {
    summary_with(db.url.as_ref().map(|u| u.expose()), &|k| {
        std::env::var(k).ok()
    })
}

fn summary_with(url: Option<&str>, env: &dyn Fn(&str) -> Option<String>) -> String {
    let Ok(info) = super::conninfo::resolve(url, env, false) else {
        return "(the connection settings cannot be parsed)".to_owned();
    };
    of_config(&info.config)
}

/// [`summary`] of settings already resolved.
pub fn of_config(cfg: &tokio_postgres::Config) -> String {
    let hosts: Vec<String> = cfg
        .get_hosts()
        .iter()
        .map(|h| match h {
            Host::Tcp(name) => name.clone(),
            #[cfg(unix)]
            Host::Unix(path) => path.display().to_string(),
        })
        .collect();
    let ports: Vec<String> = cfg.get_ports().iter().map(u16::to_string).collect();
    let or_default = |v: Vec<String>, d: &str| {
        if v.is_empty() {
            d.to_owned()
        } else {
            v.join(",")
        }
    };
    let user = cfg.get_user().unwrap_or("(default)");
    format!(
        "host={} port={} dbname={} user={}",
        or_default(hosts, "(default)"),
        or_default(ports, "5432"),
        cfg.get_dbname().unwrap_or(user),
        user,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_libpq_takes_shows_where_and_never_the_password() {
        let cases = [
            (
                "postgres://app:s3cret@db:5433/app?sslmode=require",
                "host=db port=5433 dbname=app user=app",
                "s3cret",
            ),
            (
                "postgresql://app:s%40cr%3At@db/app",
                "host=db port=5432 dbname=app user=app",
                "s@cr:t",
            ),
            (
                "postgresql://db/app?user=a&password=s3cret",
                "host=db port=5432 dbname=app user=a",
                "s3cret",
            ),
            (
                "host=/tmp user=a password = s3cret dbname=x",
                "host=/tmp port=5432 dbname=x user=a",
                "s3cret",
            ),
            (
                "host=h user=a password='s3 cret' dbname=x",
                "host=h port=5432 dbname=x user=a",
                "s3 cret",
            ),
            (
                "host=h user=a password='s3\\'cret' dbname=x",
                "host=h port=5432 dbname=x user=a",
                "cret",
            ),
            (
                "host=a,b port=1,2 user=u dbname=d password=s3cret sslrootcert=/x",
                "host=a,b port=1,2 dbname=d user=u",
                "s3cret",
            ),
        ];
        for (url, want, secret) in cases {
            let got = summary_with(Some(url), &|_| None);
            assert_eq!(got, want, "{url}");
            assert!(!got.contains(secret));
        }
        let broken = summary_with(Some("postgres://u:s3cret@[bad"), &|_| None);
        assert!(!broken.contains("s3cret"), "{broken}");
    }
}
