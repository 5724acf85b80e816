//! Progress on stderr while a phase runs, and the process's peak memory at the end.

use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::time::{Duration, Instant};
use tracing::info;

/// Without a terminal, a progress line this often.
pub(super) const PLAIN_PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// What a phase's progress shows.
#[derive(Clone, Copy, Debug)]
pub(super) enum Meter {
    /// A bar: so many of this many.
    Total(u64),
    /// A count, of an unknown total.
    Count,
    /// Only the time: one statement, whose progress PostgreSQL does not tell.
    Time,
}

/// Progress on stderr: a bar or a spinner on a terminal; otherwise a log line every
/// [`PLAIN_PROGRESS_EVERY`], and one at the end of the phase.
pub(super) struct Progress {
    pub(super) what: &'static str,
    pub(super) bar: Option<ProgressBar>,
    pub(super) done: u64,
    pub(super) meter: Meter,
    pub(super) started: Instant,
    pub(super) last_line: Instant,
}

impl Progress {
    pub(super) fn start(what: &'static str, meter: Meter) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let (bar, template) = match meter {
                Meter::Total(n) => (
                    ProgressBar::new(n),
                    "{msg} [{bar:30}] {human_pos}/{human_len} {per_sec} eta {eta}",
                ),
                Meter::Count => (
                    ProgressBar::new_spinner(),
                    "{spinner} {msg}: {human_pos} {per_sec} {elapsed}",
                ),
                Meter::Time => (ProgressBar::new_spinner(), "{spinner} {msg} {elapsed}"),
            };
            bar.set_style(
                ProgressStyle::with_template(template)
                    .expect("the template is valid")
                    .progress_chars("=> "),
            );
            bar.set_message(what);
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        });
        if bar.is_none() {
            info!("{what}");
        }
        let now = Instant::now();
        Progress {
            what,
            bar,
            done: 0,
            meter,
            started: now,
            last_line: now,
        }
    }

    pub(super) fn add(&mut self, n: u64) {
        self.done += n;
        match &self.bar {
            Some(bar) => bar.inc(n),
            None if self.last_line.elapsed() >= PLAIN_PROGRESS_EVERY => {
                self.last_line = Instant::now();
                match self.meter {
                    Meter::Total(total) => info!(count = self.done, total, "{}", self.what),
                    _ => info!(count = self.done, "{}", self.what),
                }
            }
            None => {}
        }
    }

    /// Runs `f` with the bar out of the way, so that what it prints is not drawn over.
    pub(super) fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        match &self.bar {
            Some(bar) => bar.suspend(f),
            None => f(),
        }
    }

    pub(super) fn finish(self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        info!(
            count = self.done,
            seconds = self.started.elapsed().as_secs_f64(),
            "{}: done",
            self.what
        );
    }
}

/// This process's peak resident memory (`VmHWM`), where Linux tells it. `getrusage`'s
/// `ru_maxrss` would not do: it also counts the address space the process had before `exec`,
/// which after a `vfork`-style spawn is its parent's.
pub(super) fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.trim_start_matches("VmHWM:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}
