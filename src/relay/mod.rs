//! `fga-relay run` and `fga-relay drain`: leadership around [`Deliverer::stream`].
//!
//! One relay at a time delivers: the one holding the leadership lock on its dedicated
//! connection, under a lease it renews at every heartbeat (see [`crate::leadership`]). The
//! others are hot standbys that try to take the lock at every heartbeat, and end the holder's
//! session once its lease has run out. The leader streams for as long as it leads: it reads
//! rows as notifications announce them (it holds the wake lock whenever it waits with room in
//! its window, so that writers notify; see `sql/schema/0002_wakeup.sql`), and the sweep catches
//! what notifications miss.

use crate::backoff::Backoff;
use crate::config::{DbSettings, DeliverySettings, FgaSettings};
use crate::db::hint;
use crate::db::pooler::PoolerCheck;
use crate::db::{PgConnect, SharedPg};
use crate::delivery::{Controls, Deliverer, Mode, PassReport};
use crate::leadership::{Backend, Lease, Taken};
use crate::listener::{Session, SessionOptions};
use crate::liveness::Liveness;
use crate::metrics::Metrics;
use crate::openfga::FgaClient;
use crate::pass_log::{PassLog, Trigger};
use crate::recurring::Recurring;
use crate::schema::TableInfo;
use crate::store::{Store, StoreError};
use crate::systemd::Notifier;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

mod bell;
mod drain;

pub use drain::{DrainError, LAST_COUNT_GRACE};

use bell::SessionBell;

/// Reconnecting the dedicated connection.
const RECONNECT_BACKOFF: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
/// Retrying after a database error during a pass.
const DB_BACKOFF: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
/// A session lost sooner than this after it opened counts as a failure to connect (backoff).
const SHORT_SESSION: Duration = Duration::from_secs(10);
/// Trying the leadership lock again right after ending a stale leader's session.
const AFTER_ENDING_LEADER: Duration = Duration::from_millis(100);

/// Why no session opened.
enum NoSession {
    /// Opening it failed with this error (refused, a TCP connect timed out, a server's error).
    Failed(tokio_postgres::Error),
    /// Nothing failed, and it had not opened within this long (see [`Relay::open_limit`]).
    Stalled(Duration),
}

/// Tries to open a session that stalled, in a row: each doubles the next try's bound, up to
/// eight times the first.
#[derive(Default)]
struct Stalls(u32);

impl Stalls {
    /// What the next try's bound is multiplied by.
    fn factor(&self) -> u32 {
        1 << self.0.min(3)
    }
}

/// Everything a relay needs, built once by the command line (or a test).
pub struct Relay {
    /// Where new connections go (replaced by a SIGHUP that rereads `DATABASE_URL_FILE`).
    pub pg: SharedPg,
    pub db: DbSettings,
    pub fga: FgaSettings,
    pub delivery: DeliverySettings,
    pub store: Store,
    pub client: Arc<FgaClient>,
    pub metrics: Metrics,
    pub table: TableInfo,
    /// Who this relay is, in the leader record and logs: host, process id.
    pub identity: String,
    /// systemd's readiness and status lines (does nothing outside systemd).
    pub systemd: Arc<Notifier>,
    /// The main loop's sign of life, for `/livez` and systemd's watchdog.
    pub liveness: Arc<Liveness>,
    /// What this process remembers of its own terms of leadership.
    pub terms: Terms,
    /// Finds a pooler in transaction mode between the relay and PostgreSQL, and stops the
    /// relay when it does (the command then exits 2 with its message).
    pub pooler: Arc<PoolerCheck>,
    /// What it has said about its passes (the first delivery is logged at info).
    pub passes: PassLog,
    /// When each problem that does not heal by itself was last said (see `db::hint`).
    pub problems: Recurring,
}

