//! The verify-width schedule: how many of the drafted tokens the target verifies, by decode
//! batch size (`num_speculative_tokens_per_batch_size`).
//!
//! A step always drafts `K` tokens; the schedule only narrows how many of them (a prefix) the
//! target checks. Ranges are inclusive, must start at batch size 1 and must not overlap; gaps
//! and the tail past the last range carry the previous count forward; every count is capped at
//! `K`. A count of 0 verifies nothing at those sizes.

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;

const FIELD: &str = "num_speculative_tokens_per_batch_size";

/// One inclusive range of decode batch sizes and the verify width used there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct VerifyWidthRange {
    pub batch_start: i64,
    pub batch_end: i64,
    pub num_tokens: i64,
}

impl VerifyWidthRange {
    pub fn new(batch_start: i64, batch_end: i64, num_tokens: i64) -> Self {
        Self { batch_start, batch_end, num_tokens }
    }

    pub fn as_triple(&self) -> (i64, i64, i64) {
        (self.batch_start, self.batch_end, self.num_tokens)
    }
}

/// Validates a schedule and returns it sorted by `batch_start`.
///
/// Errors are reported in a fixed order (empty, positivity, start <= end, non-negative count,
/// overlap, first range at 1) so a user fixes one thing at a time.
pub fn normalize_schedule(ranges: &[VerifyWidthRange]) -> Result<Vec<VerifyWidthRange>, ConfigError> {
    if ranges.is_empty() {
        return Err(ConfigError::field(FIELD, format!("{FIELD} must name at least one batch-size range")));
    }
    for r in ranges {
        let (s, e, n) = r.as_triple();
        if s <= 0 || e <= 0 {
            return Err(ConfigError::field(
                FIELD,
                format!("batch sizes in {FIELD} must be positive, got range ({s}, {e})"),
            ));
        }
        if s > e {
            return Err(ConfigError::field(FIELD, format!("range ({s}, {e}) in {FIELD} must have start <= end")));
        }
        if n < 0 {
            return Err(ConfigError::field(
                FIELD,
                format!(
                    "num_tokens in {FIELD} must be non-negative (0 verifies nothing), got {n} for range ({s}, {e})"
                ),
            ));
        }
    }
    let mut sorted = ranges.to_vec();
    sorted.sort_by_key(|r| (r.batch_start, r.batch_end));
    for pair in sorted.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if b.batch_start <= a.batch_end {
            return Err(ConfigError::field(
                FIELD,
                format!(
                    "ranges ({}, {}) and ({}, {}) in {FIELD} must not overlap",
                    a.batch_start, a.batch_end, b.batch_start, b.batch_end
                ),
            ));
        }
    }
    if sorted[0].batch_start != 1 {
        return Err(ConfigError::field(
            FIELD,
            format!(
                "The first range in {FIELD} must start at batch size 1 so that every batch size resolves to a verify width; it starts at {}",
                sorted[0].batch_start
            ),
        ));
    }
    Ok(sorted)
}

/// Dense batch-size → verify-width table built once at pipeline load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyWidthSchedule {
    /// `table[b]` is the width for decode batch size `b`; index 0 is unused.
    table: Vec<usize>,
}

impl VerifyWidthSchedule {
    /// Builds the table for batch sizes `1..=max_batch_size`, capping every count at `max_width`.
    pub fn build(ranges: &[VerifyWidthRange], max_batch_size: usize, max_width: usize) -> Result<Self, ConfigError> {
        if max_batch_size == 0 {
            return Err(ConfigError::new("the verify-width schedule needs a max batch size of at least 1"));
        }
        if max_width == 0 {
            return Err(ConfigError::new("the verify-width schedule needs num_speculative_tokens of at least 1"));
        }
        let ranges = normalize_schedule(ranges)?;
        let mut table = vec![0usize; max_batch_size + 1];
        let mut carried = 0usize;
        let mut next_range = 0usize;
        for (b, slot) in table.iter_mut().enumerate().skip(1) {
            while next_range < ranges.len() && ranges[next_range].batch_start as usize <= b {
                carried = (ranges[next_range].num_tokens as usize).min(max_width);
                next_range += 1;
            }
            // Inside a range, its own count; in a gap or past the end, the previous count.
            *slot = carried;
        }
        Ok(Self { table })
    }

    /// A schedule that verifies every drafted token at every batch size.
    pub fn constant(max_batch_size: usize, width: usize) -> Self {
        Self { table: vec![width; max_batch_size.max(1) + 1] }
    }

    /// The width for a decode batch of `batch_size` rows (per replica). 0 rows reads as 1;
    /// sizes past the table read the last entry.
    pub fn width_for(&self, batch_size: usize) -> usize {
        let idx = batch_size.clamp(1, self.table.len() - 1);
        self.table[idx]
    }

    /// Every width some batch size can use (sorted, distinct).
    pub fn reachable_widths(&self) -> Vec<usize> {
        let mut w: Vec<usize> = self.table[1..].to_vec();
        w.sort_unstable();
        w.dedup();
        w
    }

    /// True when some batch size verifies nothing, so a drafter declaring
    /// `supports_zero_draft_rows` may skip its forward there.
    pub fn has_zero_width(&self) -> bool {
        self.table[1..].contains(&0)
    }

    pub fn max_batch_size(&self) -> usize {
        self.table.len() - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(s: i64, e: i64, n: i64) -> VerifyWidthRange {
        VerifyWidthRange::new(s, e, n)
    }

    #[test]
    fn normalize_sorts_ranges() {
        let out = normalize_schedule(&[r(17, 64, 1), r(1, 16, 3)]).unwrap();
        assert_eq!(out, vec![r(1, 16, 3), r(17, 64, 1)]);
    }

    #[test]
    fn normalize_rejects_each_broken_rule_in_order() {
        let msg = |v: &[VerifyWidthRange]| normalize_schedule(v).unwrap_err().message;
        assert!(msg(&[]).contains("at least one"));
        assert!(msg(&[r(0, 4, 1)]).contains("must be positive"));
        assert!(msg(&[r(1, -4, 1)]).contains("must be positive"));
        assert!(msg(&[r(5, 4, 1)]).contains("start <= end"));
        assert!(msg(&[r(1, 4, -1)]).contains("non-negative"));
        assert!(msg(&[r(1, 4, 1), r(4, 8, 2)]).contains("must not overlap"));
        assert!(msg(&[r(2, 4, 1)]).contains("must start at batch size 1"));
        // Positivity is reported before overlap.
        assert!(msg(&[r(1, 4, 1), r(3, 8, 2), r(0, 0, 1)]).contains("must be positive"));
    }

    #[test]
    fn lookup_carries_gaps_and_tail_and_caps_at_width() {
        let s = VerifyWidthSchedule::build(&[r(1, 2, 9), r(5, 6, 1), r(8, 8, 0)], 12, 4).unwrap();
        let widths: Vec<usize> = (0..=14).map(|b| s.width_for(b)).collect();
        //            b: 0  1  2  3  4  5  6  7  8  9 10 11 12 13 14
        assert_eq!(widths, vec![4, 4, 4, 4, 4, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0]);
        assert!(s.has_zero_width());
        assert_eq!(s.reachable_widths(), vec![0, 1, 4]);
    }

    #[test]
    fn lookup_rejects_degenerate_bounds() {
        assert!(VerifyWidthSchedule::build(&[r(1, 1, 1)], 0, 3).is_err());
        assert!(VerifyWidthSchedule::build(&[r(1, 1, 1)], 4, 0).is_err());
    }
}
