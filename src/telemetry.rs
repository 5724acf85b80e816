//! Logging: tracing to stderr (stdout stays free for command output such as `status --json`),
//! as text or one JSON object a line. `RUST_LOG` filters; the default is `info`.
//!
//! Under systemd, with stderr connected to the journal (`JOURNAL_STREAM` names it), each line
//! starts with its syslog priority, `<3>` for an error to `<7>` for debug and trace, which
//! journald takes off and keeps as the entry's priority: `journalctl -p warning` then shows the
//! warnings and errors. Elsewhere lines are left as they are.

use crate::config::LogFormat;
use std::io::{IsTerminal, Write as _};
use std::sync::OnceLock;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Whether stderr is the journal, once [`init`] has looked.
static JOURNAL: OnceLock<bool> = OnceLock::new();

/// Installs the global subscriber. Safe to call more than once (later calls do nothing), which
/// tests rely on.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let journal = *JOURNAL.get_or_init(stderr_is_the_journal);
    let ansi = !journal && std::io::stderr().is_terminal();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let lines = tracing_subscriber::fmt::format().with_target(false);
    let _ = match format {
        LogFormat::Text => builder
            .event_format(Prioritized {
                inner: lines,
                journal,
            })
            .try_init(),
        LogFormat::Json => builder
            .fmt_fields(JsonFields::new())
            .event_format(Prioritized {
                inner: lines.json().flatten_event(true),
                journal,
            })
            .try_init(),
    };
}

/// Prints the line a command ends with when it fails (`fga-relay: …`) to stderr, at the error
/// priority when that is the journal.
pub fn error_line(message: &str) {
    let prefix = if JOURNAL.get().copied().unwrap_or(false) {
        "<3>"
    } else {
        ""
    };
    // Not eprintln!, which panics when stderr is a pipe its reader closed.
    let _ = writeln!(std::io::stderr().lock(), "{prefix}fga-relay: {message}");
}

/// Whether stderr is the stream systemd connected to the journal: `JOURNAL_STREAM` holds its
/// device and inode (`DEV:INODE`). Only set is not enough: a program the service started with
/// stderr sent elsewhere inherits the variable.
fn stderr_is_the_journal() -> bool {
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;
    let Some(stream) = std::env::var("JOURNAL_STREAM").ok() else {
        return false;
    };
    let Some((dev, ino)) = stream.trim().split_once(':') else {
        return false;
    };
    let (Ok(dev), Ok(ino)) = (dev.parse::<u64>(), ino.parse::<u64>()) else {
        return false;
    };
    let Ok(fd) = std::io::stderr().as_fd().try_clone_to_owned() else {
        return false;
    };
    std::fs::File::from(fd)
        .metadata()
        .is_ok_and(|m| m.dev() == dev && m.ino() == ino)
}

/// syslog's priority for a level: error 3, warning 4, info 6, debug and trace 7.
fn priority(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        _ => 7,
    }
}

/// A line format, with the `<N>` priority prefix in front of each line when writing to the
/// journal.
struct Prioritized<F> {
    inner: F,
    journal: bool,
}

impl<S, N, F> FormatEvent<S, N> for Prioritized<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'w> FormatFields<'w> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        if !self.journal {
            return self.inner.format_event(ctx, writer, event);
        }
        // journald makes an entry of each line: a message of several lines (a statement's SQL
        // at debug) has the prefix on each, or its later lines land at the default priority.
        let mut text = String::new();
        self.inner
            .format_event(ctx, Writer::new(&mut text), event)?;
        let priority = priority(event.metadata().level());
        for line in text.split_inclusive('\n') {
            write!(writer, "<{priority}>{line}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_map_to_syslog_priorities() {
        assert_eq!(priority(&Level::ERROR), 3);
        assert_eq!(priority(&Level::WARN), 4);
        assert_eq!(priority(&Level::INFO), 6);
        assert_eq!(priority(&Level::DEBUG), 7);
        assert_eq!(priority(&Level::TRACE), 7);
    }
}