/// What a relay process remembers of its own terms of leadership across reconnects.
#[derive(Default)]
pub struct Terms {
    lease: OnceLock<Arc<Lease>>,
    /// Set while no Write of this process's last term can be in flight: that term, and what it
    /// had to wait for (`not_before` of its predecessors). Retaking leadership when the record
    /// still holds that very term, the relay need wait only for that, not for its own lease.
    carry: Mutex<Option<Carry>>,
    /// A stream of the current term was given up while its session held (see
    /// [`Relay::guarded_stream`]): the term ends without a clean release, so that the next
    /// leader waits for the fence the lease set, whatever became of that stream's Writes.
    given_up: std::sync::atomic::AtomicBool,
    /// The session this process last gave up on: on the server it may still be open, holding
    /// the leadership lock, and is ended at the next connect.
    abandoned: Mutex<Option<Backend>>,
}

/// The guarded value, also after a panic elsewhere (the data is a plain value, never half-made).
fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// This process's last term, with no Write of it in flight.
#[derive(Clone, Copy)]
struct Carry {
    /// When it was taken (PostgreSQL's clock, as the record holds it).
    term: SystemTime,
    /// What it had to wait for.
    inherited: Option<SystemTime>,
}

/// A term of leadership under way.
struct Term {
    /// What this term had to wait for; the next leader must still wait for it.
    inherited: Option<SystemTime>,
}

/// What the daemon keeps from one LISTEN session to the next.
#[derive(Default)]
struct Sessions {
    /// Sessions refused, or lost soon after they opened, in a row: the next try backs off.
    failures: u32,
    /// A session was up before: the next one is a reconnection.
    connected_before: bool,
    stalls: Stalls,
}

/// How leading ended.
enum LeadEnd {
    Shutdown,
    Lost,
}

impl Relay {
    /// Sleeps for `d`, or until one of `stop` fires (then returns false), beating meanwhile:
    /// waiting is the main loop's work too.
    async fn nap(&self, d: Duration, stop: &[&CancellationToken]) -> bool {
        let until = tokio::time::Instant::now() + d;
        loop {
            self.liveness.beat();
            let step = until.min(tokio::time::Instant::now() + self.liveness.beat_interval());
            tokio::select! {
                _ = tokio::time::sleep_until(step) => {}
                _ = crate::shutdown::any_cancelled(stop) => return false,
            }
            if tokio::time::Instant::now() >= until {
                return true;
            }
        }
    }

    fn lease(&self) -> Arc<Lease> {
        self.terms
            .lease
            .get_or_init(|| {
                Arc::new(Lease::new(
                    &self.db.table,
                    self.identity.clone(),
                    self.delivery.leader_lease,
                    self.delivery.lease_margin(),
                    self.delivery.fence(self.fga.request_timeout),
                ))
            })
            .clone()
    }

