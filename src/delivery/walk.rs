//! The ranges of ids a read walks: every id but those of the longest runs of consecutive ids
//! the relay holds. A run of ids all held holds no row to read, so a read need not walk it: in
//! a burn-down the relay holds thousands of rows (its queue and the Writes in flight), and
//! walking them was most of a read's cost (each one fetched from the heap to be left out).

/// At most this many runs are left out, so at most one more range is walked: each range costs
/// the read an index descent and a LIMIT of its own.
const MAX_RUNS: usize = 16;

/// The ranges to walk, as their lowest and highest ids (inclusive), in order and apart: every
/// id outside the (at most [`MAX_RUNS`]) longest runs of consecutive ids in `held`. Any id not in
/// `held` is in one of them.
pub(super) fn ranges(held: &[i64]) -> (Vec<i64>, Vec<i64>) {
    let mut ids = held.to_vec();
    ids.sort_unstable();
    ids.dedup();
    // The runs of consecutive ids, as (first, last).
    let mut runs: Vec<(i64, i64)> = Vec::new();
    for id in ids {
        match runs.last_mut() {
            Some((_, last)) if *last + 1 == id => *last = id,
            _ => runs.push((id, id)),
        }
    }
    if runs.len() > MAX_RUNS {
        runs.sort_unstable_by_key(|(first, last)| std::cmp::Reverse(last.abs_diff(*first)));
        runs.truncate(MAX_RUNS);
        runs.sort_unstable();
    }
    let (mut lo, mut hi) = (
        Vec::with_capacity(runs.len() + 1),
        Vec::with_capacity(runs.len() + 1),
    );
    let mut from = i64::MIN;
    for (first, last) in runs {
        if first > from {
            lo.push(from);
            hi.push(first - 1);
        }
        // A run ending at i64::MAX leaves nothing after it.
        match last.checked_add(1) {
            Some(next) => from = next,
            None => return (lo, hi),
        }
    }
    lo.push(from);
    hi.push(i64::MAX);
    (lo, hi)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_runs_held_are_left_out() {
        assert_eq!(ranges(&[]), (vec![i64::MIN], vec![i64::MAX]));
        assert_eq!(
            ranges(&[5, 3, 4, 9]),
            (vec![i64::MIN, 6, 10], vec![2, 8, i64::MAX])
        );
        assert_eq!(
            ranges(&[i64::MIN, i64::MAX]),
            (vec![i64::MIN + 1], vec![i64::MAX - 1])
        );
    }

    #[test]
    fn only_the_longest_runs_are_left_out() {
        // 20 runs of one id, and one of three: 16 left out, the longest among them.
        let mut held: Vec<i64> = (0..20).map(|i| i * 10).collect();
        held.extend([500, 501, 502]);
        let (lo, hi) = ranges(&held);
        assert_eq!(lo.len(), MAX_RUNS + 1);
        assert!(lo.iter().zip(&hi).all(|(l, h)| !(*l <= 501 && 501 <= *h)));
    }

    proptest! {
        /// Every id not held is walked, and the ranges are in order and apart.
        #[test]
        fn every_id_not_held_is_walked(held in proptest::collection::vec(-40i64..200, 0..120)) {
            let (lo, hi) = ranges(&held);
            prop_assert_eq!(lo.len(), hi.len());
            for i in 0..lo.len() {
                prop_assert!(lo[i] <= hi[i]);
                if i > 0 {
                    prop_assert!(hi[i - 1] < lo[i]);
                }
            }
            for id in -50i64..210 {
                let walked = lo.iter().zip(&hi).any(|(l, h)| *l <= id && id <= *h);
                prop_assert!(walked || held.contains(&id), "{} is neither held nor walked", id);
            }
        }
    }
}
