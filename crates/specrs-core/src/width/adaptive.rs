//! The throughput-driven adaptive verify-width controller (`adaptive_speculative_widths`).
//!
//! Goal: pick the verify width that maximises accepted tokens per second. Acceptance depends
//! on the traffic (one global estimate; with plain steps, also one per bucket, see below); step
//! cost depends on the batch size (one estimate per power-of-two bucket of decode batch sizes:
//! 1, 2-3, 4-7, ...).
//!
//! - Acceptance: per position, the share of verified sequences that accepted at least `k + 1`
//!   drafts, over recent rows (MAX averages per step; here older rows fade by `1 − ema_alpha`
//!   per 8 rows verified, so a one-row step weighs an eighth of an 8-row one and the first
//!   observation replaces the optimistic start). Positions not measured recently are
//!   extrapolated from the last fresh one with the conditional continuation ratio, so narrowing
//!   never freezes the estimate of deeper positions; every `probe_interval`-th step verifies
//!   the widest candidate to re-measure them.
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
//!   nearest bucket's choice (among buckets on the same side of `PARTIAL_PROBE_MIN_BATCH`
//!   rows) instead of the widest width, and probes are counted per bucket:
//!   every `probe_interval`-th step of a bucket probes it, and while the bucket sits at width 0
//!   each probe that leaves the choice unchanged doubles its interval (up to
//!   `MAX_PROBE_BACKOFF` times `probe_interval`) until the bucket switches. On a compute-bound
//!   CPU a probe of the widest width costs several plain steps, so a batch size settled on
//!   plain steps must not be probed again because some other batch size changed its mind.
//! - Partial probes (plain steps only): a bucket of at least [`PARTIAL_PROBE_MIN_BATCH`] rows
//!   that sits at width 0 probes with a quarter of its rows drafting, and scales what they
//!   added to the step to the whole batch (`t(0) + B / r · (t_probe − t(0))`, exact where
//!   verification is compute-bound, pessimistic where it is not). A full probe there pays the
//!   widest verify and the drafter's catch-up of every row; a quarter of that is enough to learn
//!   the cost. A bucket at plain steps that has never timed verification probes after
//!   `update_interval` plain steps (after a whole backed-off probe interval where a smaller
//!   bucket of partial probes timed verification and chose plain steps: speculation pays less
//!   the larger the batch), and a large bucket with nothing to start from starts at plain
//!   steps, not at the widest width. A switch is re-checked after one step at its new
//!   width, and the first time measured with every row verifying replaces a scaled one. A
//!   bucket at plain steps leaves them only for a width timed within the last `probe_interval`
//!   steps: with the confidence cut a narrower width's cost is not in proportion to the width,
//!   so an interpolated one misleads, and an old one may be another batch size's. A verify time
//!   older than that is replaced by the next measurement, not averaged with it; a bucket whose
//!   verify time aged out keeps its probe backoff rather than probing as if never timed.
//!   A large bucket verifying at its chosen width is judged on every full step by that step's
//!   own time, and returns to plain steps at the first one slower than a plain step; a return
//!   within `probe_interval` steps of leaving keeps (doubles) the probe backoff. The plain step
//!   time of a bucket is the lower median of its last five plain steps, not an average: the
//!   baseline must follow the batch size running now and ignore the slow step after rows
//!   finish. Leaving plain steps first feeds the drafter every position its rows kept
//!   through them (the catch-up, timed apart from step times); the latest probe's catch-up,
//!   scaled to the batch, is charged against the switch over the `probe_interval` steps it
//!   has to prove itself in, so a width only a few percent faster does not pay a catch-up it
//!   cannot earn back.
//! - Acceptance per bucket (plain steps only): a bucket chooses by the acceptance of its own
//!   verified rows once it has some, drawn toward the global estimate by one observation's
//!   worth of rows (a partial probe of 2 rows is a small sample), and by the global estimate
//!   until then. Traffic differs between batch sizes: a single stream quoting its prompt
//!   accepts far more than a batch of 32 fresh answers, and small batches copy lookup drafts
//!   past the width. With one estimate, a large bucket at plain steps left them on a single
//!   stream's acceptance, and on a CPU, where a verified position there costs about a row,
//!   paid for full verify steps until its own rows had pulled the shared estimate down.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use crate::error::ConfigError;

const FIELD: &str = "adaptive_speculative_widths";

/// The longest probe interval, as a multiple of `probe_interval`, while plain steps win.
pub const MAX_PROBE_BACKOFF: usize = 16;

/// The smallest decode batch that probes with part of its rows (plain steps only).
pub const PARTIAL_PROBE_MIN_BATCH: usize = 4;

/// A partial probe drafts for `1 / PARTIAL_PROBE_SHARE` of the rows (rounded up).
const PARTIAL_PROBE_SHARE: usize = 4;

/// With plain steps, a bucket's plain step time is the median of its last this many.
const RECENT_PLAIN_STEPS: usize = 5;

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
    /// The acceptance estimate the choice used (share accepting at least `k + 1` drafts).
    pub acceptance: Vec<f64>,
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
        let acceptance: Vec<String> = self.acceptance.iter().map(|p| format!("{p:.2}")).collect();
        write!(
            f,
            "Verify width {} -> {} for decode batch sizes {lo}-{hi}: {:.1} -> {:.1} tokens per sequence per second \
             (acceptance by position [{}]).",
            self.from,
            self.to,
            self.tokens_per_second_before,
            self.tokens_per_second_after,
            acceptance.join(", ")
        )
    }
}

/// Rows of verification that count as one observation of MAX's per-step average: the
/// acceptance estimates fade by `1 - ema_alpha` per this many rows verified, so a step of one
/// row moves them little and a step of 32 rows a lot (per step, a lone row's 0-or-1 outcome
/// would swing them as much as a full batch's average).
const ROWS_PER_OBSERVATION: f64 = 8.0;

/// An exponentially weighted share `hits / trials`; no estimate before the first trial (MAX's
/// per-step average started from the prior instead, so a first probe of a few rows left the
/// optimistic start mostly in place).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct DecayedShare {
    hits: f64,
    trials: f64,
}

impl DecayedShare {
    fn scale(&mut self, decay: f64) {
        self.hits *= decay;
        self.trials *= decay;
    }

