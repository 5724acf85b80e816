//! SIGTERM and SIGINT become a [`CancellationToken`]: loops check it at safe points, so the
//! batch in flight is finished (or rolled back) before the process exits.

use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;
use tracing::info;

/// A token cancelled at the first SIGTERM or SIGINT.
pub fn on_signals() -> std::io::Result<CancellationToken> {
    let token = CancellationToken::new();
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let t = token.clone();
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        info!(signal = name, "stopping: finishing the batch in flight");
        t.cancel();
    });
    Ok(token)
}
