//! The machine's load, printed beside every measured figure (the bench and the hand-run
//! measurements): the machine may be shared, and what else runs shows in every number.

/// The load averages over 1, 5 and 15 minutes, as `/proc/loadavg` gives them.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}