    fn add(&mut self, hits: f64, trials: f64) {
        self.hits += hits;
        self.trials += trials;
    }

    fn mean(&self) -> Option<f64> {
        (self.trials > 1e-9).then(|| self.hits / self.trials)
    }

    /// The share with `prior` counted as `weight` more trials.
    fn mean_toward(&self, prior: f64, weight: f64) -> f64 {
        (self.hits + weight * prior) / (self.trials + weight)
    }
}

/// Per position, the share of verified sequences accepting at least `k + 1` drafts, recent
/// rows weighted most, with the continuation ratio that extrapolates stale positions.
#[derive(Debug, Clone)]
struct AcceptanceEstimate {
    accepted: Vec<DecayedShare>,
    /// Observations left before position `k` is considered stale.
    fresh_for: Vec<usize>,
    /// The conditional continuation ratio `P(accept k+1 | accept k)`, recent rows weighted most.
    ratio: DecayedShare,
}

impl AcceptanceEstimate {
    fn new(widest: usize) -> Self {
        Self {
            accepted: vec![DecayedShare::default(); widest],
            fresh_for: vec![0; widest],
            ratio: DecayedShare::default(),
        }
    }

    fn is_measured(&self) -> bool {
        self.accepted.first().is_some_and(|a| a.mean().is_some())
    }

    /// Folds in one step's `rows` verified sequences at `width` (`width <= widest`).
    fn observe(&mut self, accepted_per_position: &[u64], rows: u64, width: usize, params: &AdaptiveWidthParams) {
        for f in &mut self.fresh_for {
            *f = f.saturating_sub(1);
        }
        // Older rows fade by `1 - ema_alpha` per `ROWS_PER_OBSERVATION` rows verified since.
        let n = rows as f64;
        let decay = (1.0 - params.ema_alpha).powf(n / ROWS_PER_OBSERVATION);
        for a in &mut self.accepted {
            a.scale(decay);
        }
        for ((share, fresh), &hits) in
            self.accepted.iter_mut().zip(&mut self.fresh_for).zip(accepted_per_position).take(width)
        {
            share.add(hits as f64, n);
            *fresh = params.update_interval;
        }
        if width >= 2 {
            let reached: u64 = accepted_per_position[..width - 1].iter().sum();
            let continued: u64 = accepted_per_position[1..width].iter().sum();
            self.ratio.scale(decay);
            self.ratio.add(continued as f64, reached as f64);
        }
    }

    fn estimate(&self) -> Vec<f64> {
        self.estimate_with(|_, share| share.mean(), self.ratio.mean().unwrap_or(1.0))
    }

    /// The estimate with `prior`'s shares and continuation ratio counted as `weight` more rows
    /// at every position (a few rows of its own then move it only part of the way).
    fn estimate_toward(&self, prior: &AcceptanceEstimate, weight: f64) -> Vec<f64> {
        let prior_shares = prior.estimate();
        let ratio = self.ratio.mean_toward(prior.ratio.mean().unwrap_or(1.0), weight);
        self.estimate_with(|k, share| Some(share.mean_toward(prior_shares[k], weight)), ratio)
    }

    /// Per position, `share_of` where the position is fresh, else the previous position's
    /// estimate times `ratio`; never above the previous position's (a row that accepted `k + 1`
    /// drafts accepted `k`), which separately drawn positions could otherwise be.
    fn estimate_with(&self, share_of: impl Fn(usize, &DecayedShare) -> Option<f64>, ratio: f64) -> Vec<f64> {
        let mut out = Vec::with_capacity(self.accepted.len());
        let mut previous = 1.0f64;
        let ratio = ratio.min(1.0);
        for (k, (share, &fresh)) in self.accepted.iter().zip(&self.fresh_for).enumerate() {
            let p = match share_of(k, share) {
                Some(p) if fresh > 0 => p.min(previous),
                _ => previous * ratio,
            };
            out.push(p);
            previous = p;
        }
        out
    }
}

