//! libpq's password file (`~/.pgpass`, or the file `PGPASSFILE` names): lines of
//! `host:port:database:user:password`, the first line whose four fields match wins, `*` matches
//! anything, `\` escapes `:` and `\`, lines starting with `#` are comments. A file that group or
//! others may read is ignored with a warning, as libpq does, since it holds passwords.

use std::path::Path;

/// One field of a line: `*` (unescaped), or a value to compare.
#[derive(Debug, PartialEq, Eq)]
enum Field {
    Any,
    Exact(String),
}

impl Field {
    fn matches(&self, value: &str) -> bool {
        match self {
            Field::Any => true,
            Field::Exact(v) => v == value,
        }
    }
}

/// What a connection attempt is matched on.
#[derive(Debug)]
pub struct Target<'a> {
    pub host: &'a str,
    pub port: &'a str,
    pub database: &'a str,
    pub user: &'a str,
}

/// The password for `target` in the file's `contents`, if a line matches.
pub fn lookup(contents: &str, target: &Target<'_>) -> Option<String> {
    contents
        .lines()
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .find_map(|line| {
            let (fields, password) = parse_line(line)?;
            let wanted = [target.host, target.port, target.database, target.user];
            fields
                .iter()
                .zip(wanted)
                .all(|(f, v)| f.matches(v))
                .then_some(password)
        })
}

/// A line's four fields and its password, or None when it has fewer than four `:`.
fn parse_line(line: &str) -> Option<([Field; 4], String)> {
    let mut fields = Vec::with_capacity(4);
    let mut chars = line.chars();
    for _ in 0..4 {
        let mut value = String::new();
        let mut escaped_any = false;
        loop {
            match chars.next()? {
                '\\' => {
                    escaped_any = true;
                    value.push(chars.next()?);
                }
                ':' => break,
                c => value.push(c),
            }
        }
        fields.push(if value == "*" && !escaped_any {
            Field::Any
        } else {
            Field::Exact(value)
        });
    }
    // The password runs to the next unescaped `:` or the end of the line.
    let mut password = String::new();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(n) => password.push(n),
                None => password.push('\\'),
            },
            ':' => break,
            c => password.push(c),
        }
    }
    let fields: [Field; 4] = fields.try_into().ok()?;
    Some((fields, password))
}

/// Reads the password file, or None (with a warning where libpq warns) when it is missing, not
/// a plain file, or readable by group or others.
pub fn read(path: &Path) -> Option<String> {
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() {
        tracing::warn!(file = %path.display(), "password file is not a plain file; ignored");
        return None;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if meta.permissions().mode() & 0o077 != 0 {
            tracing::warn!(
                file = %path.display(),
                "password file has group or world access; permissions should be u=rw (0600) \
                 or less; ignored"
            );
            return None;
        }
    }
    match std::fs::read_to_string(path) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "password file cannot be read; ignored");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target<'a>(host: &'a str, port: &'a str, database: &'a str, user: &'a str) -> Target<'a> {
        Target {
            host,
            port,
            database,
            user,
        }
    }

    #[test]
    fn the_first_matching_line_wins_with_stars_and_escapes() {
        let file = "\
# comment line: host:port:db:user:password
db1:5432:app:relay:first
*:*:app:relay:second
db\\:x:5432:*:relay:colon\\:host
\\*:5432:*:*:literal-star
*:6543:*:*:pa\\\\ss\\:word:ignored
short:line
*:5432:*:other:
";
        let t = |h, p, d, u| lookup(file, &target(h, p, d, u));
        assert_eq!(t("db1", "5432", "app", "relay").as_deref(), Some("first"));
        assert_eq!(t("db2", "5432", "app", "relay").as_deref(), Some("second"));
        assert_eq!(
            t("db:x", "5432", "z", "relay").as_deref(),
            Some("colon:host")
        );
        assert_eq!(t("*", "5432", "z", "u").as_deref(), Some("literal-star"));
        assert_eq!(t("h", "5432", "z", "u"), None, "\\* is a literal star");
        assert_eq!(t("h", "6543", "z", "u").as_deref(), Some("pa\\ss:word"));
        assert_eq!(t("h", "5432", "z", "other").as_deref(), Some(""));
        assert_eq!(t("short", "line", "", ""), None);
        assert_eq!(
            lookup("a:1:d:u:p\r\n", &target("a", "1", "d", "u")).as_deref(),
            Some("p")
        );
    }

    #[test]
    fn a_file_others_can_read_is_ignored() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("pgpass-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("pgpass");
        std::fs::write(&path, "*:*:*:*:pw\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(read(&path), None);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read(&path).as_deref(), Some("*:*:*:*:pw\n"));
        assert_eq!(read(&dir), None, "a directory");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
