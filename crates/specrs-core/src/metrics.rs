//! Speculative-decoding acceptance statistics: per-step counts, cumulative counters,
//! histograms, Prometheus text and the periodic log line.
//!
//! Definitions (the vocabulary of ARCHITECTURE.md):
//! - A *draft* is one row of a verify step that verified at least one draft token; rows with
//!   verify width 0 (no drafts, e.g. mixed-batch prefill rows) are not drafts and count
//!   nowhere, so a step that verified nothing leaves every statistic unchanged.
//! - `accepted_per_position[i]` counts drafts that accepted at least `i + 1` tokens.
//!   Acceptance is a prefix, so the vector is non-increasing and sums to the accepted total.
//! - *Acceptance length* is accepted drafts + 1 per draft: the bonus (or recovered) token the
//!   verify step always emits. [`SpecDecodeStats::mean_acceptance_length`] follows vLLM
//!   (`1 + accepted / num_drafts`); MAX's `avg_acceptance_length` histogram records the
//!   drafts-only `accepted / num_drafts` ([`SpecDecodeStats::mean_accepted_drafts`]).
//! - Per-position acceptance rate is `accepted_per_position[i] / num_drafts`: the
//!   unconditional share of drafts reaching position `i` (MAX's and vLLM's convention).
//!
//! Exported names follow the peers so existing dashboards work: vLLM's counters
//! (`spec_decode_num_drafts`, ..., exposed with the `_total` suffix as prometheus_client
//! does) and MAX's histograms (`spec_decode_acceptance_rate_per_position`,
//! `spec_decode_avg_acceptance_length`). The caller chooses the prefix (`vllm:`, `maxserve_`,
//! `specrs_`).

use std::fmt::Write as _;

/// Acceptance counts of one verify step, or of any window of steps merged together.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecDecodeStats {
    /// Rows that verified at least one draft token.
    pub num_drafts: u64,
    /// Draft tokens verified: the sum of the rows' verify widths.
    pub num_draft_tokens: u64,
    /// Draft tokens accepted.
    pub num_accepted_tokens: u64,
    /// `[i]`: drafts that accepted at least `i + 1` tokens. As long as the widest verify
    /// width recorded, so positions nobody accepted show as 0.
    pub accepted_per_position: Vec<u64>,
    /// Accepted tokens that only the relaxed acceptance overlay accepted (a subset of
    /// `num_accepted_tokens`), reported apart so relaxation never inflates the strict rate
    /// unseen.
    pub num_relaxed_accepted: u64,
}

impl SpecDecodeStats {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records one row that verified `verify_width` drafts and accepted the first
    /// `num_accepted` of them. A width of 0 records nothing.
    pub fn record_row(&mut self, verify_width: usize, num_accepted: usize) {
        self.record_row_with_relaxed(verify_width, num_accepted, 0);
    }

    /// [`record_row`](Self::record_row) for a row where `num_relaxed` of the accepted drafts
    /// passed only thanks to relaxed acceptance. Counts above their bounds are clamped
    /// (`num_accepted <= verify_width`, `num_relaxed <= num_accepted`).
    pub fn record_row_with_relaxed(&mut self, verify_width: usize, num_accepted: usize, num_relaxed: usize) {
        debug_assert!(num_accepted <= verify_width, "row accepted {num_accepted} of {verify_width} drafts");
        debug_assert!(num_relaxed <= num_accepted, "{num_relaxed} relaxed of {num_accepted} accepted");
        if verify_width == 0 {
            return;
        }
        let num_accepted = num_accepted.min(verify_width);
        self.num_drafts += 1;
        self.num_draft_tokens += verify_width as u64;
        self.num_accepted_tokens += num_accepted as u64;
        self.num_relaxed_accepted += num_relaxed.min(num_accepted) as u64;
        self.extend_positions(verify_width);
        for reached in &mut self.accepted_per_position[..num_accepted] {
            *reached += 1;
        }
    }

    /// Adds another window's counts; positions extend to the longer of the two.
    pub fn merge(&mut self, other: &SpecDecodeStats) {
        self.num_drafts += other.num_drafts;
        self.num_draft_tokens += other.num_draft_tokens;
        self.num_accepted_tokens += other.num_accepted_tokens;
        self.num_relaxed_accepted += other.num_relaxed_accepted;
        self.extend_positions(other.accepted_per_position.len());
        for (mine, theirs) in self.accepted_per_position.iter_mut().zip(&other.accepted_per_position) {
            *mine += theirs;
        }
    }

