//! A stand-in for systemd's notification socket: a datagram socket the relay is pointed at with
//! `NOTIFY_SOCKET`, recording what it is told (`READY=1`, `WATCHDOG=1`, ...) and when.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

type Received = Arc<Mutex<Vec<(Instant, String)>>>;

pub struct NotifySocket {
    dir: PathBuf,
    path: PathBuf,
    received: Received,
    stop: Arc<AtomicBool>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl NotifySocket {
    /// Binds a socket in a directory named for `test`.
    pub fn bind(test: &str) -> NotifySocket {
        let dir = std::env::temp_dir().join(format!("fga-relay-{test}-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("notify");
        let _ = std::fs::remove_file(&path);
        let socket = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let received = Received::default();
        let stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let (received, stop) = (received.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut buf = [0u8; 512];
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(n) = socket.recv(&mut buf) {
                        let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
                        received.lock().unwrap().push((Instant::now(), msg));
                    }
                }
            })
        };
        NotifySocket {
            dir,
            path,
            received,
            stop,
            reader: Some(reader),
        }
    }

    /// For `NOTIFY_SOCKET`.
    pub fn path(&self) -> &str {
        self.path.to_str().unwrap()
    }

    /// When each notification holding `what` (e.g. `WATCHDOG=1`) came.
    pub fn times_of(&self, what: &str) -> Vec<Instant> {
        self.received
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, m)| m.contains(what))
            .map(|(t, _)| *t)
            .collect()
    }
}

impl Drop for NotifySocket {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
