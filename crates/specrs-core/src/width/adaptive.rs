//! The throughput-driven adaptive verify-width controller (`adaptive_speculative_widths`).
//!
//! Goal: pick the verify width that maximises accepted tokens per second. Acceptance depends
//! on the traffic (one global estimate); step cost depends on the batch size (one estimate per
//! power-of-two bucket of decode batch sizes: 1, 2-3, 4-7, ...).
//!
//! - Acceptance: an EMA per position of the share of verified sequences that accepted at
//!   least `k + 1` drafts. Positions not measured recently are extrapolated from the last
//!   fresh one with an EMA of the conditional continuation ratio, so narrowing never freezes
//!   the estimate of deeper positions; every `probe_interval`-th step verifies the widest
//!   candidate to re-measure them.
//! - Cost: per bucket and width, an EMA of the step time; unmeasured widths are interpolated.
//! - Choice: every `update_interval` observations of a bucket, switch to the width with the
//!   best `(1 + Σ p_k) / t(w)` when it beats the current one by more than `margin`.
//! - Plain steps (spec-rs, opt-in with [`AdaptiveWidthController::with_plain_steps`]): width 0,
//!   a step that drafts and verifies nothing, competes as one more candidate worth exactly one
//!   token. Where the target is compute-bound (large batches on a CPU) verifying even one
//!   draft per row can cost more than it returns; MAX forbids 0 among the listed widths
//!   because a controller sitting at 0 would learn no acceptance, but the probe steps keep
//!   measuring it here, so the controller can always widen again. Two more rules keep what
//!   speculation costs on such batches small: a bucket seen for the first time starts from the
//!   nearest bucket's choice instead of the widest width, and probes are counted per bucket:
//!   every `probe_interval`-th step of a bucket probes it, and while the bucket sits at width 0
//!   each probe that leaves the choice unchanged doubles its interval (up to
//!   `MAX_PROBE_BACKOFF` times `probe_interval`) until the bucket switches. On a compute-bound
//!   CPU a probe of the widest width costs several plain steps, so a batch size settled on
//!   plain steps must not be probed again because some other batch size changed its mind.

use std::collections::{BTreeMap, HashMap};

use crate::error::ConfigError;

const FIELD: &str = "adaptive_speculative_widths";

/// The longest probe interval, as a multiple of `probe_interval`, while plain steps win.
pub const MAX_PROBE_BACKOFF: usize = 16;

/// Parses `"1,3,5"` or `"all"` into sorted distinct widths.
///
/// `limit` is `num_speculative_tokens` when known; block drafters learn it from the checkpoint,
/// so until then `"all"` expands to nothing and only syntax and `< 1` are checked.
pub fn parse_adaptive_widths(value: &str, limit: Option<usize>) -> Result<Vec<usize>, ConfigError> {
    let trimmed = value.trim();
    if trimmed.eq_ignore_ascii_case("all") {
        return Ok(limit.map(|k| (1..=k).collect()).unwrap_or_default());
    }
    let mut widths = Vec::new();
    let mut outside = Vec::new();
    for part in trimmed.split(',') {
        let part = part.trim();
        let w: i64 = part.parse().map_err(|_| {
            ConfigError::field(
                FIELD,
                format!(
                    "Could not read '{part}' as a verify width. Use a comma-separated list such as \"1,3,5\", or \"all\"."
                ),
            )
        })?;
        if w < 1 || limit.is_some_and(|k| w as usize > k) {
            outside.push(w);
        } else {
            widths.push(w as usize);
        }
    }
    if !outside.is_empty() {
        let bound = limit.map_or_else(|| "num_speculative_tokens".to_string(), |k| k.to_string());
        let listed: Vec<String> = outside.iter().map(i64::to_string).collect();
        return Err(ConfigError::field(FIELD, format!("Verify widths [{}] are outside 1..{bound}", listed.join(", "))));
    }
    widths.sort_unstable();
    widths.dedup();
    Ok(widths)
}

