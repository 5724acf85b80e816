//! Reading PostgreSQL's EXPLAIN (ANALYZE, BUFFERS) output: the buffers a plan touched and its
//! execution time.

/// The buffers an EXPLAIN's top node read ("Buffers: shared hit=N read=M": N + M; 0 when it
/// touched none).
pub(crate) fn top_buffers(explain: &str) -> u64 {
    explain
        .lines()
        .take_while(|l| !l.contains("Planning:"))
        .find(|l| l.contains("Buffers:"))
        .map(|l| {
            l.split_whitespace()
                .filter_map(|w| w.split_once('='))
                .filter(|(k, _)| *k == "hit" || *k == "read")
                .filter_map(|(_, n)| n.parse::<u64>().ok())
                .sum()
        })
        .unwrap_or(0)
}

/// "Execution Time: X ms" of an EXPLAIN ANALYZE.
pub(crate) fn exec_ms(explain: &str) -> f64 {
    explain
        .lines()
        .find_map(|l| l.trim().strip_prefix("Execution Time: "))
        .and_then(|v| v.trim_end_matches(" ms").parse().ok())
        .unwrap_or(f64::NAN)
}
