//! What commands print on stdout. A reader that goes away (`fga-relay check | head -1`,
//! `fga-relay sql | true`) ends the process at once and quietly, as SIGPIPE ends `cat`: Rust
//! ignores SIGPIPE, so a write to a closed pipe is an error, which `println!` turns into a panic
//! (exit 101 and a message about a broken pipe). The status is 141, what a shell reports for a
//! program SIGPIPE ended, so that `set -o pipefail` reads it as it reads `cat`'s.

use std::io::{self, Write};

/// The exit status when stdout's reader went away: 128 + SIGPIPE (13).
pub const READER_GONE: i32 = 141;

/// Prints one line on stdout.
pub fn line(text: impl std::fmt::Display) {
    text_to_stdout(format_args!("{text}\n"));
}

/// Prints `text` on stdout as it is (a newline only where it has one).
pub fn text(text: impl std::fmt::Display) {
    text_to_stdout(format_args!("{text}"));
}

fn text_to_stdout(args: std::fmt::Arguments<'_>) {
    let mut out = io::stdout().lock();
    let written = out.write_fmt(args).and_then(|()| out.flush());
    if let Err(e) = written {
        failed(&e);
        // A full disk, say: nothing more can be said where it was to be said.
        crate::telemetry::error_line(&format!("cannot write to stdout: {e}"));
        std::process::exit(1);
    }
}

/// stdout for a writer of its own (a `BufWriter` around it): a reader gone away ends the process
/// quietly, as [`line`] does.
pub struct Stdout;

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        io::stdout().write(buf).inspect_err(failed)
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stdout().flush().inspect_err(failed)
    }
}

/// Ends the process quietly when the reader went away; other errors (a full disk) are the
/// caller's to report.
fn failed(e: &io::Error) {
    if e.kind() == io::ErrorKind::BrokenPipe {
        std::process::exit(READER_GONE);
    }
}