/// Power-of-two bucket of a decode batch size: 1 → 0, 2-3 → 1, 4-7 → 2, ...
pub fn batch_bucket(batch_size: usize) -> u32 {
    batch_size.max(1).ilog2()
}

/// Tuning constants of the controller.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdaptiveWidthParams {
    pub ema_alpha: f64,
    pub update_interval: usize,
    pub probe_interval: usize,
    pub margin: f64,
    pub min_batch_size: usize,
}

impl Default for AdaptiveWidthParams {
    fn default() -> Self {
        Self { ema_alpha: 0.2, update_interval: 5, probe_interval: 50, margin: 0.02, min_batch_size: 1 }
    }
}

/// A width change the controller made, for logging.
#[derive(Debug, Clone, PartialEq)]
pub struct WidthSwitch {
    pub bucket: u32,
    pub from: usize,
    pub to: usize,
    pub tokens_per_second_before: f64,
    pub tokens_per_second_after: f64,
}

impl WidthSwitch {
    /// The batch sizes the bucket covers, inclusive.
    pub fn batch_range(&self) -> (usize, usize) {
        (1usize << self.bucket, (1usize << (self.bucket + 1)) - 1)
    }
}

impl std::fmt::Display for WidthSwitch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (lo, hi) = self.batch_range();
        write!(
            f,
            "Verify width {} -> {} for decode batch sizes {lo}-{hi}: {:.1} -> {:.1} tokens per sequence per second.",
            self.from, self.to, self.tokens_per_second_before, self.tokens_per_second_after
        )
    }
}

#[derive(Debug, Clone)]
pub struct AdaptiveWidthController {
    widths: Vec<usize>,
    params: AdaptiveWidthParams,
    /// EMA of the share of verified sequences accepting at least `k + 1` drafts.
    accepted: Vec<f64>,
    /// Observations left before position `k` is considered stale.
    fresh_for: Vec<usize>,
    /// EMA of the conditional continuation ratio `P(accept k+1 | accept k)`.
    ratio: f64,
    chosen: HashMap<u32, usize>,
    step_times: HashMap<u32, BTreeMap<usize, f64>>,
    countdown: HashMap<u32, usize>,
    /// Steps to the next probe (MAX's global count, without plain steps).
    probe_countdown: usize,
    /// Width 0 (a plain step) is a candidate.
    plain_steps: bool,
    /// Steps of each bucket since its last probe (plain steps only).
    since_probe: HashMap<u32, usize>,
    /// Multiplier of `probe_interval` per bucket (plain steps only, 1 when absent): doubled by
    /// each probe that did not move the bucket off width 0, reset when the bucket switches.
    probe_backoff: HashMap<u32, usize>,
    /// A probe ran and its bucket's next choice has not been made yet.
    probed: Option<u32>,
}

impl AdaptiveWidthController {
    pub fn new(widths: Vec<usize>, params: AdaptiveWidthParams) -> Result<Self, ConfigError> {
        let mut widths = widths;
        widths.sort_unstable();
        widths.dedup();
        if widths.is_empty() {
            return Err(ConfigError::field(FIELD, "the adaptive controller needs at least one width"));
        }
        if widths[0] == 0 {
            // A step verifying nothing reports no acceptance, so the controller could never
            // widen again.
            return Err(ConfigError::field(FIELD, "adaptive verify widths must be >= 1"));
        }
        let widest = *widths.last().unwrap();
        Ok(Self {
            params,
            accepted: vec![0.0; widest],
            fresh_for: vec![0; widest],
            ratio: 1.0,
            chosen: HashMap::new(),
            step_times: HashMap::new(),
            countdown: HashMap::new(),
            probe_countdown: params.probe_interval,
            widths,
            plain_steps: false,
            since_probe: HashMap::new(),
            probe_backoff: HashMap::new(),
            probed: None,
        })
    }

