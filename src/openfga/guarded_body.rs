//! A Write's request body that leaves only while the relay's lease holds (see
//! `crate::send_window`). The HTTP connection asks it for its bytes at the moment it writes
//! them; past the lease it answers with an error instead, the request is abandoned, and OpenFGA,
//! which has at most the request's head, applies nothing.

use crate::send_window::SendWindow;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use std::pin::Pin;
use std::task::{Context, Poll};

/// The body's refusal: the relay's lease ran out (it was stopped or cut off) before the Write
/// left.
#[derive(Debug, thiserror::Error)]
#[error("the leadership lease ran out before the Write left; it was not sent")]
pub struct LeaseEnded;

/// Whether `e`, or one of its causes, is a body's [`LeaseEnded`]: the request was abandoned
/// before its body left.
pub fn refused(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(e);
    while let Some(c) = cause {
        if c.is::<LeaseEnded>() {
            return true;
        }
        cause = c.source();
    }
    false
}

pub struct GuardedBody {
    bytes: Option<Bytes>,
    window: SendWindow,
}

impl GuardedBody {
    pub fn new(bytes: Bytes, window: SendWindow) -> GuardedBody {
        GuardedBody {
            bytes: Some(bytes),
            window,
        }
    }
}

impl Body for GuardedBody {
    type Data = Bytes;
    type Error = LeaseEnded;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, LeaseEnded>>> {
        let Some(bytes) = self.bytes.take() else {
            return Poll::Ready(None);
        };
        if !self.window.is_open() {
            return Poll::Ready(Some(Err(LeaseEnded)));
        }
        Poll::Ready(Some(Ok(Frame::data(bytes))))
    }

    fn is_end_stream(&self) -> bool {
        self.bytes.is_none()
    }

    /// Exact, so that the request carries a Content-Length: a body cut short is then an
    /// incomplete request to OpenFGA, never a shorter complete one.
    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.bytes.as_ref().map_or(0, |b| b.len() as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease_clock::LeaseInstant;
    use std::time::Duration;
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    const BODY: &[u8] = br#"{"writes":{"tuple_keys":[]}}"#;

    /// POSTs a guarded body to a bare TCP server and returns what the server read (everything
    /// until the client closed the connection, or until the whole body had arrived), and
    /// whether the client's error says the body refused.
    async fn what_arrives(window: SendWindow) -> (Vec<u8>, bool) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/write", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                let n = conn.read(&mut buf).await.unwrap_or(0);
                got.extend_from_slice(&buf[..n]);
                if n == 0 || got.ends_with(BODY) {
                    return got;
                }
            }
        });
        let body = reqwest::Body::wrap(GuardedBody::new(Bytes::from_static(BODY), window));
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
            .unwrap();
        // With the body refused, the request fails; with it sent, no answer ever comes.
        let refusal = match client.post(url).body(body).send().await {
            Err(e) => refused(&e),
            Ok(_) => false,
        };
        let got = tokio::time::timeout(Duration::from_secs(10), server)
            .await
            .expect("the server read to the end")
            .unwrap();
        (got, refusal)
    }

    #[tokio::test]
    async fn a_body_leaves_while_the_window_is_open() {
        let window = SendWindow::default();
        window.open_until(LeaseInstant::now() + Duration::from_secs(60));
        let (got, refusal) = what_arrives(window).await;
        assert!(got.ends_with(BODY));
        assert!(!refusal);
    }

    /// The window closed after the Write was handed to the client (the relay was stopped in
    /// between): at most the request's head reaches OpenFGA (hyper writes it with the first
    /// frame, so in practice nothing does), never the body, so there is no Write to apply.
    #[tokio::test]
    async fn a_body_does_not_leave_once_the_window_has_closed() {
        let window = SendWindow::default();
        window.open_until(LeaseInstant::now() + Duration::from_secs(60));
        window.close();
        let (got, refusal) = what_arrives(window).await;
        let got = String::from_utf8_lossy(&got).into_owned();
        assert!(!got.contains("tuple_keys"), "the body arrived: {got}");
        assert!(refusal, "the client's error names the refusal");
    }
}
