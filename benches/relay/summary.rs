//! The closing table: each scenario's figures beside its target.

use crate::args::Sizes;
use crate::baseline::BaselineResult;
use crate::burndown::BurnDown;
use crate::dead::DeadPile;
use crate::explain::{exec_ms, top_buffers};
use crate::history::History;
use crate::idle::IdleResult;
use crate::isolation::IsolationResult;
use crate::latency::LatencyResult;
use crate::linger::LingerRow;
use crate::real::{Ceiling, Real};
use crate::speed::Speed;
use crate::stats::ms;
use crate::stores::{StoresResult, writes_per_row};
use crate::wait::{ROUND_TRIP, SHIPPED, WaitResult};
use crate::writers::{TriggerKind, WriterRun, round_ratio};

#[derive(Default)]
pub(crate) struct Results {
    pub(crate) latency: Option<LatencyResult>,
    pub(crate) burndown: Option<BurnDown>,
    pub(crate) history: Option<History>,
    pub(crate) dead: Option<DeadPile>,
    pub(crate) speed: Option<Speed>,
    pub(crate) writers: Vec<WriterRun>,
    pub(crate) linger: Vec<LingerRow>,
    pub(crate) wait: Option<WaitResult>,
    pub(crate) idle: Option<IdleResult>,
    pub(crate) baseline: Option<BaselineResult>,
    pub(crate) real: Option<Real>,
    pub(crate) stores: Option<StoresResult>,
    pub(crate) isolation: Option<IsolationResult>,
    pub(crate) model: Option<crate::model::ModelResult>,
}

pub(crate) fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "NOT met" }
}

impl Results {
    /// Whether a target is met; a smoke run's sizes are too small to say.
    pub(crate) fn verdict(&self, sizes: &Sizes, ok: bool) -> &'static str {
        if sizes.smoke { "(smoke)" } else { verdict(ok) }
    }
}

