//! SIGHUP, for `run`: reads again what the settings read from files (the OpenFGA preshared key
//! or client secret, the connection string from `DATABASE_URL_FILE` or a systemd credential),
//! and uses it from then on: the next Write's token, the next connection (with libpq's password
//! file and the TLS files `DATABASE_URL` names, read again too). Connections already open stay.
//! Everything else comes from flags and the environment, which a running process cannot be given
//! anew: with no setting read from a file, the signal is logged and ignored. Never kills the
//! process (SIGHUP's default). A file that cannot be read, or is empty (caught in the middle of a
//! rewrite), changes nothing: what is in use stays, and the error is logged.

use crate::config::Secret;
use crate::db::SharedPg;
use crate::openfga::FgaClient;
use crate::settings::RelayArgs;
use crate::systemd::Notifier;
use std::sync::Arc;
use tokio::signal::unix::Signal;
use tracing::{error, info, warn};

/// What a SIGHUP rereads, and where it puts it.
pub struct Reload {
    /// The command line and environment, whose files are read again.
    pub args: RelayArgs,
    pub client: Arc<FgaClient>,
    pub pg: SharedPg,
    /// The `application_name` of the relay's connections.
    pub application_name: String,
    pub systemd: Arc<Notifier>,
    /// The connection string in use, to say whether it changed.
    pub url: Option<Secret>,
}

/// Rereads at each SIGHUP of `hangup` (made at start, so that one received meanwhile is not
/// SIGHUP's default, the end of the process; it is handled now).
pub fn on_hangup(mut hangup: Signal, mut reload: Reload) {
    tokio::spawn(async move {
        while hangup.recv().await.is_some() {
            reload.reread().await;
        }
    });
}

impl Reload {
    async fn reread(&mut self) {
        let files = self.args.secret_files();
        if files.is_empty() {
            info!("SIGHUP: no setting is read from a file, nothing to reread; signal ignored");
            return;
        }
        let files = files.join(", ");
        self.systemd.reloading();
        match self.args.settings() {
            // An error: the file is wrong now, and the next restart would fail on it.
            Err(e) => error!(%files, error = %e,
                "SIGHUP: cannot reread the settings' files; going on with the ones in use"),
            Ok((db, fga, _)) => {
                let mut changed = Vec::new();
                if self.client.set_auth(fga.auth).await {
                    changed.push("OpenFGA credentials");
                }
                // Made anew whatever the connection string says: the password file and the TLS
                // files it names may have changed.
                match crate::db::delivery_pg(&db, &self.application_name, fga.request_timeout) {
                    Ok(pg) => {
                        self.pg.set(pg);
                        if db.url != self.url {
                            changed.push("the connection string");
                        }
                        self.url = db.url;
                    }
                    Err(e) => warn!(error = %e,
                        "SIGHUP: the connection settings read again are not usable; new \
                         connections go where they went"),
                }
                let changed = if changed.is_empty() {
                    "nothing".to_owned()
                } else {
                    changed.join(", ")
                };
                info!(%files, %changed,
                    "SIGHUP: reread the settings' files; the next Writes and new connections use \
                     what they say");
            }
        }
        self.systemd.reloaded();
    }
}
