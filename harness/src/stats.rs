//! Small statistics for the benchmark, here rather than in the bench target because a
//! `harness = false` target runs no `#[test]`: these are tested with the harness.

/// The `p`th percentile (nearest rank: the smallest value with at least `p` % of the
/// values at or below it) of values sorted ascending; `None` for no values.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil();
    // `as` saturates: NaN and negatives become 0, huge values usize::MAX; clamped below.
    let rank = rank as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&values, 50.0), Some(50.0));
        assert_eq!(percentile(&values, 99.0), Some(99.0));
        assert_eq!(percentile(&values, 99.5), Some(100.0));
        assert_eq!(percentile(&values, 100.0), Some(100.0));
        assert_eq!(percentile(&values, 0.0), Some(1.0));
        assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&[1.0, 2.0], f64::NAN), Some(1.0));
    }
}