    /// No row verified a draft.
    pub fn is_empty(&self) -> bool {
        self.num_drafts == 0
    }

    /// Accepted share of verified draft tokens, in `[0, 1]`; `None` when none were verified.
    pub fn acceptance_rate(&self) -> Option<f64> {
        ratio(self.num_accepted_tokens, self.num_draft_tokens)
    }

    /// Tokens emitted per draft, bonus included: `1 + accepted / num_drafts` (vLLM's mean
    /// acceptance length); `None` when no row verified a draft.
    pub fn mean_acceptance_length(&self) -> Option<f64> {
        self.mean_accepted_drafts().map(|accepted| 1.0 + accepted)
    }

    /// Accepted drafts per draft, bonus excluded: `accepted / num_drafts` (MAX's
    /// `avg_acceptance_length`); `None` when no row verified a draft.
    pub fn mean_accepted_drafts(&self) -> Option<f64> {
        ratio(self.num_accepted_tokens, self.num_drafts)
    }

    /// `[i]`: share of drafts that reached position `i`, in `[0, 1]`; empty when no row
    /// verified a draft.
    pub fn acceptance_rate_per_position(&self) -> Vec<f64> {
        if self.is_empty() {
            return Vec::new();
        }
        self.accepted_per_position.iter().map(|&reached| reached as f64 / self.num_drafts as f64).collect()
    }

    fn extend_positions(&mut self, width: usize) {
        if self.accepted_per_position.len() < width {
            self.accepted_per_position.resize(width, 0);
        }
    }
}

fn ratio(numerator: u64, denominator: u64) -> Option<f64> {
    (denominator > 0).then(|| numerator as f64 / denominator as f64)
}

/// The periodic log clause, shaped like MAX's scheduler log:
///
/// `Draft Tokens: 45/60 (75.0%) accepted, Acceptance Len: 3.25 / 4 toks, Per-Pos: [p0=90%, p1=75%, p2=60%]`
///
/// - `45/60 (75.0%)`: accepted / verified draft tokens, rate to one decimal.
/// - `3.25 / 4 toks`: [`SpecDecodeStats::mean_acceptance_length`] (bonus included, two
///   decimals) out of its maximum `k + 1`, where `k` is the configured
///   `num_speculative_tokens`. (MAX prints drafts-only length out of `k`; counting the bonus
///   on both sides keeps the clause equal to the acceptance length reported everywhere else.)
/// - `Per-Pos`: [`SpecDecodeStats::acceptance_rate_per_position`] as whole percents, one
///   entry per position verified in the window.
///
/// A window with no drafts prints `Draft Tokens: 0/0 (n/a) accepted, Acceptance Len: n/a /
/// {k+1} toks, Per-Pos: []`; callers usually skip logging it.
pub fn format_log_line(stats: &SpecDecodeStats, k: usize) -> String {
    let rate = stats.acceptance_rate().map_or_else(|| "n/a".to_string(), |r| format!("{:.1}%", 100.0 * r));
    let length = stats.mean_acceptance_length().map_or_else(|| "n/a".to_string(), |l| format!("{l:.2}"));
    let per_position: Vec<String> = stats
        .acceptance_rate_per_position()
        .iter()
        .enumerate()
        .map(|(i, r)| format!("p{i}={:.0}%", 100.0 * r))
        .collect();
    format!(
        "Draft Tokens: {}/{} ({rate}) accepted, Acceptance Len: {length} / {} toks, Per-Pos: [{}]",
        stats.num_accepted_tokens,
        stats.num_draft_tokens,
        k + 1,
        per_position.join(", ")
    )
}

/// Cumulative totals since start, exported as monotone Prometheus counters with vLLM's names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecDecodeCounters {
    totals: SpecDecodeStats,
}

impl SpecDecodeCounters {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn add(&mut self, step: &SpecDecodeStats) {
        self.totals.merge(step);
    }

    /// Everything added so far, with the derived rates of [`SpecDecodeStats`].
    pub fn totals(&self) -> &SpecDecodeStats {
        &self.totals
    }