    /// Lets the controller choose plain steps (width 0) for buckets where they are faster.
    pub fn with_plain_steps(mut self) -> Self {
        self.plain_steps = true;
        self
    }

    pub fn plain_steps(&self) -> bool {
        self.plain_steps
    }

    /// Widths a choice ranges over: the listed ones, plus 0 with plain steps on.
    fn candidates(&self) -> impl Iterator<Item = usize> + '_ {
        self.plain_steps.then_some(0).into_iter().chain(self.widths.iter().copied())
    }

    pub fn widths(&self) -> &[usize] {
        &self.widths
    }

    pub fn widest(&self) -> usize {
        *self.widths.last().unwrap()
    }

    pub fn params(&self) -> &AdaptiveWidthParams {
        &self.params
    }

    /// Widths that a step at this batch size may run: all candidates from
    /// `min_batch_size` up, only the widest below it (small batches are memory-bound, so
    /// narrowing them barely changes step cost).
    pub fn captured_widths(&self, batch_size: usize) -> Vec<usize> {
        if batch_size >= self.params.min_batch_size { self.candidates().collect() } else { vec![self.widest()] }
    }

    /// The width the next decode step at this batch size verifies. Call once per decode step.
    pub fn next_step_width(&mut self, batch_size: usize) -> usize {
        if self.probe_due(batch_bucket(batch_size)) {
            self.probed = Some(batch_bucket(batch_size));
            return self.widest();
        }
        let chosen = self.current(batch_bucket(batch_size));
        // A narrow choice for a batch below min_batch_size rounds up to a captured width.
        let captured = self.captured_widths(batch_size);
        captured.into_iter().find(|&w| w >= chosen).unwrap_or(self.widest())
    }

    /// Whether this step of `bucket` probes the widest width: every `probe_interval`-th step
    /// overall (MAX), or with plain steps every `probe_interval · backoff`-th step of the bucket.
    fn probe_due(&mut self, bucket: u32) -> bool {
        if !self.plain_steps {
            self.probe_countdown = self.probe_countdown.saturating_sub(1);
            if self.probe_countdown == 0 {
                self.probe_countdown = self.params.probe_interval;
                return true;
            }
            return false;
        }
        let interval = self.params.probe_interval * self.probe_backoff.get(&bucket).copied().unwrap_or(1);
        let since = self.since_probe.entry(bucket).or_insert(0);
        *since += 1;
        if *since >= interval {
            *since = 0;
            return true;
        }
        false
    }

    /// The width currently chosen for a bucket (widest until a switch).
    pub fn chosen_width(&self, batch_size: usize) -> usize {
        self.current(batch_bucket(batch_size))
    }

    /// A bucket's width: its own choice; else, with plain steps on, the choice of the nearest
    /// bucket that has one (step costs change smoothly with the batch size); else the widest.
    fn current(&self, bucket: u32) -> usize {
        if let Some(&w) = self.chosen.get(&bucket) {
            return w;
        }
        if self.plain_steps
            && let Some((_, &w)) = self.chosen.iter().min_by_key(|&(&b, _)| (b.abs_diff(bucket), b))
        {
            return w;
        }
        self.widest()
    }

    /// Records a decode step that verified `width` drafts per row.
    ///
    /// `accepted_per_position[k]` counts rows that accepted at least `k + 1` drafts;
    /// `step_time_s` is `None` for steps that must not be timed (e.g. synced early).
    /// Returns the switch made, if any.
    pub fn record_step(
        &mut self,
        batch_size: usize,
        width: usize,
        accepted_per_position: &[u64],
        num_verifications: u64,
        step_time_s: Option<f64>,
    ) -> Option<WidthSwitch> {
        if width == 0 && self.plain_steps {
            // A plain step teaches its cost only.
            return self.record_time(batch_size, 0, step_time_s);
        }
        if num_verifications == 0 || width == 0 {
            return None;
        }
        let alpha = self.params.ema_alpha;
        let width = width.min(self.accepted.len()).min(accepted_per_position.len());
        for f in &mut self.fresh_for {
            *f = f.saturating_sub(1);
        }
        let prior = self.acceptance_estimate();
        for k in 0..width {
            let observed = accepted_per_position[k] as f64 / num_verifications as f64;
            self.accepted[k] = alpha * observed + (1.0 - alpha) * prior[k];
            self.fresh_for[k] = self.params.update_interval;
        }
        if width >= 2 {
            let reached: u64 = accepted_per_position[..width - 1].iter().sum();
            if reached > 0 {
                let continued: u64 = accepted_per_position[1..width].iter().sum();
                let observed = continued as f64 / reached as f64;
                self.ratio = alpha * observed + (1.0 - alpha) * self.ratio;
            }
        }
        self.record_time(batch_size, width, step_time_s)
    }

    /// Folds a step time into its bucket and, every `update_interval` steps, re-chooses.
    fn record_time(&mut self, batch_size: usize, width: usize, step_time_s: Option<f64>) -> Option<WidthSwitch> {
        let alpha = self.params.ema_alpha;
        let bucket = batch_bucket(batch_size);
        if let Some(t) = step_time_s {
            let times = self.step_times.entry(bucket).or_default();
            times.entry(width).and_modify(|ema| *ema = alpha * t + (1.0 - alpha) * *ema).or_insert(t);
        }
        let interval = self.params.update_interval;
        let countdown = self.countdown.entry(bucket).or_insert(interval);
        *countdown = countdown.saturating_sub(1);
        if *countdown == 0 {
            *countdown = interval;
            return self.choose_width(bucket);
        }
        None
    }

    /// Estimated share of sequences accepting at least `k + 1` drafts, for `k < widest`.
    pub fn acceptance_estimate(&self) -> Vec<f64> {
        let mut out = Vec::with_capacity(self.accepted.len());
        let mut previous = 1.0f64;
        for k in 0..self.accepted.len() {
            let p = if self.fresh_for[k] > 0 { self.accepted[k] } else { previous * self.ratio.min(1.0) };
            out.push(p);
            previous = p;
        }
        out
    }

    /// Modelled step time of `width` in a bucket (relative units when untimed).
    pub fn step_time(&self, bucket: u32, width: usize) -> f64 {
        let Some(times) = self.step_times.get(&bucket).filter(|t| !t.is_empty()) else {
            return 1.0;
        };
        if let Some(&t) = times.get(&width) {
            return t;
        }
        let (&max_w, &max_t) = times.iter().next_back().unwrap();
        if width > max_w {
            // MAX: flat, the widest width is the first one a bucket measures. With plain steps
            // a bucket can start from a neighbour's plain steps and know only t(0): a flat
            // extrapolation would make every width look free and send it to the widest. Cost
            // in proportion to the positions verified instead (compute-bound, the pessimistic
            // side), so leaving plain steps waits for a probe's measurement.
            return if self.plain_steps { max_t * (width + 1) as f64 / (max_w + 1) as f64 } else { max_t };
        }
        let (&min_w, &min_t) = times.iter().next().unwrap();
        if width < min_w {
            return min_t * (width as f64 + 1.0) / (min_w as f64 + 1.0);
        }
        let (&lo_w, &lo_t) = times.range(..width).next_back().unwrap();
        let (&hi_w, &hi_t) = times.range(width..).next().unwrap();
        let frac = (width - lo_w) as f64 / (hi_w - lo_w) as f64;
        lo_t + frac * (hi_t - lo_t)
    }

    /// Expected tokens per sequence per second at `width` in a bucket.
    pub fn rate(&self, bucket: u32, width: usize, acceptance: &[f64]) -> f64 {
        let tokens = 1.0 + acceptance[..width.min(acceptance.len())].iter().sum::<f64>();
        tokens / self.step_time(bucket, width)
    }

    fn choose_width(&mut self, bucket: u32) -> Option<WidthSwitch> {
        let bucket_max = (1usize << (bucket + 1)) - 1;
        if bucket_max < self.params.min_batch_size {
            return None;
        }
        let p = self.acceptance_estimate();
        let current = self.current(bucket);
        let probed = self.probed.take_if(|&mut b| b == bucket).is_some();
        let current_rate = self.rate(bucket, current, &p);
        let mut best = current;
        let mut best_rate = current_rate;
        for w in self.candidates() {
            let r = self.rate(bucket, w, &p);
            if r > best_rate {
                best = w;
                best_rate = r;
            }
        }
        if best != current && best_rate > current_rate * (1.0 + self.params.margin) {
            self.chosen.insert(bucket, best);
            self.probe_backoff.remove(&bucket);
            let switch = WidthSwitch {
                bucket,
                from: current,
                to: best,
                tokens_per_second_before: current_rate,
                tokens_per_second_after: best_rate,
            };
            tracing::info!("{switch}");
            return Some(switch);
        }
        if probed && current == 0 && self.plain_steps {
            // The probe confirmed plain steps: look at this bucket again less often.
            let backoff = self.probe_backoff.entry(bucket).or_insert(1);
            *backoff = (*backoff * 2).min(MAX_PROBE_BACKOFF);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_lists_all_and_errors() {
        assert_eq!(parse_adaptive_widths("5, 1,3,3", Some(5)).unwrap(), vec![1, 3, 5]);
        assert_eq!(parse_adaptive_widths("all", Some(3)).unwrap(), vec![1, 2, 3]);
        assert_eq!(parse_adaptive_widths("ALL", None).unwrap(), Vec::<usize>::new());
        let e = parse_adaptive_widths("1,x", Some(3)).unwrap_err().message;
        assert!(e.contains("Could not read 'x' as a verify width"), "{e}");
        let e = parse_adaptive_widths("0,2,7", Some(5)).unwrap_err().message;
        assert_eq!(e, "Verify widths [0, 7] are outside 1..5");
        let e = parse_adaptive_widths("0", None).unwrap_err().message;
        assert!(e.contains("outside 1..num_speculative_tokens"), "{e}");
        assert_eq!(parse_adaptive_widths("9", None).unwrap(), vec![9]);
    }

    #[test]
    fn buckets_are_powers_of_two() {
        let b: Vec<u32> = [0, 1, 2, 3, 4, 7, 8, 15, 16].iter().map(|&x| batch_bucket(x)).collect();
        assert_eq!(b, vec![0, 0, 1, 1, 2, 2, 3, 3, 4]);
    }

    #[test]
    fn untimed_controller_keeps_widest_and_probes() {
        let mut c = AdaptiveWidthController::new(vec![1, 2, 4], AdaptiveWidthParams::default()).unwrap();
        for _ in 0..100 {
            assert_eq!(c.next_step_width(8), 4);
        }
    }

    #[test]
    fn step_time_interpolates_and_extrapolates() {
        let mut c = AdaptiveWidthController::new(vec![1, 2, 3, 4], AdaptiveWidthParams::default()).unwrap();
        c.record_step(4, 2, &[4, 2], 4, Some(2.0));
        c.record_step(4, 4, &[4, 2, 1, 0], 4, Some(4.0));
        let b = batch_bucket(4);
        assert_eq!(c.step_time(b, 2), 2.0);
        assert_eq!(c.step_time(b, 3), 3.0);
        assert!((c.step_time(b, 1) - 2.0 * 2.0 / 3.0).abs() < 1e-12);
        assert_eq!(c.step_time(b, 9), 4.0);
        assert_eq!(c.step_time(batch_bucket(64), 3), 1.0);
    }

    #[test]
    fn with_plain_steps_widths_beyond_the_measured_ones_cost_in_proportion_to_positions() {
        let mut c =
            AdaptiveWidthController::new(vec![1, 2, 3], AdaptiveWidthParams::default()).unwrap().with_plain_steps();
        c.record_step(32, 0, &[], 0, Some(2.0));
        let b = batch_bucket(32);
        assert_eq!(c.step_time(b, 0), 2.0);
        assert_eq!(c.step_time(b, 1), 4.0);
        assert_eq!(c.step_time(b, 3), 8.0);
    }

    #[test]
    fn a_bucket_inheriting_plain_steps_stays_plain_until_a_probe_measures_verification() {
        let mut c =
            AdaptiveWidthController::new(vec![1, 2, 3], AdaptiveWidthParams::default()).unwrap().with_plain_steps();
        let compute_bound = |w: usize| (w + 1) as f64;
        simulate(&mut c, 32, 100, &ACCEPT, compute_bound);
        assert_eq!(c.chosen_width(32), 0);
        // Batch 20 starts from bucket 5's plain steps and measures only t(0) before its first
        // probe: that alone must not send it to verify widths it has never timed.
        let ran = simulate(&mut c, 20, 49, &ACCEPT, compute_bound);
        assert!(ran.iter().all(|&w| w == 0), "{ran:?}");
    }

    /// Runs `steps` decode steps of `batch` rows against a modelled target: each row accepts
    /// at least `k + 1` drafts with probability `accept[k]`, and a step verifying `w` costs
    /// `cost(w)`. Returns the widths the steps ran.
    fn simulate(
        c: &mut AdaptiveWidthController,
        batch: usize,
        steps: usize,
        accept: &[f64],
        cost: impl Fn(usize) -> f64,
    ) -> Vec<usize> {
        let mut ran = Vec::new();
        for _ in 0..steps {
            let w = c.next_step_width(batch);
            let apc: Vec<u64> = accept[..w].iter().map(|p| (p * batch as f64).round() as u64).collect();
            let verifications = if w > 0 { batch as u64 } else { 0 };
            c.record_step(batch, w, &apc, verifications, Some(cost(w)));
            ran.push(w);
        }
        ran
    }

    const ACCEPT: [f64; 3] = [0.6, 0.4, 0.25];

    #[test]
    fn plain_steps_win_where_verification_is_compute_bound() {
        let mut c =
            AdaptiveWidthController::new(vec![1, 2, 3], AdaptiveWidthParams::default()).unwrap().with_plain_steps();
        // Compute-bound: every verified position costs as much as the committed one.
        let ran = simulate(&mut c, 32, 300, &ACCEPT, |w| (w + 1) as f64);
        assert_eq!(c.chosen_width(32), 0);
        let tail = &ran[100..];
        let plain = tail.iter().filter(|&&w| w == 0).count();
        assert!(plain as f64 >= 0.95 * tail.len() as f64, "{plain} of {} steps plain", tail.len());
        // Probes keep measuring the widest width, so acceptance never goes stale for good.
        assert!(tail.contains(&3));
    }

    #[test]
    fn memory_bound_batches_keep_speculating_after_trying_plain_steps() {
        let mut c =
            AdaptiveWidthController::new(vec![1, 2, 3], AdaptiveWidthParams::default()).unwrap().with_plain_steps();
        // Memory-bound: verifying more positions costs little.
        let ran = simulate(&mut c, 20, 300, &ACCEPT, |w| 1.0 + 0.05 * w as f64);
        assert_eq!(c.chosen_width(20), 3);
        assert!(ran[100..].iter().all(|&w| w == 3));
    }

    #[test]
    fn probes_back_off_while_plain_steps_keep_winning_and_reset_on_a_switch() {
        let mut c =
            AdaptiveWidthController::new(vec![1, 2, 3], AdaptiveWidthParams::default()).unwrap().with_plain_steps();
        let compute_bound = |w: usize| (w + 1) as f64;
        let ran = simulate(&mut c, 32, 2000, &ACCEPT, compute_bound);
        let probes_late = ran[1000..].iter().filter(|&&w| w == 3).count();
        // Without backoff, 1000 steps would hold 20 probes of the widest width.
        assert!(probes_late <= 2, "{probes_late} probes in the last 1000 steps");
        assert!(probes_late >= 1, "probes never stop altogether");
        // Verification becomes cheap (memory-bound): a probe finds it and the controller leaves
        // plain steps, then widens step by step as it measures each width.
        let cheap = |w: usize| 1.0 + 0.05 * w as f64;
        simulate(&mut c, 32, 2500, &ACCEPT, cheap);
        assert_ne!(c.chosen_width(32), 0);
        let ran = simulate(&mut c, 32, 2000, &ACCEPT, cheap);
        assert_eq!(c.chosen_width(32), 3);
        assert!(ran[1000..].iter().all(|&w| w == 3));
    }

    #[test]
    fn switches_in_another_bucket_do_not_bring_back_probes_of_a_plain_bucket() {
        let mut c =
            AdaptiveWidthController::new(vec![1, 2, 3], AdaptiveWidthParams::default()).unwrap().with_plain_steps();
        let compute_bound = |w: usize| (w + 1) as f64;
        let cheap = |w: usize| 1.0 + 0.05 * w as f64;
        simulate(&mut c, 32, 2000, &ACCEPT, compute_bound);
        assert_eq!(c.chosen_width(32), 0);
        // Batch 1 keeps changing its mind (its step cost flips every 60 of its steps), while
        // batch 32 stays compute-bound; the two alternate step by step.
        let mut at_32 = Vec::new();
        let mut switches_at_1 = 0;
        for i in 0..3000 {
            let before = c.chosen_width(1);
            let cost_1 = if (i / 60) % 2 == 0 { cheap } else { compute_bound };
            simulate(&mut c, 1, 1, &ACCEPT, cost_1);
            switches_at_1 += usize::from(c.chosen_width(1) != before);
            at_32.extend(simulate(&mut c, 32, 1, &ACCEPT, compute_bound));
        }
        assert!(switches_at_1 >= 3, "batch 1 switched {switches_at_1} times");
        let probes = at_32.iter().filter(|&&w| w == 3).count();
        // At the longest interval (16 × 50 steps) 3000 steps hold 3-4 probes; reset on every
        // switch at batch 1 they would hold dozens.
        assert!(probes <= 4, "{probes} probes of batch 32 in 3000 of its steps");
        assert_eq!(c.chosen_width(32), 0);
    }

    #[test]
    fn a_new_bucket_starts_from_its_nearest_neighbours_choice_with_plain_steps() {
        let mut c =
            AdaptiveWidthController::new(vec![1, 2, 3], AdaptiveWidthParams::default()).unwrap().with_plain_steps();
        simulate(&mut c, 32, 100, &ACCEPT, |w| (w + 1) as f64);
        assert_eq!(c.chosen_width(32), 0);
        // Batch 20 (bucket 4) was never seen: it starts at bucket 5's plain steps, not at 3.
        assert_eq!(c.chosen_width(20), 0);
        assert_eq!(c.next_step_width(20), 0);
        // Without plain steps an unseen bucket starts at the widest width, as in MAX.
        let mut m = AdaptiveWidthController::new(vec![1, 2, 3], AdaptiveWidthParams::default()).unwrap();
        simulate(&mut m, 32, 100, &ACCEPT, |w| (w + 1) as f64);
        assert_eq!(m.chosen_width(32), 1);
        assert_eq!(m.chosen_width(20), 3);
    }

    #[test]
    fn without_plain_steps_the_narrowest_listed_width_is_the_floor() {
        let mut c = AdaptiveWidthController::new(vec![1, 2, 3], AdaptiveWidthParams::default()).unwrap();
        let ran = simulate(&mut c, 32, 300, &ACCEPT, |w| (w + 1) as f64);
        assert!(ran.iter().all(|&w| w >= 1));
        assert_eq!(c.chosen_width(32), 1);
    }
}