impl Results {
    pub(crate) fn print_summary(&self, sizes: &Sizes) {
        println!("\n=== Summary ===\n");
        println!("| scenario | measured | target | |");
        println!("|---|---|---|---|");
        if let Some(l) = &self.latency {
            println!(
                "| latency, {} commits at {}/s | p50 {} ms, p90 {} ms, p99 {} ms, max {} ms | p50 ≤ 2 ms, p99 ≤ 10 ms | {} |",
                sizes.latency_commits,
                sizes.latency_rate,
                ms(l.relay.p50),
                ms(l.relay.p90),
                ms(l.relay.p99),
                ms(l.relay.max),
                self.verdict(sizes, l.relay.p50 <= 2.0 && l.relay.p99 <= 10.0)
            );
            println!(
                "| (floor: commit → plain LISTENer) | p50 {} ms, p99 {} ms; insert+commit p50 {} ms | | |",
                ms(l.notify_floor.p50),
                ms(l.notify_floor.p99),
                ms(l.commit.p50)
            );
        }
        let burn = self
            .burndown
            .as_ref()
            .or(self.history.as_ref().map(|h| &h.none));
        if let Some(b) = burn {
            println!(
                "| burn-down, {} rows × 2 tuples | {:.0} rows/s, {:.0} tuples/s, {} Writes | ≥ 20,000 rows/s | {} |",
                b.rows,
                b.rows_per_s(),
                b.tuples_per_s(),
                b.writes,
                self.verdict(sizes, b.rows_per_s() >= 20_000.0)
            );
        }
        if !self.writers.is_empty() {
            let med = |c: u32, k: TriggerKind| {
                self.writers
                    .iter()
                    .find(|r| r.clients == c && r.trigger == k)
                    .map_or(f64::NAN, WriterRun::median)
            };
            for &c in &sizes.pgbench_clients {
                let none = med(c, TriggerKind::None);
                let relay = med(c, TriggerKind::Relay);
                let plain = med(c, TriggerKind::PlainNotify);
                let relay_ratio = round_ratio(&self.writers, c, TriggerKind::Relay);
                let plain_ratio = round_ratio(&self.writers, c, TriggerKind::PlainNotify);
                let target = if c == 8 {
                    "≥ 0.95 of no trigger"
                } else {
                    "(no target at 1 client)"
                };
                let v = if c == 8 {
                    self.verdict(sizes, relay_ratio >= 0.95)
                } else {
                    ""
                };
                let rate = |k: TriggerKind| {
                    self.writers
                        .iter()
                        .find(|r| r.clients == c && r.trigger == k)
                        .map_or(f64::NAN, WriterRun::notify_rate)
                };
                // What the index of the rows naming no store costs them: no trigger with it
                // against no trigger without it.
                let unindexed = round_ratio(&self.writers, c, TriggerKind::NoneWithoutUnnamedIndex);
                println!(
                    "| writers, {c} client(s), tps | none {none:.0}; relay's trigger {relay:.0} ({:+.0}%, {:.1} NOTIFYs per 1000 tx); plain NOTIFY {plain:.0} ({:+.0}%); with the index of rows naming no store against without it {:+.1}% | {target} | {v} |",
                    (relay_ratio - 1.0) * 100.0,
                    rate(TriggerKind::Relay),
                    (plain_ratio - 1.0) * 100.0,
                    (1.0 / unindexed - 1.0) * 100.0
                );
            }
        }
        if let Some(h) = &self.history {
            let ratio = h.full.rows_per_s() / h.none.rows_per_s();
            // Finding pending rows: what the claim reads, with and without the history. The
            // burn-down rates say the same with the machine's noise on top.
            let (idle_full, idle_none) = (top_buffers(&h.idle_full), top_buffers(&h.idle_none));
            let (busy_full, busy_none) =
                (top_buffers(&h.full.explain), top_buffers(&h.none.explain));
            println!(
                "| history: {} delivered rows vs none | claim with nothing pending: {idle_full} vs {idle_none} buffers, {:.3} vs {:.3} ms ({} buffers, {:.3} ms right after the burn-down, its rows not yet vacuumed); claim of a page of the backlog: {busy_full} vs {busy_none} buffers, {:.2} vs {:.2} ms; burn-down {:.0} vs {:.0} rows/s ({ratio:.2}×) | as fast | {} |",
                sizes.history,
                exec_ms(&h.idle_full),
                exec_ms(&h.idle_none),
                top_buffers(&h.idle_unvacuumed),
                exec_ms(&h.idle_unvacuumed),
                exec_ms(&h.full.explain),
                exec_ms(&h.none.explain),
                h.full.rows_per_s(),
                h.none.rows_per_s(),
                self.verdict(
                    sizes,
                    idle_full <= 4 && busy_full as f64 <= 1.1 * busy_none as f64
                )
            );
        }
        if let Some(d) = &self.dead {
            let burn = d.burn_ratio;
            println!(
                "| dead rows: {} in front vs none | latency p50 {} vs {} ms, p99 {} vs {} ms; claim of a page {} vs {} buffers, {:.2} vs {:.2} ms; burn-down {:.0} vs {:.0} rows/s in the first round; {burn:.2}× (median of {}) | within 10% | {} |",
                d.dead,
                ms(d.dead_latency.relay.p50),
                ms(d.clean_latency.relay.p50),
                ms(d.dead_latency.relay.p99),
                ms(d.clean_latency.relay.p99),
                top_buffers(&d.explain_dead),
                top_buffers(&d.explain_clean),
                exec_ms(&d.explain_dead),
                exec_ms(&d.explain_clean),
                d.with_dead.rows_per_s(),
                d.clean.rows_per_s(),
                d.burn_ratios.len(),
                // p99 of a few hundred commits is noisy: 1 ms of slack besides the 10%.
                self.verdict(
                    sizes,
                    burn >= 0.9
                        && d.dead_latency.relay.p99 <= 1.1 * d.clean_latency.relay.p99 + 1.0
                )
            );
        }
        if let Some(sp) = &self.speed {
            for r in &sp.rows {
                let rates: Vec<String> = r
                    .rates
                    .iter()
                    .map(|(w, v)| format!("window {w}: {v:.0} rows/s ({:.1}×)", v / r.ceiling))
                    .collect();
                let default = r.rates.iter().find(|(w, _)| *w == 16).map(|(_, v)| *v);
                let (target, ok) = if r.latency == "20 ms" {
                    (
                        "≥ 6× the ceiling with the default window",
                        default.is_some_and(|v| v >= 6.0 * r.ceiling),
                    )
                } else {
                    ("", true)
                };
                println!(
                    "| speed, OpenFGA {} (ceiling {:.0} rows/s) | {} | {target} | {} |",
                    r.latency,
                    r.ceiling,
                    rates.join("; "),
                    if target.is_empty() {
                        ""
                    } else {
                        self.verdict(sizes, ok)
                    }
                );
            }
            println!(
                "| crash with the window full (20 ms) | {} tuple operations to send again | at most the Writes in flight | |",
                sp.crash_redelivery
            );
        }
        for r in &self.linger {
            let default = r.linger == "1ms";
            println!(
                "| linger {}: writers and latency | writers {:.3} of no trigger (1 s sweep); at {}/s p50 {} ms, p99 {} ms; at 1000/s p50 {} ms, p99 {} ms | {} | {} |",
                r.linger,
                r.writers,
                sizes.latency_rate,
                ms(r.at_200.p50),
                ms(r.at_200.p99),
                ms(r.stream.p50),
                ms(r.stream.p99),
                if default {
                    "default: writers ≥ 0.95, p99 ≤ 3 ms at 200/s"
                } else {
                    ""
                },
                if default {
                    self.verdict(sizes, r.writers >= 0.95 && r.at_200.p99 <= 3.0)
                } else {
                    ""
                }
            );
        }
        if let Some(w) = &self.wait {
            for (delay, name, d) in w.latency.iter().filter(|(_, n, _)| *n == SHIPPED) {
                println!(
                    "| fga_outbox_wait, relay's mark → return, OpenFGA {delay} ms | p50 {} ms, p99 {} ms ({name}) | p50 ≤ 1 ms, p99 ≤ 5 ms | {} |",
                    ms(d.p50),
                    ms(d.p99),
                    self.verdict(sizes, d.p50 <= 1.0 && d.p99 <= 5.0)
                );
            }
            if let Some((_, r)) = w.burn_down.iter().find(|(n, _)| *n == SHIPPED) {
                println!(
                    "| fga_outbox_wait: {} waiters on a burn-down's last rows | time {r:.3}× without them | within 5% | {} |",
                    sizes.waiters,
                    self.verdict(sizes, *r <= 1.05)
                );
            }
            if let Some((_, r, rate)) = w.writers.iter().find(|(n, ..)| *n == SHIPPED) {
                let floor = w
                    .writers
                    .iter()
                    .find(|(n, ..)| *n == ROUND_TRIP)
                    .map_or(String::new(), |(_, f, _)| {
                        format!(" (`SELECT 1` as often instead: {f:.3}×)")
                    });
                println!(
                    "| fga_outbox_wait: {} waiters beside 8 writers | writers' tps {r:.3}× without them, at {rate:.0} waits/s{floor} | within 5% | {} |",
                    sizes.waiters,
                    self.verdict(sizes, *r >= 0.95)
                );
            }
        }
        if let Some(i) = &self.idle {
            let pct = i.cpu.relay / i.cpu.wall * 100.0;
            println!(
                "| idle, {:.0} s | {} statements ({:.2}/s), {} Writes; relay CPU {:.3}% of a core | only sweeps and heartbeats, ~0% CPU | {} |",
                i.secs,
                i.total_statements(),
                i.total_statements() as f64 / i.secs,
                i.writes,
                pct,
                self.verdict(sizes, pct < 0.5 && i.writes == 0)
            );
        }
        if let Some(b) = &self.baseline {
            let rl = self.latency.as_ref().map(|l| &l.relay);
            let lat_ratio = rl.map_or(String::from("-"), |r| {
                format!(
                    "p50 {:.0}×, p99 {:.0}× the relay's",
                    b.latency.relay.p50 / r.p50,
                    b.latency.relay.p99 / r.p99
                )
            });
            println!(
                "| baseline drainer, latency | p50 {} ms, p99 {} ms, max {} ms; {lat_ratio} | | |",
                ms(b.latency.relay.p50),
                ms(b.latency.relay.p99),
                ms(b.latency.relay.max)
            );
            let burn_ratio = burn.map_or(String::from("-"), |r| {
                format!("relay {:.0}× faster", r.rows_per_s() / b.rows_per_s())
            });
            println!(
                "| baseline drainer, burn-down of {} rows | {:.0} rows/s, {} Writes; {burn_ratio} | | |",
                b.rows,
                b.rows_per_s(),
                b.writes
            );
        }
        if let Some(r) = &self.real {
            let ceiling = |c: &Ceiling, setting: &str| {
                println!(
                    "| real OpenFGA (PostgreSQL){setting}: ceilings, bare client, 16 in flight, before, between and after the relay's burn-downs | {} tuples/s | | |",
                    c.ceilings_line()
                );
            };
            let relay_tuples =
                |c: &Ceiling| c.median_relay().map_or(f64::NAN, BurnDown::tuples_per_s);
            ceiling(&r.open, "");
            println!(
                "| real OpenFGA: relay burn-down / the ceilings on either side, unconfined | {:.0} tuples/s; {:.3} ({}) | (reported) | |",
                relay_tuples(&r.open),
                r.open.ratio(),
                r.open.ratios_line(),
            );
            match &r.confined {
                Ok(q) => {
                    ceiling(
                        &q.runs,
                        &format!(", OpenFGA and its PostgreSQL held to {} CPUs", q.cpus),
                    );
                    println!(
                        "| real OpenFGA: relay burn-down / the ceilings on either side, OpenFGA and its PostgreSQL held to {} CPUs ({}; throttled in {} of {} periods) | {:.0} tuples/s; {:.3} ({}) | ≥ 0.95 | {} |",
                        q.cpus,
                        q.kind,
                        q.throttled,
                        q.periods,
                        relay_tuples(&q.runs),
                        q.runs.ratio(),
                        q.runs.ratios_line(),
                        self.verdict(sizes, q.runs.ratio() >= 0.95)
                    );
                }
                Err(why) => println!(
                    "| real OpenFGA: relay burn-down / the ceilings on either side, OpenFGA held to {} CPUs | not measured: {why} | ≥ 0.95 | NOT measured |",
                    sizes.fga_cpus
                ),
            }
            let confined_cost = r.confined.as_ref().map_or(String::new(), |q| {
                format!(
                    "; {:.1} ms with OpenFGA held to {} CPUs",
                    q.runs.cost_ms_per_1000(),
                    q.cpus
                )
            });
            println!(
                "| real OpenFGA: the relay's own cost (CPU of the relay, its sessions and the rest of the outbox's PostgreSQL) per 1,000 tuples delivered, in the burn-downs (median) | {:.1} ms unconfined{confined_cost} | ≤ 11.5 ms (half of 23) | {} |",
                r.open.cost_ms_per_1000(),
                self.verdict(sizes, r.open.cost_ms_per_1000() <= 11.5)
            );
            for l in &r.latency {
                let (add50, add99) = l.added();
                let mut failed = if l.write_failed > 0 {
                    format!("; {} of its Writes failed, left out", l.write_failed)
                } else {
                    String::new()
                };
                if l.bare_saturated() {
                    failed += &format!(
                        "; it had {:.0} Writes in flight on average: OpenFGA did not keep up",
                        l.bare_in_flight()
                    );
                }
                println!(
                    "| real OpenFGA: commit → OpenFGA answered the relay's Write, at {} | p50 {} ms, p99 {} ms; OpenFGA's Write (bare client, same rate, same proxy{failed}) p50 {} ms, p99 {} ms; the relay adds {} / {} ms | adds ≤ 1 ms p50, ≤ 3 ms p99 | {} |",
                    l.config.label(),
                    ms(l.applied.p50),
                    ms(l.applied.p99),
                    ms(l.write.p50),
                    ms(l.write.p99),
                    ms(add50),
                    ms(add99),
                    if l.bare_saturated() && !sizes.smoke {
                        "not comparable"
                    } else {
                        self.verdict(sizes, l.met())
                    }
                );
                println!(
                    "| real OpenFGA, {}: … of which commit → the relay's Write sent | p50 {} ms, p99 {} ms; those Writes at OpenFGA p50 {} ms, p99 {} ms | | |",
                    l.config.label(),
                    ms(l.sent.p50),
                    ms(l.sent.p99),
                    ms(l.relay_write.p50),
                    ms(l.relay_write.p99)
                );
                let (beside50, beside99) = l.added_beside_commits();
                let beside_failed = if l.beside_failed > 0 {
                    format!(" ({} of its Writes failed, left out)", l.beside_failed)
                } else {
                    String::new()
                };
                println!(
                    "| real OpenFGA, {}: … OpenFGA's Write while the same commits go into the outbox (no relay){beside_failed} | p50 {} ms, p99 {} ms; against it the relay adds {} / {} ms | | |",
                    l.config.label(),
                    ms(l.write_beside_commits.p50),
                    ms(l.write_beside_commits.p99),
                    ms(beside50),
                    ms(beside99)
                );
            }
            for w in &r.windows {
                println!(
                    "| real OpenFGA: bare client, {} in flight | {:.0} tuples/s; Write p50 {} ms, p99 {} ms | | |",
                    w.window,
                    w.tuples_per_s(),
                    ms(w.write.p50),
                    ms(w.write.p99)
                );
            }
            println!(
                "| (load at the end of the real-OpenFGA scenario) | {} | | |",
                r.load
            );
        }
        if let Some(r) = &self.stores {
            println!(
                "| burn-down spread over {} stores vs one store, {} rows × 2 tuples | {:.0} vs {:.0} tuples/s ({:.2}×); Writes per row {:.3} vs {:.3} | ≥ 0.9× | {} |",
                r.stores,
                r.one.rows,
                r.spread.tuples_per_s(),
                r.one.tuples_per_s(),
                r.ratio(),
                writes_per_row(&r.spread),
                writes_per_row(&r.one),
                self.verdict(sizes, r.ratio() >= 0.9)
            );
        }
        if let Some(i) = &self.isolation {
            let mib = |k: u64| k as f64 / 1024.0;
            println!(
                "| isolation: a store failing with {} pending rows; another store's rows, one every 0.5 s for {} s, commit → OpenFGA answered | p50 {} ms, p99 {} ms, max {} ms ({} rows, {} never delivered) | p99 ≤ 1 s | {} |",
                i.backlog,
                i.secs,
                ms(i.latency.p50),
                ms(i.latency.p99),
                ms(i.latency.max),
                i.commits,
                i.undelivered,
                self.verdict(sizes, i.undelivered == 0 && i.latency.p99 <= 1_000.0)
            );
            println!(
                "| isolation: the relay's RSS over the run | first {:.1} MiB, max {:.1} MiB, last {:.1} MiB | flat | {} |",
                mib(i.rss_first()),
                mib(i.rss_max()),
                mib(i.rss_last()),
                self.verdict(sizes, i.rss_flat())
            );
            println!(
                "| isolation: CPU over the run (100% = a core) | relay {:.1}%, the outbox's PostgreSQL {:.1}% (its sessions {:.1}%); the failing store: {} Writes; rows pending at the end {}, dead-lettered {} | | |",
                i.relay_pct(),
                i.outbox_pg_pct(),
                i.cpu.relay_pg / i.cpu.wall.max(1e-9) * 100.0,
                i.failing_writes,
                i.pending,
                i.dead
            );
            println!(
                "| (load at the end of the isolation scenario) | {} | | |",
                i.load
            );
        }
        if let Some(m) = &self.model {
            println!(
                "| model: the stream's model test, {} cases of each property | {} passed, {} failed {:?}, in {:.0} s | none fails | {} |",
                m.cases,
                m.passed,
                m.failed.len(),
                m.failed,
                m.secs,
                verdict(m.failed.is_empty())
            );
        }
    }
}