    fn session_options(&self, listen: bool) -> SessionOptions<'_> {
        let metrics = self.metrics.clone();
        SessionOptions {
            channel: listen.then(|| self.db.table.as_str()),
            heartbeat: self.delivery.heartbeat_interval,
            on_notification: Arc::new(move || {
                metrics.notifications.inc();
            }),
            lease: self.lease(),
            pooler: self.pooler.clone(),
        }
    }

    /// How long opening a session may take in all, the first time: the TCP connect (its
    /// connect timeout, for each host of the list, tried in turn), then TLS, the startup and
    /// authentication, which that timeout does not cover, the session's settings and LISTEN,
    /// its test notification, its look for a pooler (a heartbeat at most) and the end of the
    /// session before: twice the connect timeout for each host, a heartbeat and the test
    /// notification's wait (17 s by default). A path that lets the TCP connect through and
    /// nothing after it (a proxy whose server side hangs, a stopped server) would otherwise
    /// hold the relay in its connect for ever, deaf to a shutdown too. A connect timeout of 0
    /// (wait for ever) counts as the default here. A host whose name resolves to several
    /// addresses gets a connect timeout for each: the bound doubles after each try that
    /// stalls (see [`Stalls`]), so a slow but working path gets through after a few.
    fn open_limit(&self) -> Duration {
        let pg = self.pg.get();
        let connect = pg
            .config
            .get_connect_timeout()
            .copied()
            .unwrap_or(crate::db::DEFAULT_CONNECT_TIMEOUT);
        let hosts = pg
            .config
            .get_hosts()
            .len()
            .max(pg.config.get_hostaddrs().len())
            .max(1);
        connect.saturating_mul(2 * u32::try_from(hosts).unwrap_or(u32::MAX))
            + self.delivery.heartbeat_interval
            + crate::listener::NOTIFICATION_PROBE_WAIT
    }

    /// [`Relay::connect`], within [`Relay::open_limit`] grown by the tries that stalled before
    /// (counted here: reset by one that does not). Beats the liveness meanwhile: a connect
    /// bounded so is not a stuck relay.
    async fn open(&self, listen: bool, stalls: &mut Stalls) -> Result<Session, NoSession> {
        let limit = self.open_limit().saturating_mul(stalls.factor());
        let opening = tokio::time::timeout(limit, self.connect(listen));
        tokio::pin!(opening);
        let mut beats = tokio::time::interval(self.delivery.heartbeat_interval);
        let opened = loop {
            tokio::select! {
                opened = &mut opening => break opened,
                _ = beats.tick() => self.liveness.beat(),
            }
        };
        match opened {
            Ok(opened) => {
                stalls.0 = 0;
                opened.map_err(NoSession::Failed)
            }
            Err(_) => {
                stalls.0 = stalls.0.saturating_add(1);
                Err(NoSession::Stalled(limit))
            }
        }
    }

    /// Opens the dedicated connection, and ends the one this process gave up on before, which
    /// on the server may still be open and hold leadership (a connection whose bytes are lost
    /// both ways while the server's side looks healthy): nobody would deliver until its lease
    /// ran out.
    async fn connect(&self, listen: bool) -> Result<Session, tokio_postgres::Error> {
        let session = Session::connect(
            &self.listener_config(),
            self.table.oid,
            self.session_options(listen),
        )
        .await?;
        // Bounded: a pooled connection that hangs must not keep the relay from leading.
        let _ = tokio::time::timeout(
            self.delivery.heartbeat_interval,
            session.probe_pooler(self.store.pool()),
        )
        .await;
        // Forgotten only once the server answered the ask to end it: a connect given up
        // meanwhile (see `Relay::open`), or an error, leaves it to the next (the ask is keyed
        // on its pid and start, so asking again is harmless).
        let abandoned = *locked(&self.terms.abandoned);
        if let Some(old) = abandoned {
            let ended = session.end_session(old).await;
            if ended.is_ok() {
                let mut kept = locked(&self.terms.abandoned);
                if *kept == Some(old) {
                    *kept = None;
                }
            }
            match ended {
                Ok(true) => {
                    warn!(
                        pid = old.pid,
                        "ended this relay's previous session, still open on the server"
                    )
                }
                Ok(false) => {}
                Err(e) => {
                    debug!(error = %crate::db::describe(&e), "cannot end the previous session")
                }
            }
        }
        Ok(session)
    }

    /// Gives up on a session (lost): remembered, to be ended at the next connect. The pool's
    /// idle connections go too: they share the session's path to the server and may be as
    /// dead as it was, with nothing to tell (a silent path answers no heartbeat of theirs), and
    /// nothing ends a wait on one (a path that still acknowledges bytes fires neither keepalives
    /// nor `tcp_user_timeout`): the next term's first read would wait on it until the process
    /// is restarted (`/livez`), while the new session renews the lease.
    fn abandon(&self, session: &Session) {
        *locked(&self.terms.abandoned) = Some(session.backend());
        self.store.pool().retain(|_, _| false);
    }

    /// Streams on `session` until `mode` says it ends, given up if the session is lost and the
    /// stream does not end within one Write's deadline of that (its connections are frozen): its
    /// Writes may then still be in flight, so retaking leadership waits for this process's own
    /// lease too, and the pool's connections, which may be stuck the same way, are made anew.
    /// Also given up if it was told to stop and has not ended a fence and a request timeout
    /// later (a pooled connection froze while the session holds). None when given up.
    async fn guarded_stream(
        &self,
        deliverer: &mut Deliverer,
        session: &Session,
        keep_going: &(dyn Fn() -> bool + Sync),
        stop: &[&CancellationToken],
        mode: Mode<'_>,
    ) -> Option<Result<PassReport, StoreError>> {
        let grace = self.delivery.fence(self.fga.request_timeout);
        // A stream runs as long as the term, and drains a backlog that behind a slow OpenFGA
        // takes longer than the liveness bound: it beats at each step (a read, a Write
        // answered, a wait), so that one that moves is alive however long it lasts, and one
        // stuck on a connection that never answers is not.
        let stream = deliverer.stream(Controls {
            keep_going,
            stop,
            window: session.send_window(),
            mode,
        });
        let given_up = async {
            session.lost().cancelled().await;
            tokio::time::sleep(grace).await;
        };
        // Told to stop (a shutdown, drain's timeout), a stream ends once its Writes in flight
        // have (a Write asks `keep_going` just before it leaves, after whatever it asks OpenFGA
        // first, and ends within the request timeout, or two with the read-back an OpenFGA
        // before 1.10 needs), and sends none after the stop. One that has not ended a fence and
        // a request timeout later waits on a pooled connection that stopped answering while
        // the session's holds (a path that froze): only giving it up ends that wait. Its term
        // then ends without a clean release all the same (`end_term`): what became of the
        // Write whose connection froze is not known. A session lost when the stop came is
        // `given_up`'s.
        let stuck_after = grace + self.fga.request_timeout;
        let stuck = async {
            crate::shutdown::any_cancelled(stop).await;
            if session.is_lost() {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(stuck_after).await;
        };
        tokio::select! {
            r = stream => Some(r),
            _ = given_up => {
                warn!("delivery did not stop after the connection was lost; giving it up");
                *locked(&self.terms.carry) = None;
                // Now, not only in `abandon`: `drain` asks the pool how many rows are left
                // before it reconnects, and the pool's idle connections may be frozen as the
                // stream's were; nothing would end that wait.
                self.store.pool().retain(|_, _| false);
                None
            }
            _ = stuck => {
                warn!(waited = ?stuck_after, "delivery did not stop when told to: it waits on a \
                    database connection that stopped answering; giving it up");
                self.terms.given_up.store(true, Ordering::Relaxed);
                *locked(&self.terms.carry) = None;
                self.store.pool().retain(|_, _| false);
                None
            }
        }
    }

    /// What a database error means, and the next step (for a missing grant, `check`'s words).
    async fn explain(&self, e: &tokio_postgres::Error) -> hint::Explained {
        hint::explain_with_grants(e, &self.pg.get(), self.store.pool(), &self.db.table).await
    }

    /// The dedicated connection's settings: the relay's, named apart so operators (and tests)
    /// can tell it from the pool's connections in `pg_stat_activity`.
    fn listener_config(&self) -> PgConnect {
        let pg = self.pg.get();
        pg.named(&format!("{} listener", pg.application_name()))
    }

    fn deliverer(&self) -> Deliverer {
        Deliverer::new(
            self.store.clone(),
            self.client.clone(),
            self.metrics.clone(),
            self.delivery.clone(),
            self.fga.max_tuples_per_write,
            self.liveness.clone(),
        )
    }

    /// The daemon: until `shutdown` fires, keep a dedicated connection, lead or stand by, and
    /// deliver. Returns once the batch in flight is finished and leadership released.
    /// `listening` is told the session's `lost` token while it is up, and `None` once it is
    /// given up.
    pub async fn run(
        &self,
        shutdown: CancellationToken,
        listening: impl Fn(Option<CancellationToken>),
    ) {
        self.pooler.stops(&shutdown);
        let mut deliverer = self.deliverer();
        let mut sessions = Sessions::default();
        // What does not heal by itself is said at ERROR, once a minute (see `db::hint`).
        let recurring = &self.problems;
        while !shutdown.is_cancelled() {
            self.liveness.beat();
            let opened = tokio::select! {
                opened = self.open(true, &mut sessions.stalls) => opened,
                () = shutdown.cancelled() => break,
            };
            let session = match opened {
                Ok(s) => s,
                Err(no) => {
                    if !self.not_opened(&mut sessions, &no, &shutdown).await {
                        break;
                    }
                    continue;
                }
            };
            let opened = Instant::now();
            self.announce(&mut sessions);
            listening(Some(session.lost().clone()));
            self.systemd.ready("LISTEN connection up");

            // Whether the session ended on an error already said, with its cause.
            let mut said = false;
            let end = match self.stand_by(&session, &shutdown, recurring).await {
                Ok(Some(taken)) => self.lead(&session, taken, &mut deliverer, &shutdown).await,
                Ok(None) => LeadEnd::Shutdown,
                Err(lasting) => {
                    said = lasting;
                    LeadEnd::Lost
                }
            };
            self.metrics.leader.set(0);
            self.metrics.listen_connected.set(0);
            listening(None);
            match end {
                LeadEnd::Shutdown => break,
                LeadEnd::Lost => {
                    self.abandon(&session);
                    // Another relay may deliver while we are away: what we knew about rows
                    // may no longer hold.
                    deliverer.forget();
                    if !self.lost(&mut sessions, opened, said, &shutdown).await {
                        break;
                    }
                }
            }
        }
        self.systemd.stopping();
        info!("relay stopped");
    }

    /// The LISTEN connection could not be opened (it failed, or stalled): says why, and waits
    /// before the next try. Returns false when the relay is to stop: shutdown came meanwhile,
    /// or a pooler in transaction mode is in between.
    async fn not_opened(
        &self,
        sessions: &mut Sessions,
        no: &NoSession,
        shutdown: &CancellationToken,
    ) -> bool {
        if let NoSession::Failed(e) = no
            && self.pooler.check(e)
        {
            return false;
        }
        sessions.failures += 1;
        let wait = RECONNECT_BACKOFF.delay(sessions.failures);
        let why = match no {
            NoSession::Failed(e) => self.explain(e).await,
            NoSession::Stalled(limit) => hint::stalled(*limit, &self.pg.get()),
        };
        hint::log(
            "cannot open the LISTEN connection",
            &why,
            Some(wait),
            &self.problems,
        );
        self.nap(wait, &[shutdown]).await
    }

    /// A session is up: says so, and counts it if it replaces one.
    fn announce(&self, sessions: &mut Sessions) {
        if sessions.connected_before {
            self.metrics.reconnects.inc();
            info!("LISTEN connection reconnected");
        } else {
            info!("LISTEN connection up");
        }
        sessions.connected_before = true;
        self.metrics.listen_connected.set(1);
    }

    /// The session opened at `opened` was lost (`said`: on an error already logged with its
    /// cause). A session that fails as soon as it is open (the leader table not found under the
    /// role's search path, a revoked grant) would otherwise be opened again at once, a hundred
    /// times a second: it backs off as for a refused connection, until one lasts. Returns
    /// false when shutdown came meanwhile.
    async fn lost(
        &self,
        sessions: &mut Sessions,
        opened: Instant,
        said: bool,
        shutdown: &CancellationToken,
    ) -> bool {
        if opened.elapsed() >= SHORT_SESSION {
            sessions.failures = 0;
            warn!("LISTEN connection lost; reconnecting");
            return true;
        }
        sessions.failures += 1;
        let wait = RECONNECT_BACKOFF.delay(sessions.failures);
        if said {
            debug!(retry_in = ?wait, "reconnecting");
        } else {
            warn!(retry_in = ?wait, "LISTEN connection lost soon after it \
                opened; reconnecting");
        }
        self.nap(wait, &[shutdown]).await
    }

    /// Waits until this relay holds leadership. Ok(None) on shutdown, Err on a lost session
    /// (true: on an error that lasts until someone acts, said with the next step).
    /// Each time the lock is held by another session, ends that session if its lease ran out.
    async fn stand_by(
        &self,
        session: &Session,
        shutdown: &CancellationToken,
        recurring: &Recurring,
    ) -> Result<Option<Taken>, bool> {
        let mut announced = false;
        let mut refused = false;
        loop {
            let mut next_try = self.delivery.heartbeat_interval;
            match session.try_lead().await {
                Ok(Some(taken)) => return Ok(Some(taken)),
                Ok(None) => {
                    if !announced {
                        self.systemd.status("standby: another relay is delivering");
                        info!("another relay is delivering; standing by");
                        announced = true;
                    }
                    match self.end_expired_leader(session, &mut refused).await {
                        Ok(true) => next_try = AFTER_ENDING_LEADER,
                        Ok(false) => {}
                        Err(e) => {
                            self.pooler.check(&e);
                            let why = self.explain(&e).await;
                            let what = "cannot check the leader's lease";
                            return Err(hint::log(what, &why, None, recurring));
                        }
                    }
                }
                Err(e) => {
                    self.pooler.check(&e);
                    let why = self.explain(&e).await;
                    return Err(hint::log(
                        "cannot ask for leadership",
                        &why,
                        None,
                        recurring,
                    ));
                }
            }
            if !self.nap(next_try, &[shutdown, session.lost()]).await {
                return if shutdown.is_cancelled() {
                    Ok(None)
                } else {
                    Err(false)
                };
            }
        }
    }

    /// Ends the session holding leadership (on a session that could not take it) if its lease
    /// ran out, saying so; says once (`refused`) when PostgreSQL did not let this relay end it.
    /// Returns whether it ended one: leadership may be taken at once.
    async fn end_expired_leader(
        &self,
        session: &Session,
        refused: &mut bool,
    ) -> Result<bool, tokio_postgres::Error> {
        match session.end_expired_leader().await? {
            Some((pid, true)) => {
                warn!(pid, lease = ?self.delivery.leader_lease,
                    "ended the session holding leadership: its lease had run out");
                Ok(true)
            }
            Some((pid, false)) if !std::mem::replace(refused, true) => {
                error!(
                    pid,
                    "the session holding leadership has let its lease run out, but PostgreSQL \
                     did not let this relay end it: give the relays' roles pg_signal_backend \
                     (see `fga-relay sql --roles`)"
                );
                Ok(false)
            }
            _ => Ok(false),
        }
    }

    /// Begins a term: waits, before the first Write, until no Write of an earlier leader can
    /// land (the `not_before` the record holds). Retaking leadership when the record still
    /// holds its own last term, with no Write of that term in flight, it waits only for what
    /// that term had to. The term is compared, not the holder's name: a take of this relay's
    /// own whose answer was lost (the connection failed after it committed) recorded the name
    /// too, after ending the session of a leader whose Writes the fence must still cover.
    /// Returns the term, and whether the wait ended (false: stopped first).
    async fn begin_term(&self, taken: Taken, stop: &[&CancellationToken]) -> (Term, bool) {
        self.terms.given_up.store(false, Ordering::Relaxed);
        let carried = locked(&self.terms.carry).take();
        let (inherited, wait) = match carried {
            Some(c)
                if taken.previous_term == Some(c.term)
                    && taken.previous.as_deref() == Some(self.identity.as_str()) =>
            {
                (
                    c.inherited,
                    c.inherited
                        .and_then(|t| t.duration_since(taken.now).ok())
                        .unwrap_or_default(),
                )
            }
            _ => (taken.not_before, taken.wait),
        };
        // Nothing of this term is in flight yet.
        *locked(&self.terms.carry) = Some(Carry {
            term: taken.term,
            inherited,
        });
        self.metrics.leader.set(1);
        self.systemd.status("leader: delivering");
        if wait.is_zero() {
            info!("delivering (leader)");
            return (Term { inherited }, true);
        }
        info!(previous = taken.previous.as_deref().unwrap_or("?"), wait = ?wait,
            "delivering (leader); the previous leader did not let go cleanly, so waiting until \
             no Write of its can land before the first write");
        // Longer than any wait this relay's own settings make: waited out all the same (another
        // relay's settings may make it), but said, since a clock stepped back makes it too.
        let longest = self.delivery.leader_lease + self.delivery.fence(self.fga.request_timeout);
        if wait > longest {
            warn!(wait = ?wait, longest = ?longest,
                "the wait before the first Write is longer than this relay's lease and fence \
                 make it: a relay with a longer --leader-lease or --request-timeout led before, \
                 or PostgreSQL's clock was set back (compare `SELECT now()` with the time); \
                 delivery begins when the wait ends");
        }
        let waited = self.nap(wait, stop).await;
        (Term { inherited }, waited)
    }

    /// Lets go of leadership, with this term's Writes finished: the next leader waits only for
    /// what this term inherited.
    async fn end_term(&self, session: &Session, term: &Term) {
        *locked(&self.terms.carry) = None;
        if self.terms.given_up.swap(false, Ordering::Relaxed) {
            warn!(
                "leadership is let go without a clean release (a stream was given up): the \
                next leader waits for the fence"
            );
        } else if let Err(e) = session.release_lead(term.inherited).await {
            warn!(error = %crate::db::describe(&e), "cannot record a clean release of leadership");
        }
        self.metrics.leader.set(0);
    }

    async fn lead(
        &self,
        session: &Session,
        taken: Taken,
        deliverer: &mut Deliverer,
        shutdown: &CancellationToken,
    ) -> LeadEnd {
        let stop = [shutdown, session.lost()];
        let (term, waited) = self.begin_term(taken, &stop).await;
        if !waited {
            if session.is_lost() {
                return LeadEnd::Lost;
            }
            // Stopped while waiting: nothing sent, and the next leader still waits for what we
            // were waiting for.
            self.end_term(session, &term).await;
            return LeadEnd::Shutdown;
        }
        deliverer.forget();
        let keep_going = || !shutdown.is_cancelled() && !session.is_lost() && session.lease_valid();
        let bell = SessionBell::new(session, self.delivery.sweep_interval);
        let account = |trigger: Trigger, report: &PassReport| self.account(trigger, report);
        let mut db_failures = 0u32;
        loop {
            let mode = Mode::Forever {
                bell: &bell,
                account: &account,
            };
            let Some(streamed) = self
                .guarded_stream(deliverer, session, &keep_going, &stop, mode)
                .await
            else {
                break;
            };
            match streamed {
                Ok(report) => {
                    // It ends only when told to.
                    self.account(Trigger::Again, &report);
                    break;
                }
                Err(e) => {
                    if session.is_lost() || self.read_only(&e) || self.pooled(&e) {
                        break;
                    }
                    if !self.db_backoff(&e, &mut db_failures, &stop).await {
                        break;
                    }
                }
            }
        }
        if shutdown.is_cancelled() && !session.is_lost() {
            self.end_term(session, &term).await;
            return LeadEnd::Shutdown;
        }
        if shutdown.is_cancelled() {
            return LeadEnd::Shutdown;
        }
        LeadEnd::Lost
    }

    /// After a write refused as read-only, drops every pooled connection so that the next ones
    /// go to a writable server (`target_session_attrs=read-write`); the caller drops its session
    /// too. Returns whether that was the case.
    fn read_only(&self, e: &StoreError) -> bool {
        if !e.is_read_only() {
            return false;
        }
        warn!(error = %e, "the database is read-only (a standby after a failover?); \
            reconnecting to a writable server");
        self.store.pool().retain(|_, _| false);
        true
    }

    /// Whether `e` is a sign of a pooler in transaction mode (then reported, and the relay
    /// stops).
    fn pooled(&self, e: &StoreError) -> bool {
        matches!(e, StoreError::Db(e) if self.pooler.check(e))
    }

    fn account(&self, trigger: Trigger, report: &PassReport) {
        self.passes.account(&self.metrics, trigger, report);
    }

    /// Waits out a database error of a pass (`run` and `drain`): logged, with backoff. False if
    /// `stop` fired meanwhile.
    async fn db_backoff(
        &self,
        e: &crate::store::StoreError,
        failures: &mut u32,
        stop: &[&CancellationToken],
    ) -> bool {
        *failures += 1;
        let wait = DB_BACKOFF.delay(*failures);
        match e {
            // A missing grant or a refused password does not heal by itself: said at ERROR
            // with the next step, once a minute.
            crate::store::StoreError::Db(pg) => {
                let why = self.explain(pg).await;
                hint::log(
                    "database error while delivering",
                    &why,
                    Some(wait),
                    &self.problems,
                );
            }
            crate::store::StoreError::Pool(_) => {
                warn!(error = %e, retry_in = ?wait, "database error while delivering")
            }
        }
        self.nap(wait, stop).await
    }
}
