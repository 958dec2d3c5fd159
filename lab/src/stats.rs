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
