//! SIGTERM and SIGINT become a [`CancellationToken`]: loops check it at safe points, so the
//! Writes in flight are finished (or rolled back) before the process exits. A second SIGTERM or
//! SIGINT while that drain runs (an operator who will not wait for a hung OpenFGA) exits at once,
//! with the status a shell gives a process that signal killed: 143 (128 + 15) for SIGTERM, 130
//! (128 + 2) for SIGINT. What was in flight is rolled back by PostgreSQL and sent again.

use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// The exit status after a second SIGTERM.
pub const SECOND_SIGTERM_EXIT: i32 = 128 + 15;
/// The exit status after a second SIGINT.
pub const SECOND_SIGINT_EXIT: i32 = 128 + 2;

/// A token cancelled at the first SIGTERM or SIGINT; the second exits the process.
pub fn on_signals() -> std::io::Result<CancellationToken> {
    let token = CancellationToken::new();
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let t = token.clone();
    tokio::spawn(async move {
        let (name, _) = next(&mut term, &mut int).await;
        info!(
            signal = name,
            "stopping: finishing the batch in flight (a second SIGTERM or SIGINT stops at once)"
        );
        t.cancel();
        let (name, status) = next(&mut term, &mut int).await;
        warn!(
            signal = name,
            exit_status = status,
            "second signal: exiting at once, without finishing the batch in flight (its rows \
             stay pending and are sent again)"
        );
        std::process::exit(status);
    });
    Ok(token)
}

/// The next of the two signals: its name and the exit status a second one exits with.
async fn next(term: &mut Signal, int: &mut Signal) -> (&'static str, i32) {
    tokio::select! {
        _ = term.recv() => ("SIGTERM", SECOND_SIGTERM_EXIT),
        _ = int.recv() => ("SIGINT", SECOND_SIGINT_EXIT),
    }
}

/// Resolves when the first of `tokens` is cancelled (never, for none).
pub async fn any_cancelled(tokens: &[&CancellationToken]) {
    let mut waits: Vec<_> = tokens.iter().map(|t| Box::pin(t.cancelled())).collect();
    std::future::poll_fn(|cx| {
        if waits.iter_mut().any(|w| w.as_mut().poll(cx).is_ready()) {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await
}
