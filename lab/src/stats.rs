//! Summaries of interleaved rounds: medians and ranges, and the median of
//! round-by-round ratios, which cancels what one round's noise does to
//! both of its cells.

/// The median of `values` (sorting them).
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The median of `values` and their range.
pub fn spread(values: &mut [f64]) -> (f64, f64, f64) {
    let middle = median(values);
    (middle, values[0], values[values.len() - 1])
}

/// The median of the round-by-round ratios `a / b`, and their range.
pub fn ratio_spread(a: &[f64], b: &[f64]) -> (f64, f64, f64) {
    let mut ratios: Vec<f64> = a.iter().zip(b).map(|(x, y)| x / y).collect();
    spread(&mut ratios)
}

/// The median of `values` and their quartiles (sorting them).
pub fn quartiles(values: &mut [f64]) -> (f64, f64, f64) {
    let middle = median(values);
    let at = |fraction: f64| {
        // The index of a quantile: truncation is the point.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let index = ((values.len().saturating_sub(1)) as f64 * fraction) as usize;
        values.get(index).copied().unwrap_or(f64::NAN)
    };
    (middle, at(0.25), at(0.75))
}

/// A median and a distribution-free confidence interval around it.
#[derive(Debug, Clone, Copy)]
pub struct Estimate {
    pub median: f64,
    pub low: f64,
    pub high: f64,
    /// The interval's coverage (at least 0.95 where `samples >= 6`).
    pub coverage: f64,
    pub samples: usize,
}

impl Estimate {
    /// The estimate of `1 / x × scale`: the bounds swap.
    pub fn reciprocal(&self, scale: f64) -> Self {
        Self {
            median: scale / self.median,
            low: scale / self.high,
            high: scale / self.low,
            ..*self
        }
    }

    /// "median (low–high)", each with `decimals` decimals.
    pub fn show(&self, decimals: usize) -> String {
        format!(
            "{:.decimals$} ({:.decimals$}–{:.decimals$})",
            self.median, self.low, self.high
        )
    }
}

/// The median of `values` with the order-statistics interval around it:
/// the widest `[x(j), x(n−1−j)]` (0-based, sorted) whose coverage
/// `1 − 2 P(B ≤ j)`, `B ~ Binomial(n, ½)`, is at least 95 %. It assumes
/// only that the values are independent draws of one distribution, whose
/// median it then covers with that probability. Below 6 values no such
/// interval reaches 95 %: it is then the range, and `coverage` says what
/// it covers.
pub fn median_ci(values: &mut [f64]) -> Estimate {
    let middle = median(values);
    let n = values.len();
    if n == 0 {
        return Estimate {
            median: f64::NAN,
            low: f64::NAN,
            high: f64::NAN,
            coverage: 0.0,
            samples: 0,
        };
    }
    // P(B <= j) for j = 0, 1, …, accumulated from the binomial terms
    // C(n, j) / 2^n, each computed from its logarithm (2^−n underflows
    // past n = 1 074).
    #[allow(clippy::cast_precision_loss)]
    let mut log_term = n as f64 * 0.5_f64.ln();
    let mut below = log_term.exp();
    let mut lower = 0;
    let mut coverage = 1.0 - 2.0 * below;
    for j in 1..n / 2 {
        #[allow(clippy::cast_precision_loss)]
        let step = ((n - j + 1) as f64 / j as f64).ln();
        log_term += step;
        let term = log_term.exp();
        if below + term > 0.025 {
            break;
        }
        below += term;
        lower = j;
        coverage = 1.0 - 2.0 * below;
    }
    Estimate {
        median: middle,
        low: values[lower],
        high: values[n - 1 - lower],
        coverage,
        samples: n,
    }
}

#[cfg(test)]
mod tests {
    use super::median_ci;

    #[test]
    fn the_median_interval_takes_the_order_statistics_the_binomial_names() {
        // n = 10: P(B <= 1) = 11/1024 <= 0.025 < P(B <= 2) = 56/1024, so the
        // interval is [x(1), x(8)] with coverage 1 − 22/1024.
        let mut ten: Vec<f64> = (0..10).map(f64::from).rev().collect();
        let estimate = median_ci(&mut ten);
        assert_eq!(
            (estimate.low, estimate.median, estimate.high),
            (1.0, 5.0, 8.0)
        );
        assert!((estimate.coverage - (1.0 - 22.0 / 1024.0)).abs() < 1e-12);
        // n = 30: P(B <= 9) = 0.0214, P(B <= 10) = 0.0494: [x(9), x(20)].
        let mut thirty: Vec<f64> = (0..30).map(f64::from).collect();
        let estimate = median_ci(&mut thirty);
        assert_eq!((estimate.low, estimate.high), (9.0, 20.0));
        assert!(estimate.coverage >= 0.95 && estimate.coverage < 0.96);
        // n = 6: only the range, at 1 − 2/64.
        let mut six: Vec<f64> = (0..6).map(f64::from).collect();
        let estimate = median_ci(&mut six);
        assert_eq!((estimate.low, estimate.high), (0.0, 5.0));
        assert!((estimate.coverage - (1.0 - 2.0 / 64.0)).abs() < 1e-12);
        // n = 2 000 (2^−n underflows): the normal approximation puts the
        // bounds about 1.96 √n / 2 = 43.8 order statistics from the middle.
        let mut many: Vec<f64> = (0..2_000).map(f64::from).collect();
        let estimate = median_ci(&mut many);
        assert!((955.0..=957.0).contains(&estimate.low), "{estimate:?}");
        assert_eq!(estimate.low + estimate.high, 1_999.0);
        assert!(estimate.coverage >= 0.95 && estimate.coverage < 0.955);
    }
}
