//! How the relay learns that rows were committed: the trigger's notifications, which writers
//! send only while the relay holds the wake lock (see `sql/schema/0002_wakeup.sql`), and the
//! sweep that catches what notifications miss. The delivery stream asks through [`Bell`]; the
//! relay answers with its dedicated connection.

use std::future::Future;
use std::pin::Pin;

/// Why the relay read rows: a sweep that finds rows means notifications were missed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// The first read after taking leadership (a start or a reconnect).
    Connect,
    Notification,
    Sweep,
    /// Rows were read before and more may be pending, or a retry came due.
    Again,
}

impl Trigger {
    /// The word logged for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Connect => "leadership",
            Trigger::Notification => "notification",
            Trigger::Sweep => "sweep",
            Trigger::Again => "again",
        }
    }
}

/// A future of the bell's.
pub type Ring<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The stream's way to hear of new rows while it waits.
pub trait Bell: Sync {
    /// Takes the wake lock, waiting briefly for the writers that hold it: from then on every
    /// writer notifies. `Ok(false)`: writers held it all that while (a transaction that stays
    /// open), to be tried again shortly.
    fn listen(&self) -> Ring<'_, Result<bool, tokio_postgres::Error>>;
    /// Lets the wake lock go: writers stop notifying (the relay reads anyway).
    fn mute(&self) -> Ring<'_, Result<(), tokio_postgres::Error>>;
    /// Resolves at the next notification or sweep, saying which.
    fn rung(&self) -> Ring<'_, Trigger>;
}