#[derive(Debug, Clone)]
pub struct AdaptiveWidthController {
    widths: Vec<usize>,
    params: AdaptiveWidthParams,
    /// Acceptance over every verified row (MAX's one estimate).
    acceptance: AcceptanceEstimate,
    /// Acceptance over each bucket's own verified rows (plain steps only): what a bucket
    /// chooses by once it has verified rows itself.
    bucket_acceptance: HashMap<u32, AcceptanceEstimate>,
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
    /// The probe just planned drafts for only this many rows of its bucket.
    partial_probe: Option<(u32, usize)>,
    /// Step times (bucket, width) last set from a partial probe, scaled to the whole batch.
    scaled: HashSet<(u32, usize)>,
    /// Steps recorded (every batch size), and that count when each bucket's width was last
    /// timed (plain steps only).
    steps: usize,
    timed_at: HashMap<(u32, usize), usize>,
    /// Buckets that have timed a verify step (plain steps only). Kept apart from `step_times`,
    /// whose verify times age out: a bucket whose time aged out has verified before and
    /// probes on its backed-off schedule, not at once like a bucket that never did.
    verified: HashSet<u32>,
    /// When each bucket last left plain steps (step count) and its probe backoff then.
    left_plain: HashMap<u32, (usize, usize)>,
    /// Each bucket's latest plain step times (plain steps only).
    recent_plain: HashMap<u32, VecDeque<f64>>,
    /// What leaving plain steps would cost each bucket up front (seconds): the drafter's
    /// catch-up of its latest probe, scaled to the whole batch (plain steps only).
    switch_cost: HashMap<u32, f64>,
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
            acceptance: AcceptanceEstimate::new(widest),
            bucket_acceptance: HashMap::new(),
            chosen: HashMap::new(),
            step_times: HashMap::new(),
            countdown: HashMap::new(),
            probe_countdown: params.probe_interval,
            widths,
            plain_steps: false,
            since_probe: HashMap::new(),
            probe_backoff: HashMap::new(),
            probed: None,
            partial_probe: None,
            scaled: HashSet::new(),
            steps: 0,
            timed_at: HashMap::new(),
            verified: HashSet::new(),
            left_plain: HashMap::new(),
            recent_plain: HashMap::new(),
            switch_cost: HashMap::new(),
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
        let bucket = batch_bucket(batch_size);
        if self.probe_due(bucket) {
            self.probed = Some(bucket);
            self.partial_probe = self.partial_probe_rows(batch_size).map(|rows| (bucket, rows));
            return self.widest();
        }
        self.partial_probe = None;
        let chosen = self.current(batch_bucket(batch_size));
        // A narrow choice for a batch below min_batch_size rounds up to a captured width.
        let captured = self.captured_widths(batch_size);
        captured.into_iter().find(|&w| w >= chosen).unwrap_or(self.widest())
    }

    /// Rows that draft in the probe [`Self::next_step_width`] just returned, when it drafts for
    /// only part of the batch; `None` for a full probe or no probe.
    pub fn probe_rows(&self) -> Option<usize> {
        self.partial_probe.map(|(_, rows)| rows)
    }

    /// Rows a probe of this batch drafts for when only part of them should: a batch of at
    /// least `PARTIAL_PROBE_MIN_BATCH` rows sitting at plain steps, with a timed plain step to
    /// scale the probe from.
    fn partial_probe_rows(&self, batch_size: usize) -> Option<usize> {
        let bucket = batch_bucket(batch_size);
        let plain_timed = self.step_times.get(&bucket).is_some_and(|t| t.contains_key(&0));
        (self.plain_steps && batch_size >= PARTIAL_PROBE_MIN_BATCH && self.current(bucket) == 0 && plain_timed)
            .then(|| batch_size.div_ceil(PARTIAL_PROBE_SHARE))
    }

    /// Whether this step of `bucket` probes the widest width: every `probe_interval`-th step
    /// overall (MAX), or with plain steps every `probe_interval · backoff`-th step of the bucket,
    /// and at once when a bucket at plain steps has timed them but never timed verification.
    fn probe_due(&mut self, bucket: u32) -> bool {
        if !self.plain_steps {
            self.probe_countdown = self.probe_countdown.saturating_sub(1);
            if self.probe_countdown == 0 {
                self.probe_countdown = self.params.probe_interval;
                return true;
            }
            return false;
        }
        let plain_timed = self.step_times.get(&bucket).is_some_and(|t| t.contains_key(&0));
        let never_verified = plain_timed && !self.verified.contains(&bucket) && self.current(bucket) == 0;
        let interval = if never_verified {
            match self.smaller_buckets_plain_verdict(bucket) {
                // A smaller batch already found verification not worth it.
                Some(backoff) => self.params.probe_interval * backoff,
                // Time plain steps for a few steps (the probe is scaled from them), then probe.
                None => self.params.update_interval,
            }
        } else {
            self.params.probe_interval * self.probe_backoff.get(&bucket).copied().unwrap_or(1)
        };
        let since = self.since_probe.entry(bucket).or_insert(0);
        *since += 1;
        if *since >= interval {
            *since = 0;
            return true;
        }
        false
    }

    /// The probe backoff of the nearest smaller bucket of partial probes, when that bucket
    /// has timed verification and chose plain steps over it. Speculation pays less the larger
    /// the batch (each verified position costs more of a step as the target turns
    /// compute-bound), so a larger bucket that has never verified waits as long as that one
    /// before its first probe instead of probing within `update_interval` steps: on a CPU the
    /// first call at a new large batch size otherwise paid a probe (and the drafter's catch-up
    /// of its rows) for every bucket its shrinking batch passed through.
    fn smaller_buckets_plain_verdict(&self, bucket: u32) -> Option<usize> {
        let large = |b: u32| (1usize << b) >= PARTIAL_PROBE_MIN_BATCH;
        let nearest = self.verified.iter().copied().filter(|&b| b < bucket && large(b)).max()?;
        (self.chosen.get(&nearest) == Some(&0)).then(|| self.probe_backoff.get(&nearest).copied().unwrap_or(1))
    }

    /// The width currently chosen for a bucket (widest until a switch).
    pub fn chosen_width(&self, batch_size: usize) -> usize {
        self.current(batch_bucket(batch_size))
    }

    /// A bucket's width: its own choice; else, with plain steps on, the choice of the nearest
    /// bucket on the same side of `PARTIAL_PROBE_MIN_BATCH` that has one (step costs change
    /// smoothly with the batch size, but what a single stream chose says little about a large
    /// batch), or plain steps for a bucket of partial probes (it learns its verify cost from a
    /// quarter of its rows rather than from full steps at a width it never timed); else the
    /// widest.
    fn current(&self, bucket: u32) -> usize {
        if let Some(&w) = self.chosen.get(&bucket) {
            return w;
        }
        if self.plain_steps {
            let large = |b: u32| (1usize << b) >= PARTIAL_PROBE_MIN_BATCH;
            let nearest = self
                .chosen
                .iter()
                .filter(|&(&b, _)| large(b) == large(bucket))
                .min_by_key(|&(&b, _)| (b.abs_diff(bucket), b));
            if let Some((_, &w)) = nearest {
                return w;
            }
            if large(bucket) {
                return 0;
            }
        }
        self.widest()
    }

    /// Records the drafter's catch-up before a decode step of `batch_size` rows: the
    /// positions its rows kept through plain steps, fed before it drafted for this step. Call
    /// before [`Self::record_step`] of the same step. A probe's catch-up, scaled to the batch
    /// like its verify time, is what leaving plain steps would cost the bucket up front.
    pub fn record_catch_up(&mut self, batch_size: usize, seconds: f64) {
        let bucket = batch_bucket(batch_size);
        if !self.plain_steps || self.probed != Some(bucket) || seconds.is_nan() || seconds <= 0.0 {
            return;
        }
        let scale = match self.partial_probe {
            Some((b, rows)) if b == bucket && rows > 0 => batch_size as f64 / rows as f64,
            _ => 1.0,
        };
        self.switch_cost.insert(bucket, seconds * scale);
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
            return self.record_time(batch_size, 0, step_time_s, false);
        }
        let bucket = batch_bucket(batch_size);
        let partial = self.partial_probe.take().is_some_and(|(b, _)| b == bucket)
            && num_verifications > 0
            && (num_verifications as usize) < batch_size;
        let step_time_s = match step_time_s {
            Some(t) if partial => self.scale_partial_probe(bucket, batch_size, num_verifications as usize, t),
            t => t,
        };
        if num_verifications == 0 || width == 0 {
            return None;
        }
        let width = width.min(self.widest()).min(accepted_per_position.len());
        self.acceptance.observe(accepted_per_position, num_verifications, width, &self.params);
        if self.plain_steps {
            let widest = self.widest();
            self.bucket_acceptance.entry(bucket).or_insert_with(|| AcceptanceEstimate::new(widest)).observe(
                accepted_per_position,
                num_verifications,
                width,
                &self.params,
            );
        }
        self.record_time(batch_size, width, step_time_s, partial)
    }

    /// The time a step of `batch_size` rows would have taken with all of them verifying, from
    /// a probe where `rows` of them did: the plain step time plus what those rows added, scaled
    /// to the batch. `None` (untimed) without a plain step time to scale from.
    fn scale_partial_probe(&self, bucket: u32, batch_size: usize, rows: usize, t: f64) -> Option<f64> {
        let plain = *self.step_times.get(&bucket)?.get(&0)?;
        Some(plain + (t - plain).max(0.0) * batch_size as f64 / rows as f64)
    }

    /// Folds a step time into its bucket (`scaled`: from a partial probe) and, every
    /// `update_interval` steps, re-chooses.
    ///
    /// With plain steps, a width last timed more than `probe_interval` steps ago (steps of any
    /// batch size) takes the new time as it is: the average is for smoothing consecutive
    /// steps, and a time from hundreds of steps back (a probe's, or one a bucket is switching
    /// back to) may come from other rows, other traffic or a quieter machine. Averaged in, a
    /// cheap old time makes verification look cheap for several full steps after a switch. The
    /// bucket's other verify times that old are dropped with it.
    fn record_time(
        &mut self,
        batch_size: usize,
        width: usize,
        step_time_s: Option<f64>,
        scaled: bool,
    ) -> Option<WidthSwitch> {
        let alpha = self.params.ema_alpha;
        let bucket = batch_bucket(batch_size);
        self.steps += 1;
        let step = self.steps;
        if let Some(t) = step_time_s {
            if width > 0 {
                self.verified.insert(bucket);
            }
            let times = self.step_times.entry(bucket).or_default();
            if scaled {
                self.scaled.insert((bucket, width));
            }
            let stale = self.plain_steps
                && self.timed_at.insert((bucket, width), step).is_some_and(|at| step - at > self.params.probe_interval);
            // The first time measured with every row verifying replaces one scaled from a
            // partial probe.
            let replaces_scaled = !scaled && self.scaled.remove(&(bucket, width));
            if stale {
                // The bucket's other old verify times come from the same past: interpolating
                // between fresh ones is closer to today. The plain step time stays, however
                // old: without it plain steps would be extrapolated as nearly free.
                times.retain(|&w, _| {
                    w == 0 || self.timed_at.get(&(bucket, w)).is_some_and(|&at| step - at <= self.params.probe_interval)
                });
            }
            if stale || replaces_scaled {
                times.insert(width, t);
            } else {
                times.entry(width).and_modify(|ema| *ema = alpha * t + (1.0 - alpha) * *ema).or_insert(t);
            }
            if self.plain_steps && width == 0 {
                // Plain steps are the baseline every width is judged against, and an average
                // is the wrong summary of them: the step after rows finish can take half as
                // long again, and a bucket spans batch sizes up to twice apart, so a mean that
                // still holds either made plain steps look 25% dearer than they were and sent
                // batch 29 to verify at a loss. The median of the latest few tracks the rows
                // running now and ignores a lone slow step.
                let recent = self.recent_plain.entry(bucket).or_default();
                recent.push_back(t);
                if recent.len() > RECENT_PLAIN_STEPS {
                    recent.pop_front();
                }
                let mut sorted: Vec<f64> = recent.iter().copied().collect();
                sorted.sort_by(f64::total_cmp);
                // The lower median: between two, the cheaper plain step (the safe side).
                times.insert(0, sorted[(sorted.len() - 1) / 2]);
            }
        }
        if let (Some(t), false) = (step_time_s, scaled)
            && let Some(switch) = self.judge_full_step(bucket, width, t)
        {
            return Some(switch);
        }
        // With plain steps a probe's bucket re-chooses at once: it may leave plain steps.
        let probed = self.plain_steps && width == self.widest() && self.probed == Some(bucket);
        let interval = self.params.update_interval;
        let countdown = self.countdown.entry(bucket).or_insert(interval);
        *countdown = countdown.saturating_sub(1);
        if *countdown == 0 || probed {
            *countdown = interval;
            return self.choose_width(bucket);
        }
        None
    }

    /// With plain steps, a bucket of partial probes (a large batch) that verifies at its chosen
    /// width is judged on every full step by that step's own time: one slower than a plain
    /// step (by the margin) sends it back to plain steps at once. Averaged, one cheap time
    /// from a quiet moment of the machine, the one that let the bucket leave plain steps,
    /// kept it verifying for several steps that each cost more than they returned; where
    /// the target is compute-bound those are the steps that make speculation slower than
    /// plain decoding.
    fn judge_full_step(&mut self, bucket: u32, width: usize, t: f64) -> Option<WidthSwitch> {
        let large = (1usize << bucket) >= PARTIAL_PROBE_MIN_BATCH;
        if !self.plain_steps || !large || width == 0 || self.chosen.get(&bucket) != Some(&width) {
            return None;
        }
        let plain = *self.step_times.get(&bucket)?.get(&0)?;
        let p = self.acceptance_for(bucket);
        let tokens = 1.0 + p[..width.min(p.len())].iter().sum::<f64>();
        let (this_step, plain_rate) = (tokens / t, 1.0 / plain);
        if this_step * (1.0 + self.params.margin) >= plain_rate {
            return None;
        }
        // This step's time is the width's time from now on: the average it was folded into
        // is what misjudged it.
        self.step_times.entry(bucket).or_default().insert(width, t);
        self.countdown.insert(bucket, self.params.update_interval);
        Some(self.switch(bucket, width, 0, this_step, plain_rate, p))
    }

    /// Makes a switch: records the choice and what the bucket's probes do next.
    fn switch(&mut self, bucket: u32, from: usize, to: usize, before: f64, after: f64, p: Vec<f64>) -> WidthSwitch {
        self.chosen.insert(bucket, to);
        if from == 0 {
            let backoff = self.probe_backoff.remove(&bucket).unwrap_or(1);
            self.left_plain.insert(bucket, (self.steps, backoff));
        } else if to == 0
            && let Some((at, backoff)) = self.left_plain.remove(&bucket)
            && self.steps - at <= self.params.probe_interval
        {
            // Back within one probe interval: the probe that left plain steps misjudged, so
            // it counts as one that confirmed them.
            self.probe_backoff.insert(bucket, (backoff * 2).min(MAX_PROBE_BACKOFF));
        } else {
            self.probe_backoff.remove(&bucket);
        }
        let switch = WidthSwitch {
            bucket,
            from,
            to,
            tokens_per_second_before: before,
            tokens_per_second_after: after,
            acceptance: p,
        };
        tracing::info!("{switch}");
        switch
    }

    /// Estimated share of sequences accepting at least `k + 1` drafts, for `k < widest`, over
    /// every verified row.
    pub fn acceptance_estimate(&self) -> Vec<f64> {
        self.acceptance.estimate()
    }

    /// The acceptance a bucket chooses by: with plain steps its own once it has verified rows,
    /// drawn toward the estimate over every row by one observation's worth of rows (a probe of
    /// 2 rows of a batch of 8 moves it a fifth of the way, a full step of 32 rows most of it);
    /// else the estimate over every row. Traffic differs between batch sizes: a single stream
    /// quoting its prompt accepts far more than a large batch of fresh answers, and small
    /// batches copy lookup drafts past the width.
    fn acceptance_for(&self, bucket: u32) -> Vec<f64> {
        match self.bucket_acceptance.get(&bucket) {
            Some(own) if own.is_measured() => own.estimate_toward(&self.acceptance, ROWS_PER_OBSERVATION),
            _ => self.acceptance.estimate(),
        }
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
        let p = self.acceptance_for(bucket);
        // A bucket's first decision pins its width: from here on it no longer follows the
        // neighbour it started from.
        let current = self.current(bucket);
        self.chosen.entry(bucket).or_insert(current);
        let probed = self.probed.take_if(|&mut b| b == bucket).is_some();
        let current_rate = self.rate(bucket, current, &p);
        if tracing::enabled!(tracing::Level::DEBUG) {
            let (lo, hi) = (1usize << bucket, bucket_max);
            let times: Vec<String> =
                self.candidates().map(|w| format!("{w}: {:.2} ms", self.step_time(bucket, w) * 1e3)).collect();
            tracing::debug!(
                "batch {lo}-{hi} at width {current}: acceptance {p:.2?}, step times {{{}}}, measured {:?}",
                times.join(", "),
                self.step_times.get(&bucket).map(|t| t.keys().copied().collect::<Vec<_>>()).unwrap_or_default()
            );
        }
        // A bucket at plain steps leaves them only for a width it has timed within the last
        // `probe_interval` steps (in practice: the probe just run). Between a plain step and
        // the probed width a narrower width's cost is a guess, and with the confidence cut not
        // one in proportion to the width (a row cut at its first draft verifies one token at any
        // width), so the guess made leaving look cheaper than any measurement did; and a time
        // from long ago may be another batch size's within the bucket (4 rows against 7).
        let timed = |w: usize| {
            self.step_times.get(&bucket).is_some_and(|t| t.contains_key(&w))
                && self.timed_at.get(&(bucket, w)).is_some_and(|&at| self.steps - at <= self.params.probe_interval)
        };
        let leaving_plain = self.plain_steps && current == 0;
        let mut best = current;
        let mut best_rate = current_rate;
        for w in self.candidates().filter(|&w| !leaving_plain || timed(w)) {
            let r = self.rate(bucket, w, &p);
            if r > best_rate {
                best = w;
                best_rate = r;
            }
        }
        // Leaving plain steps first feeds the drafter every position its rows kept through
        // them, time that commits no token: over the `probe_interval` steps in which a switch
        // has to prove itself, the faster width must also earn that back.
        let payback = match self.switch_cost.get(&bucket) {
            Some(&cost) if leaving_plain && best != current => {
                let horizon = self.params.probe_interval as f64 * self.step_time(bucket, best);
                (1.0 - cost / horizon).max(0.0)
            }
            _ => 1.0,
        };
        if best != current && best_rate * payback > current_rate * (1.0 + self.params.margin) {
            if self.plain_steps {
                // Check a switch after one step at its new width: one built on a probe (or a
                // partial one) that misjudged the cost is undone after a step, not five.
                self.countdown.insert(bucket, 1);
            }
            return Some(self.switch(bucket, current, best, current_rate, best_rate, p));
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
        let mut c = plain_controller();
        c.record_step(32, 0, &[], 0, Some(2.0));
        let b = batch_bucket(32);
        assert_eq!(c.step_time(b, 0), 2.0);
        assert_eq!(c.step_time(b, 1), 4.0);
        assert_eq!(c.step_time(b, 3), 8.0);
    }

    #[test]
    fn a_bucket_inheriting_plain_steps_times_verification_at_once_with_a_quarter_of_its_rows() {
        let mut c = plain_controller();
        let compute_bound = |w: usize| (w + 1) as f64;
        simulate(&mut c, 32, 100, &ACCEPT, compute_bound);
        assert_eq!(c.chosen_width(32), 0);
        // Batch 20 starts from bucket 5's plain steps. Its first four plain steps time t(0); the
        // fifth probes with 5 of its 20 rows drafting, and that probe, scaled to the batch,
        // shows verification does not pay: plain steps from then on, with no full probe.
        assert_eq!(simulate(&mut c, 20, 4, &ACCEPT, compute_bound), vec![0; 4]);
        assert_eq!(c.next_step_width(20), 3);
        assert_eq!(c.probe_rows(), Some(5));
        let t = compute_bound(0) + (compute_bound(3) - compute_bound(0)) * 5.0 / 20.0;
        c.record_step(20, 3, &[3, 2, 1], 5, Some(t));
        assert_eq!(c.step_time(batch_bucket(20), 3), compute_bound(3), "the probe's extra cost, scaled to 20 rows");
        let ran = simulate(&mut c, 20, 47, &ACCEPT, compute_bound);
        assert!(ran.iter().all(|&w| w == 0), "{ran:?}");
    }

    #[test]
    fn a_large_batch_with_nothing_to_start_from_starts_plain_and_probes_part_of_its_rows() {
        let fresh = plain_controller;
        // Compute-bound: four plain steps, one probe of 8 of the 32 rows, then plain steps;
        // never a full step at the widest width.
        let mut c = fresh();
        let ran = simulate(&mut c, 32, 60, &ACCEPT, |w| (w + 1) as f64);
        assert_eq!(&ran[..5], &[0, 0, 0, 0, 3]);
        assert!(ran[5..].iter().all(|&w| w == 0), "{ran:?}");
        // Memory-bound: the same probe, scaled pessimistically (1 + 0.15 · 32/8 = 1.6 against a
        // true 1.15), still shows verification pays, and the bucket leaves plain steps at once.
        let mut c = fresh();
        let cheap = |w: usize| 1.0 + 0.05 * w as f64;
        assert_eq!(simulate(&mut c, 32, 4, &ACCEPT, cheap), vec![0; 4]);
        assert_eq!((c.next_step_width(32), c.probe_rows()), (3, Some(8)));
        // Memory-bound, 8 rows verifying cost as much as 32 would.
        c.record_step(32, 3, &[5, 3, 2], 8, Some(cheap(3)));
        assert!((c.step_time(batch_bucket(32), 3) - 1.6).abs() < 1e-9);
        // Width 3, the one timed, is chosen right after the probe (interpolated between 1.0 and
        // that pessimistic 1.6, width 2 would look better, but plain steps are left only for a
        // timed width).
        assert_eq!(c.chosen_width(32), 3);
        // The next step times width 3 with every row verifying, which replaces the scaled
        // time, and the bucket stays at 3 for good.
        let ran = simulate(&mut c, 32, 120, &ACCEPT, cheap);
        assert_eq!(c.step_time(batch_bucket(32), 3), cheap(3));
        assert!(ran[60..].iter().all(|&w| w == 3), "{ran:?}");
        // Small batches probe whole and start at the widest width, as in MAX.
        let mut c = fresh();
        assert_eq!(c.next_step_width(3), 3);
        assert_eq!(c.probe_rows(), None);
    }

    #[test]
    fn large_batches_do_not_inherit_a_single_streams_width() {
        let mut c = plain_controller();
        // A single stream settles on width 1 (memory-bound: verifying is almost free).
        simulate(&mut c, 1, 100, &ACCEPT, |w| 1.0 + 0.05 * w as f64);
        assert_ne!(c.chosen_width(1), 0);
        // Batch 8 has no large neighbour with a choice: it starts at plain steps. Batch 3 (a
        // small bucket) still follows batch 1.
        assert_eq!(c.chosen_width(8), 0);
        assert_eq!(c.chosen_width(3), c.chosen_width(1));
        // Once batch 32 has chosen, batch 16 follows it rather than batch 1.
        simulate(&mut c, 32, 100, &ACCEPT, |w| 1.0 + 0.05 * w as f64);
        assert_eq!(c.chosen_width(16), c.chosen_width(32));
    }

    #[test]
    fn a_large_batch_leaves_plain_steps_on_its_own_acceptance_not_on_other_traffics() {
        let mut c = plain_controller();
        // A single stream on text its drafts predict well (quoting, say) speculates at width 3.
        simulate(&mut c, 1, 100, &[0.9, 0.8, 0.7], |w| 1.0 + 0.05 * w as f64);
        assert_eq!(c.chosen_width(1), 3);
        // Then a batch of 32 whose rows accept little, where a verified position costs half a
        // row: at the single stream's acceptance width 3 would pay (3.4 / 2.5 > 1), at its own
        // (1.2 / 1.5 < 1 at width 1) plain steps do. Only its probes may verify, never a step
        // the bucket chose.
        let low = [0.2, 0.02, 0.0];
        let half_a_row = |w: usize| 1.0 + 0.5 * w as f64;
        let ran = simulate_rows(&mut c, 32, 200, &low, half_a_row);
        let probes = ran.iter().filter(|&&(w, rows)| w > 0 && rows < 32).count();
        let full = ran.iter().filter(|&&(_, rows)| rows == 32).count();
        assert!(probes >= 2, "batch 32 probed {probes} times: {ran:?}");
        // The single stream's acceptance is the prior of the first probe's 8 rows: one full
        // step may follow, which shows what the bucket's own rows accept.
        assert!(full <= 1, "{full} full verify steps at batch 32: {ran:?}");
        assert_eq!(c.chosen_width(32), 0);
        // The global estimate, what callers see, still moves with every verified row.
        assert!(c.acceptance_estimate()[0] < 0.9);
    }

    #[test]
    fn acceptance_never_rises_with_depth() {
        let mut c = plain_controller();
        // A width-3 step where both rows accepted every draft, then two width-1 steps where
        // neither accepted its first: position 2 was last seen at 100%, position 1 at ~30%.
        c.record_step(2, 3, &[2, 2, 2], 2, Some(1.0));
        c.record_step(2, 1, &[0], 2, Some(1.0));
        c.record_step(2, 1, &[0], 2, Some(1.0));
        for p in [c.acceptance_estimate(), c.acceptance_for(batch_bucket(2))] {
            assert!(p[0] < 0.5, "{p:?}");
            assert!(p.windows(2).all(|w| w[1] <= w[0]), "a deeper position above a shallower one: {p:?}");
        }
    }

    #[test]
    fn a_bucket_at_plain_steps_leaves_them_only_for_a_width_it_has_timed() {
        let mut c = plain_controller();
        // The confidence cut stops every row after its first draft, so any width verifies one
        // token per row, at half a row's cost, and a row accepts it 40% of the time: verifying
        // loses (1.4 / 1.5). Interpolated between a plain step and the probed width 3, width 1
        // would look a third as dear (1.4 / 1.17) and worth a switch.
        let cut_after_one = |w: usize| if w == 0 { 1.0 } else { 1.5 };
        let ran = simulate_rows(&mut c, 32, 200, &[0.4, 0.0, 0.0], cut_after_one);
        let full = ran.iter().filter(|&&(_, rows)| rows == 32).count();
        assert_eq!(full, 0, "{full} full verify steps: {ran:?}");
        assert!(ran.iter().any(|&(w, rows)| w == 3 && rows == 8), "batch 32 never probed");
        assert_eq!(c.chosen_width(32), 0);
    }

    #[test]
    fn a_step_time_measured_long_ago_is_replaced_not_averaged() {
        let mut c = plain_controller();
        let cheap = |w: usize| 1.0 + 0.05 * w as f64;
        let compute_bound = |w: usize| (w + 1) as f64;
        // Batch 8 speculates while verifying is cheap, then its drafts stop being accepted and
        // it settles on plain steps, its width-3 time still the cheap one.
        simulate(&mut c, 8, 200, &ACCEPT, cheap);
        assert_eq!(c.chosen_width(8), 3);
        simulate(&mut c, 8, 300, &[0.0; 3], cheap);
        assert_eq!(c.chosen_width(8), 0);
        // Now verifying costs a row per position (other work took the cores, say) and drafts
        // are accepted again. Its next probe measures width 3 at 4x a plain step: averaged
        // into the old time (0.2 · 4 + 0.8 · 1.15) it would look worth a switch and a full
        // step; as the newest time of a width not timed for hundreds of steps it is not.
        let ran = simulate_rows(&mut c, 8, 2000, &ACCEPT, compute_bound);
        let full = ran.iter().filter(|&&(_, rows)| rows == 8).count();
        assert_eq!(full, 0, "{full} full verify steps: {ran:?}");
        assert!(ran.iter().any(|&(w, rows)| w == 3 && rows == 2), "batch 8 never probed");
        assert_eq!(c.step_time(batch_bucket(8), 3), compute_bound(3));
    }

    #[test]
    fn a_probe_of_a_few_rows_moves_a_buckets_acceptance_only_part_of_the_way() {
        let mut c = plain_controller();
        // Batch 2 speculates (memory-bound) with acceptance [0.5, 0.5, 0].
        simulate(&mut c, 2, 100, &[0.5, 0.5, 0.0], |w| 1.0 + 0.05 * w as f64);
        // Batch 8 (a verified position costs 0.8 of a row) times 4 plain steps, then probes 2
        // of its rows, which both accept their first draft and no second. Taken alone, that
        // acceptance [1, 0, 0] would send it to width 1 (2 / 1.8 > 1); drawn toward what the
        // other rows accepted by one observation's worth of rows, [0.6, 0.4, 0], it does not
        // (1.6 / 1.8).
        let costly = |w: usize| 1.0 + 0.8 * w as f64;
        assert_eq!(simulate_rows(&mut c, 8, 5, &[1.0, 0.0, 0.0], costly).last(), Some(&(3, 2)));
        assert_eq!(c.chosen_width(8), 0);
    }

    #[test]
    fn a_switch_that_a_partial_probe_misjudged_is_undone_after_one_full_step() {
        let mut c = plain_controller();
        let compute_bound = |w: usize| (w + 1) as f64;
        simulate(&mut c, 32, 4, &ACCEPT, compute_bound);
        assert_eq!(c.next_step_width(32), 3);
        // Noise: the probe's 8 rows cost nothing extra, so verifying looks free.
        c.record_step(32, 3, &[5, 3, 2], 8, Some(compute_bound(0)));
        assert_eq!(c.chosen_width(32), 3);
        // One full step at width 3 shows its real cost, and the bucket goes back to plain.
        assert_eq!(simulate(&mut c, 32, 1, &ACCEPT, compute_bound), vec![3]);
        assert_eq!(c.chosen_width(32), 0);
    }

    /// Runs `steps` decode steps of `batch` rows against a modelled target: each row accepts
    /// at least `k + 1` drafts with probability `accept[k]`, and a step verifying `w` for every
    /// row costs `cost(w)`; a partial probe costs the share of the extra that its rows verify.
    /// Returns the widths the steps ran.
    fn simulate(
        c: &mut AdaptiveWidthController,
        batch: usize,
        steps: usize,
        accept: &[f64],
        cost: impl Fn(usize) -> f64,
    ) -> Vec<usize> {
        simulate_rows(c, batch, steps, accept, cost).into_iter().map(|(w, _)| w).collect()
    }

    /// [`simulate`], returning each step's width and the rows that verified (0 for plain steps,
    /// fewer than `batch` for partial probes).
    fn simulate_rows(
        c: &mut AdaptiveWidthController,
        batch: usize,
        steps: usize,
        accept: &[f64],
        cost: impl Fn(usize) -> f64,
    ) -> Vec<(usize, usize)> {
        let mut ran = Vec::new();
        for _ in 0..steps {
            let w = c.next_step_width(batch);
            let rows = if w > 0 { c.probe_rows().unwrap_or(batch) } else { 0 };
            let apc: Vec<u64> = accept[..w].iter().map(|p| (p * rows as f64).round() as u64).collect();
            let t = cost(0) + (cost(w) - cost(0)) * rows as f64 / batch as f64;
            c.record_step(batch, w, &apc, rows as u64, Some(t));
            ran.push((w, rows));
        }
        ran
    }

    const ACCEPT: [f64; 3] = [0.6, 0.4, 0.25];

    /// Widths 1-3 with plain steps, default tuning.
    fn plain_controller() -> AdaptiveWidthController {
        AdaptiveWidthController::new(vec![1, 2, 3], AdaptiveWidthParams::default()).unwrap().with_plain_steps()
    }

    #[test]
    fn plain_steps_win_where_verification_is_compute_bound() {
        let mut c = plain_controller();
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
        let mut c = plain_controller();
        // Memory-bound: verifying more positions costs little.
        let ran = simulate(&mut c, 20, 300, &ACCEPT, |w| 1.0 + 0.05 * w as f64);
        assert_eq!(c.chosen_width(20), 3);
        assert!(ran[100..].iter().all(|&w| w == 3));
    }

    #[test]
    fn probes_back_off_while_plain_steps_keep_winning_and_reset_on_a_switch() {
        let mut c = plain_controller();
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
        let mut c = plain_controller();
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
    fn a_larger_batch_waits_for_its_first_probe_where_a_smaller_one_chose_plain_steps() {
        let compute_bound = |w: usize| (w + 1) as f64;
        let mut c = plain_controller();
        // Batch 8 times verification and settles on plain steps.
        simulate(&mut c, 8, 120, &ACCEPT, compute_bound);
        assert_eq!(c.chosen_width(8), 0);
        let backoff = c.probe_backoff.get(&batch_bucket(8)).copied().unwrap_or(1);
        // Batch 32, then 20 as its rows finish: plain steps for a whole backed-off probe
        // interval, not a probe after `update_interval` steps in each bucket.
        let wait = AdaptiveWidthParams::default().probe_interval * backoff;
        for batch in [32, 20] {
            let ran = simulate(&mut c, batch, wait - 1, &ACCEPT, compute_bound);
            assert!(ran.iter().all(|&w| w == 0), "batch {batch}: {ran:?}");
            assert_eq!((c.next_step_width(batch), c.probe_rows()), (3, Some(batch.div_ceil(4))), "then it probes");
        }
        // A smaller batch of whole probes (below PARTIAL_PROBE_MIN_BATCH) gives no verdict:
        // batch 32 times four plain steps and probes, as with nothing to start from.
        let mut c = plain_controller();
        simulate(&mut c, 2, 200, &ACCEPT, compute_bound);
        assert_eq!(c.chosen_width(2), 0);
        assert_eq!(simulate(&mut c, 32, 5, &ACCEPT, compute_bound), vec![0, 0, 0, 0, 3]);
    }

    #[test]
    fn leaving_plain_steps_must_also_pay_back_the_drafters_catch_up() {
        // Plain steps of batch 32 take 1.0; the partial probe (8 rows) scales to 2.14 at width
        // 3, which commits 2.25 tokens a row: 5% more than plain steps, past the 2% margin.
        let probe = |catch_up: Option<f64>| {
            let mut c = plain_controller();
            assert_eq!(simulate(&mut c, 32, 4, &ACCEPT, |_| 1.0), vec![0; 4]);
            assert_eq!((c.next_step_width(32), c.probe_rows()), (3, Some(8)));
            if let Some(seconds) = catch_up {
                c.record_catch_up(32, seconds);
            }
            c.record_step(32, 3, &[5, 3, 2], 8, Some(1.0 + 1.14 / 4.0));
            assert!((c.step_time(batch_bucket(32), 3) - 2.14).abs() < 1e-9);
            c
        };
        assert_eq!(probe(None).chosen_width(32), 3, "without a catch-up cost the probe's 5% wins");
        // A catch-up of 0.2 for the 8 rows is 0.8 for the batch: under 1% of the 50 steps a
        // switch has to prove itself in (50 · 2.14), so the switch still pays.
        assert_eq!(probe(Some(0.2)).chosen_width(32), 3);
        // A catch-up of 1.0 (4.0 for the batch, 3.7% of them) eats most of the 5%: plain steps.
        let c = probe(Some(1.0));
        assert_eq!(c.chosen_width(32), 0);
        assert_eq!(c.switch_cost.get(&batch_bucket(32)), Some(&4.0));
        // Catch-up outside a probe (a row that drafts again) says nothing about a switch.
        let mut c = plain_controller();
        simulate(&mut c, 32, 3, &ACCEPT, |_| 1.0);
        c.record_catch_up(32, 5.0);
        assert!(c.switch_cost.is_empty());
    }

    #[test]
    fn a_plain_bucket_whose_verify_time_aged_out_keeps_its_probe_backoff() {
        let mut c = plain_controller();
        let compute_bound = |w: usize| (w + 1) as f64;
        // The benchmark's batch workload, again and again: 32 rows for 16 steps, then, as
        // answers finish, 20 rows for 80 steps. Each return to batch 32 finds its verify time
        // older than `probe_interval` steps, which drops it; that must not make the bucket
        // look never verified and probe again within `update_interval` steps.
        let mut probes_at_32 = Vec::new();
        for _ in 0..12 {
            let ran = simulate(&mut c, 32, 16, &ACCEPT, compute_bound);
            probes_at_32.push(ran.iter().filter(|&&w| w > 0).count());
            simulate(&mut c, 20, 80, &ACCEPT, compute_bound);
        }
        assert_eq!(c.chosen_width(32), 0);
        // Batch 32 runs 16 steps a cycle, so with the interval doubling from 50 of its steps the
        // last 8 cycles (128 of its steps) hold at most 2 probes, not one each.
        let late: usize = probes_at_32[4..].iter().sum();
        assert!(late <= 2, "probes of batch 32 per cycle: {probes_at_32:?}");
    }

    #[test]
    fn a_large_bucket_returns_to_plain_steps_at_its_first_full_step_slower_than_them() {
        let mut c = plain_controller();
        let compute_bound = |w: usize| (w + 1) as f64;
        simulate(&mut c, 32, 60, &ACCEPT, compute_bound);
        assert_eq!(c.chosen_width(32), 0);
        // A quiet moment of the machine: the next probe and the first full verify steps after
        // it come out cheap, so the bucket leaves plain steps; from then on verification costs
        // what it does. Averaged into the cheap times, the true cost took many steps to bring
        // the bucket back; judged step by step, the first slow full step does.
        let verify_steps = std::cell::Cell::new(0);
        let noisy = |w: usize| {
            if w == 0 {
                return 1.0;
            }
            verify_steps.set(verify_steps.get() + 1);
            if verify_steps.get() <= 3 { 1.0 + 0.05 * w as f64 } else { compute_bound(w) }
        };
        let ran = simulate(&mut c, 32, 200, &ACCEPT, noisy);
        let full_verify_steps = ran.iter().filter(|&&w| w > 0).count();
        assert!(full_verify_steps <= 5, "{full_verify_steps} verify steps: {ran:?}");
        assert_eq!(c.chosen_width(32), 0);
    }

    #[test]
    fn plain_step_times_follow_the_latest_steps_and_ignore_a_lone_slow_one() {
        let mut c = plain_controller();
        let b = batch_bucket(29);
        for _ in 0..5 {
            c.record_step(29, 0, &[], 0, Some(1.0));
        }
        // The step after rows finish takes half as long again: plain steps do not get dearer.
        c.record_step(29, 0, &[], 0, Some(1.5));
        assert_eq!(c.step_time(b, 0), 1.0);
        // Rows finished, the batch is smaller: three steps in, plain steps cost what they do now.
        for _ in 0..3 {
            c.record_step(20, 0, &[], 0, Some(0.7));
        }
        assert_eq!(c.step_time(b, 0), 0.7);
    }

    #[test]
    fn a_new_bucket_starts_from_its_nearest_neighbours_choice_with_plain_steps() {
        let mut c = plain_controller();
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