    /// Prometheus text exposition (format 0.0.4) of the counters, names prefixed by
    /// `prefix`:
    ///
    /// ```text
    /// {prefix}spec_decode_num_drafts_total
    /// {prefix}spec_decode_num_draft_tokens_total
    /// {prefix}spec_decode_num_accepted_tokens_total
    /// {prefix}spec_decode_num_accepted_tokens_per_pos_total{position="i"}
    /// {prefix}spec_decode_num_relaxed_accepted_tokens_total   (spec-rs extension)
    /// ```
    pub fn render_prometheus(&self, prefix: &str) -> String {
        let mut out = PrometheusText::new(prefix);
        let t = &self.totals;
        out.counter(
            "spec_decode_num_drafts",
            "Number of spec decoding drafts (rows that verified at least one draft token).",
            &[(None, t.num_drafts)],
        );
        out.counter("spec_decode_num_draft_tokens", "Number of draft tokens verified.", &[(None, t.num_draft_tokens)]);
        out.counter(
            "spec_decode_num_accepted_tokens",
            "Number of accepted draft tokens.",
            &[(None, t.num_accepted_tokens)],
        );
        let per_position: Vec<(Option<usize>, u64)> =
            t.accepted_per_position.iter().enumerate().map(|(position, &count)| (Some(position), count)).collect();
        out.counter(
            "spec_decode_num_accepted_tokens_per_pos",
            "Accepted draft tokens per draft position.",
            &per_position,
        );
        out.counter(
            "spec_decode_num_relaxed_accepted_tokens",
            "Accepted draft tokens that only relaxed acceptance accepted.",
            &[(None, t.num_relaxed_accepted)],
        );
        out.finish()
    }
}

/// Upper bounds of the `acceptance_rate_per_position` buckets, in percent. `0` isolates
/// positions nothing reached; tenths resolve the usual 30-95% range well enough to compare
/// drafters.
pub const ACCEPTANCE_RATE_BUCKETS_PERCENT: &[f64] = &[0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0];

/// Upper bounds of the `avg_acceptance_length` buckets, in accepted drafts per draft.
/// Half-token steps up to 8 cover chain drafters (K <= 8); 10, 12 and 16 cover block
/// drafters' wider blocks.
pub const ACCEPTANCE_LENGTH_BUCKETS: &[f64] =
    &[0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 5.5, 6.0, 6.5, 7.0, 7.5, 8.0, 10.0, 12.0, 16.0];

/// A Prometheus histogram with fixed bounds (the `+Inf` bucket is implicit).
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    bounds: &'static [f64],
    /// `[b]`: observations `<= bounds[b]` and above the previous bound; the last entry counts
    /// those above every bound.
    bucket_counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    /// `bounds` must be sorted ascending.
    pub fn new(bounds: &'static [f64]) -> Self {
        debug_assert!(bounds.windows(2).all(|w| w[0] < w[1]), "bounds not ascending");
        Self { bounds, bucket_counts: vec![0; bounds.len() + 1], sum: 0.0, count: 0 }
    }

    pub fn observe(&mut self, value: f64) {
        let bucket = self.bounds.partition_point(|&bound| bound < value);
        self.bucket_counts[bucket] += 1;
        self.sum += value;
        self.count += 1;
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn sum(&self) -> f64 {
        self.sum
    }

    /// `(le, cumulative count)` per bound, ending with `(+Inf, count)`.
    pub fn cumulative_buckets(&self) -> Vec<(f64, u64)> {
        let bounds = self.bounds.iter().copied().chain([f64::INFINITY]);
        let mut running = 0;
        bounds
            .zip(&self.bucket_counts)
            .map(|(bound, &n)| {
                running += n;
                (bound, running)
            })
            .collect()
    }
}

/// MAX's acceptance histograms, observed once per verify step.
#[derive(Debug, Clone, PartialEq)]
pub struct AcceptanceHistograms {
    /// `[i]`: the per-step percentage of drafts reaching position `i`.
    rate_per_position: Vec<Histogram>,
    /// The per-step accepted drafts per draft (bonus excluded).
    acceptance_length: Histogram,
}

impl Default for AcceptanceHistograms {
    fn default() -> Self {
        Self::new()
    }
}

impl AcceptanceHistograms {
    pub fn new() -> Self {
        Self { rate_per_position: Vec::new(), acceptance_length: Histogram::new(ACCEPTANCE_LENGTH_BUCKETS) }
    }

