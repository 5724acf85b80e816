//! Distributions of milliseconds and how the bench prints numbers.

#[derive(Clone, Debug, Default)]
pub(crate) struct Dist {
    pub(crate) n: usize,
    pub(crate) p50: f64,
    pub(crate) p90: f64,
    pub(crate) p99: f64,
    pub(crate) max: f64,
    pub(crate) mean: f64,
}

impl Dist {
    /// Nearest-rank percentiles of milliseconds.
    pub(crate) fn of(mut ms: Vec<f64>) -> Dist {
        if ms.is_empty() {
            return Dist::default();
        }
        ms.sort_by(f64::total_cmp);
        let q = |p: f64| ms[((p * ms.len() as f64).ceil() as usize).clamp(1, ms.len()) - 1];
        Dist {
            n: ms.len(),
            p50: q(0.50),
            p90: q(0.90),
            p99: q(0.99),
            max: ms[ms.len() - 1],
            mean: ms.iter().sum::<f64>() / ms.len() as f64,
        }
    }

    pub(crate) fn line(&self) -> String {
        format!(
            "p50 {} ms, p90 {} ms, p99 {} ms, max {} ms (mean {} ms, n {})",
            ms(self.p50),
            ms(self.p90),
            ms(self.p99),
            ms(self.max),
            ms(self.mean),
            self.n
        )
    }
}

pub(crate) fn ms(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}