    /// Observes one step: one rate per verified position and one acceptance length. A step
    /// without drafts observes nothing (it would drag both towards zero for steps that did
    /// not speculate).
    pub fn observe_step(&mut self, step: &SpecDecodeStats) {
        let Some(accepted_drafts) = step.mean_accepted_drafts() else {
            return;
        };
        self.acceptance_length.observe(accepted_drafts);
        for (position, &reached) in step.accepted_per_position.iter().enumerate() {
            if self.rate_per_position.len() <= position {
                self.rate_per_position.push(Histogram::new(ACCEPTANCE_RATE_BUCKETS_PERCENT));
            }
            // Scaling the count before dividing keeps whole percents exact (0.6 * 100 is not
            // 60 in binary floating point), so they land in their own `le` bucket.
            let percent = (100 * reached) as f64 / step.num_drafts as f64;
            self.rate_per_position[position].observe(percent);
        }
    }

    /// The rate histogram of each position observed so far.
    pub fn rate_per_position(&self) -> &[Histogram] {
        &self.rate_per_position
    }

    pub fn acceptance_length(&self) -> &Histogram {
        &self.acceptance_length
    }

    /// Prometheus text exposition (format 0.0.4): `{prefix}spec_decode_acceptance_rate_per_position`
    /// (label `position`) and `{prefix}spec_decode_avg_acceptance_length`, each as
    /// `_bucket{le=...}`, `_sum` and `_count` series.
    pub fn render_prometheus(&self, prefix: &str) -> String {
        let mut out = PrometheusText::new(prefix);
        let per_position: Vec<(Option<usize>, &Histogram)> = self
            .rate_per_position
            .iter()
            .enumerate()
            .map(|(position, histogram)| (Some(position), histogram))
            .collect();
        out.histogram(
            "spec_decode_acceptance_rate_per_position",
            "Per-step share of drafts whose acceptance reached each position, in percent (0-100).",
            &per_position,
        );
        out.histogram(
            "spec_decode_avg_acceptance_length",
            "Per-step accepted draft tokens per draft, bonus token excluded.",
            &[(None, &self.acceptance_length)],
        );
        out.finish()
    }
}

/// Writes Prometheus text exposition. Series are labelled by an optional draft position.
struct PrometheusText {
    prefix: String,
    out: String,
}

impl PrometheusText {
    /// Characters a metric name cannot hold become `_`, the way OpenTelemetry exporters turn
    /// `maxserve.` into `maxserve_`.
    fn new(prefix: &str) -> Self {
        let prefix = prefix
            .chars()
            .enumerate()
            .map(|(i, c)| {
                let allowed = c.is_ascii_alphabetic() || c == '_' || c == ':';
                if allowed || (i > 0 && c.is_ascii_digit()) { c } else { '_' }
            })
            .collect();
        Self { prefix, out: String::new() }
    }

    fn header(&mut self, name: &str, help: &str, kind: &str) {
        let prefix = &self.prefix;
        // Writing to a String cannot fail.
        let _ = writeln!(self.out, "# HELP {prefix}{name} {help}");
        let _ = writeln!(self.out, "# TYPE {prefix}{name} {kind}");
    }

    fn counter(&mut self, name: &str, help: &str, series: &[(Option<usize>, u64)]) {
        let total = format!("{name}_total");
        self.header(&total, help, "counter");
        for (position, value) in series {
            let labels = position_labels(*position, None);
            let _ = writeln!(self.out, "{}{total}{labels} {value}", self.prefix);
        }
    }

    fn histogram(&mut self, name: &str, help: &str, series: &[(Option<usize>, &Histogram)]) {
        self.header(name, help, "histogram");
        let prefix = &self.prefix;
        for (position, histogram) in series {
            for (bound, cumulative) in histogram.cumulative_buckets() {
                let labels = position_labels(*position, Some(bound));
                let _ = writeln!(self.out, "{prefix}{name}_bucket{labels} {cumulative}");
            }
            let labels = position_labels(*position, None);
            let _ = writeln!(self.out, "{prefix}{name}_sum{labels} {}", histogram.sum());
            let _ = writeln!(self.out, "{prefix}{name}_count{labels} {}", histogram.count());
        }
    }

    fn finish(self) -> String {
        self.out
    }
}

/// `{position="2",le="0.5"}`, or nothing when neither label applies.
fn position_labels(position: Option<usize>, le: Option<f64>) -> String {
    let mut labels = Vec::new();
    if let Some(position) = position {
        labels.push(format!("position=\"{position}\""));
    }
    if let Some(bound) = le {
        let bound = if bound.is_infinite() { "+Inf".to_string() } else { bound.to_string() };
        labels.push(format!("le=\"{bound}\""));
    }
    if labels.is_empty() { String::new() } else { format!("{{{}}}", labels.join(",")) }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    /// The brief's example window: K = 3, 20 drafts; 18 reach p0, 15 p1, 12 p2.
    fn example_window() -> SpecDecodeStats {
        let mut stats = SpecDecodeStats::new();
        for accepted in [(2, 0), (3, 1), (3, 2), (12, 3)] {
            for _ in 0..accepted.0 {
                stats.record_row(3, accepted.1);
            }
        }
        stats
    }

    fn assert_close(actual: f64, expected: f64) {
        assert!((actual - expected).abs() < 1e-12, "{actual} != {expected}");
    }

    #[test]
    fn record_row_counts_prefix_acceptance_per_position() {
        let stats = example_window();
        assert_eq!(stats.num_drafts, 20);
        assert_eq!(stats.num_draft_tokens, 60);
        assert_eq!(stats.num_accepted_tokens, 45);
        assert_eq!(stats.accepted_per_position, vec![18, 15, 12]);
        assert_eq!(stats.accepted_per_position.iter().sum::<u64>(), 45);
    }

    #[test]
    fn derived_rates_follow_vllm_and_max_conventions() {
        let stats = example_window();
        assert_close(stats.acceptance_rate().unwrap(), 0.75);
        assert_close(stats.mean_acceptance_length().unwrap(), 3.25);
        assert_close(stats.mean_accepted_drafts().unwrap(), 2.25);
        let per_position = stats.acceptance_rate_per_position();
        for (actual, expected) in per_position.into_iter().zip([0.9, 0.75, 0.6]) {
            assert_close(actual, expected);
        }
    }

    #[test]
    fn zero_width_rows_are_not_drafts() {
        let mut stats = SpecDecodeStats::new();
        stats.record_row(0, 0);
        assert!(stats.is_empty());
        assert_eq!(stats, SpecDecodeStats::default());
        assert_eq!(stats.acceptance_rate(), None);
        assert_eq!(stats.mean_acceptance_length(), None);
        assert!(stats.acceptance_rate_per_position().is_empty());
        stats.record_row(2, 0);
        assert!(!stats.is_empty());
        assert_eq!(stats.accepted_per_position, vec![0, 0], "verified positions show as 0");
        assert_eq!(stats.mean_acceptance_length(), Some(1.0));
    }

    #[test]
    fn relaxed_acceptances_are_a_subset_of_accepted() {
        let mut stats = SpecDecodeStats::new();
        stats.record_row_with_relaxed(4, 3, 1);
        stats.record_row_with_relaxed(4, 4, 2);
        assert_eq!((stats.num_accepted_tokens, stats.num_relaxed_accepted), (7, 3));
    }

    #[test]
    fn mixed_widths_extend_positions_and_stay_monotone() {
        let mut stats = SpecDecodeStats::new();
        stats.record_row(1, 1);
        stats.record_row(4, 2);
        assert_eq!(stats.accepted_per_position, vec![2, 1, 0, 0]);
        assert_eq!(stats.num_draft_tokens, 5);
    }

    #[test]
    fn merge_adds_counts_and_extends_positions() {
        let mut narrow = SpecDecodeStats::new();
        narrow.record_row(2, 2);
        let mut wide = SpecDecodeStats::new();
        wide.record_row_with_relaxed(4, 3, 1);
        wide.record_row(4, 0);
        let mut merged = narrow.clone();
        merged.merge(&wide);
        assert_eq!(
            merged,
            SpecDecodeStats {
                num_drafts: 3,
                num_draft_tokens: 10,
                num_accepted_tokens: 5,
                accepted_per_position: vec![2, 2, 1, 0],
                num_relaxed_accepted: 1,
            }
        );
        let mut other_order = wide;
        other_order.merge(&narrow);
        assert_eq!(other_order, merged, "merge is commutative");
    }

    fn row() -> impl Strategy<Value = (usize, usize)> {
        (0usize..6).prop_flat_map(|width| (Just(width), 0..=width))
    }

    proptest! {
        #[test]
        fn stats_invariants_hold_for_any_rows_and_merges(
            first in proptest::collection::vec(row(), 0..30),
            second in proptest::collection::vec(row(), 0..30),
        ) {
            let record = |rows: &[(usize, usize)]| {
                let mut stats = SpecDecodeStats::new();
                for &(width, accepted) in rows {
                    stats.record_row(width, accepted);
                }
                stats
            };
            let mut merged = record(&first);
            merged.merge(&record(&second));
            let all: Vec<(usize, usize)> = first.iter().chain(&second).copied().collect();
            prop_assert_eq!(&merged, &record(&all), "merging windows equals recording their rows");

            let per_position = &merged.accepted_per_position;
            prop_assert!(per_position.windows(2).all(|w| w[0] >= w[1]), "non-increasing");
            prop_assert_eq!(per_position.iter().sum::<u64>(), merged.num_accepted_tokens);
            prop_assert!(per_position.first().is_none_or(|&p0| p0 <= merged.num_drafts));
            prop_assert!(merged.num_accepted_tokens <= merged.num_draft_tokens);
            let drafts = all.iter().filter(|(width, _)| *width > 0).count() as u64;
            prop_assert_eq!(merged.num_drafts, drafts);
        }
    }

    #[test]
    fn log_line_matches_the_max_shape() {
        assert_eq!(
            format_log_line(&example_window(), 3),
            "Draft Tokens: 45/60 (75.0%) accepted, Acceptance Len: 3.25 / 4 toks, Per-Pos: [p0=90%, p1=75%, p2=60%]"
        );
    }

    #[test]
    fn log_line_of_an_empty_window_says_not_available() {
        assert_eq!(
            format_log_line(&SpecDecodeStats::new(), 4),
            "Draft Tokens: 0/0 (n/a) accepted, Acceptance Len: n/a / 5 toks, Per-Pos: []"
        );
    }

    #[test]
    fn counters_are_monotone_totals() {
        let mut counters = SpecDecodeCounters::new();
        let mut previous = counters.totals().clone();
        for window in [example_window(), SpecDecodeStats::new(), example_window()] {
            counters.add(&window);
            let now = counters.totals();
            assert!(now.num_drafts >= previous.num_drafts);
            assert!(now.num_accepted_tokens >= previous.num_accepted_tokens);
            assert!(
                now.accepted_per_position
                    .iter()
                    .zip(previous.accepted_per_position.iter().chain(std::iter::repeat(&0)))
                    .all(|(n, p)| n >= p)
            );
            previous = now.clone();
        }
        assert_eq!(counters.totals().num_drafts, 40);
        assert_eq!(counters.totals().accepted_per_position, vec![36, 30, 24]);
    }

    /// Parses Prometheus text into `series -> value` and `family -> TYPE`, checking that
    /// every sample belongs to a family declared with HELP and TYPE.
    fn parse_exposition(text: &str) -> (BTreeMap<String, f64>, BTreeMap<String, String>) {
        let mut samples = BTreeMap::new();
        let mut types = BTreeMap::new();
        let mut helped = Vec::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                helped.push(rest.split_once(' ').unwrap().0.to_string());
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                types.insert(name.to_string(), kind.to_string());
            } else {
                let (series, value) = line.rsplit_once(' ').unwrap();
                let name = series.split('{').next().unwrap();
                assert!(
                    name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
                    "invalid metric name {name}"
                );
                let family = types
                    .keys()
                    .filter(|family| name.starts_with(family.as_str()))
                    .max_by_key(|family| family.len())
                    .unwrap_or_else(|| panic!("{name} has no TYPE line"));
                assert!(helped.contains(family), "{family} has no HELP line");
                samples.insert(series.to_string(), value.parse().unwrap());
            }
        }
        (samples, types)
    }

    #[test]
    fn counters_render_vllm_names_as_prometheus_text() {
        let mut counters = SpecDecodeCounters::new();
        counters.add(&example_window());
        let (samples, types) = parse_exposition(&counters.render_prometheus("vllm:"));
        assert_eq!(types["vllm:spec_decode_num_drafts_total"], "counter");
        assert_eq!(samples["vllm:spec_decode_num_drafts_total"], 20.0);
        assert_eq!(samples["vllm:spec_decode_num_draft_tokens_total"], 60.0);
        assert_eq!(samples["vllm:spec_decode_num_accepted_tokens_total"], 45.0);
        assert_eq!(samples["vllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"2\"}"], 12.0);
        assert_eq!(samples["vllm:spec_decode_num_relaxed_accepted_tokens_total"], 0.0);
        assert_eq!(samples.len(), 3 + 3 + 1);
    }

    #[test]
    fn histograms_render_buckets_sum_and_count() {
        let mut histograms = AcceptanceHistograms::new();
        histograms.observe_step(&example_window());
        let mut perfect = SpecDecodeStats::new();
        perfect.record_row(2, 2);
        histograms.observe_step(&perfect);

        let (samples, types) = parse_exposition(&histograms.render_prometheus("maxserve."));
        let rate = "maxserve_spec_decode_acceptance_rate_per_position";
        let length = "maxserve_spec_decode_avg_acceptance_length";
        assert_eq!(types[rate], "histogram");
        assert_eq!(types[length], "histogram");

        // Position 0 saw 90% and 100%; position 2 only 60% (the perfect step verified 2).
        assert_eq!(samples[&format!("{rate}_count{{position=\"0\"}}")], 2.0);
        assert_close(samples[&format!("{rate}_sum{{position=\"0\"}}")], 190.0);
        assert_eq!(samples[&format!("{rate}_bucket{{position=\"0\",le=\"80\"}}")], 0.0);
        assert_eq!(samples[&format!("{rate}_bucket{{position=\"0\",le=\"90\"}}")], 1.0);
        assert_eq!(samples[&format!("{rate}_bucket{{position=\"0\",le=\"100\"}}")], 2.0);
        assert_eq!(samples[&format!("{rate}_bucket{{position=\"0\",le=\"+Inf\"}}")], 2.0);
        assert_eq!(samples[&format!("{rate}_count{{position=\"2\"}}")], 1.0);
        assert_eq!(samples[&format!("{rate}_bucket{{position=\"2\",le=\"50\"}}")], 0.0);
        assert_eq!(samples[&format!("{rate}_bucket{{position=\"2\",le=\"60\"}}")], 1.0);

        // Lengths 2.25 and 2.0 (drafts only).
        assert_eq!(samples[&format!("{length}_count")], 2.0);
        assert_close(samples[&format!("{length}_sum")], 4.25);
        assert_eq!(samples[&format!("{length}_bucket{{le=\"1.5\"}}")], 0.0);
        assert_eq!(samples[&format!("{length}_bucket{{le=\"2\"}}")], 1.0);
        assert_eq!(samples[&format!("{length}_bucket{{le=\"2.5\"}}")], 2.0);
        assert_eq!(samples[&format!("{length}_bucket{{le=\"+Inf\"}}")], 2.0);
    }

    #[test]
    fn histogram_buckets_are_cumulative_and_end_at_the_count() {
        let mut histogram = Histogram::new(ACCEPTANCE_RATE_BUCKETS_PERCENT);
        for value in [0.0, 0.0, 35.0, 100.0, 150.0] {
            histogram.observe(value);
        }
        let buckets = histogram.cumulative_buckets();
        assert_eq!(buckets.first(), Some(&(0.0, 2)));
        assert!(buckets.windows(2).all(|w| w[0].1 <= w[1].1));
        assert_eq!(buckets[buckets.len() - 2], (100.0, 4));
        assert_eq!(buckets.last(), Some(&(f64::INFINITY, 5)));
    }

    #[test]
    fn steps_without_drafts_observe_nothing() {
        let mut histograms = AcceptanceHistograms::new();
        let mut prefill_only = SpecDecodeStats::new();
        prefill_only.record_row(0, 0);
        histograms.observe_step(&prefill_only);
        assert_eq!(histograms, AcceptanceHistograms::new());
        assert_eq!(histograms.acceptance_length().count(), 0);
        let text = histograms.render_prometheus("specrs_");
        assert!(!text.contains("position="), "no position series before any draft:\n{text}");
        assert!(text.contains("specrs_spec_decode_avg_acceptance_length_count 0\n"));
    }
}
