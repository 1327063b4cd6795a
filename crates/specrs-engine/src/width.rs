//! The verify-width policy of a running engine: the static width, the batch-size schedule or
//! the adaptive controller for pure decode steps, and the mixed-batch width for steps that
//! share the target forward with prefill rows.

use specrs_core::metrics::SpecDecodeStats;
use specrs_core::scheduler::WidthPolicy;
use specrs_core::width::adaptive::PARTIAL_PROBE_MIN_BATCH;
use specrs_core::width::{AdaptiveWidthController, VerifyWidthSchedule};

pub enum WidthMode {
    /// Plain decoding: nothing to verify.
    Off,
    /// Every pure decode step verifies `K`.
    Fixed(usize),
    Schedule(VerifyWidthSchedule),
    Adaptive(Box<AdaptiveWidthController>),
}

pub struct EngineWidthPolicy {
    pub mode: WidthMode,
    /// Drafts per step (the cap of every chosen width).
    pub max_width: usize,
    /// The most drafts a row may copy ([`crate::proposer::Proposer::copy_width`], at least
    /// `max_width`): copies widen a pure step up to this, past the drafts a model makes.
    pub max_copy_width: usize,
    /// Mixed steps verify at all (`enable_spec_decode_mixed_batches` and architecture support).
    pub mixed_enabled: bool,
    /// `num_speculative_tokens_mixed_batch`.
    pub mixed_width: Option<usize>,
    /// The next pure decode step's width, when it was decided before drafting for it
    /// ([`Self::plan_next_pure_step`]).
    pub planned: Option<usize>,
    /// The most drafts a row copied for the next step (prompt lookup, `num_copies`): a pure
    /// step verifies at least this many, whatever the chosen width.
    pub copied: usize,
    /// The width the policy chose for the last step when copied drafts widened it: what the
    /// adaptive controller should learn from (its acceptance), not the step's cost.
    pub widened_from: Option<usize>,
    /// Rows the last drafting asked for drafts that came back with none: the confidence cut
    /// stopped them before their first draft, or an n-gram lookup found no match. The next
    /// pure step verifies nothing for them and they return one token each, whatever their
    /// drafting cost: the adaptive controller counts them as verified rows that accepted
    /// nothing ([`Self::controller_observation`]), so its acceptance is a share of the rows
    /// that drafted, as its rate model assumes, and its step times include theirs.
    pub drafted_nothing: usize,
}

impl EngineWidthPolicy {
    fn schedule_width(&self, rows: usize) -> usize {
        match &self.mode {
            WidthMode::Off => 0,
            WidthMode::Fixed(k) => *k,
            WidthMode::Schedule(s) => s.width_for(rows),
            WidthMode::Adaptive(c) => c.chosen_width(rows),
        }
    }

    /// Decides the next pure decode step's width now, before the drafts for it are made, when
    /// that width may be 0: the adaptive controller with plain steps can pick a plain step,
    /// and then drafting for it would be wasted work. `None` when the width is decided at
    /// schedule time as usual.
    pub fn plan_next_pure_step(&mut self, decode_rows: usize) -> Option<usize> {
        let WidthMode::Adaptive(c) = &mut self.mode else {
            return None;
        };
        if !c.plain_steps() || decode_rows == 0 {
            return None;
        }
        let width = c.next_step_width(decode_rows);
        self.planned = Some(width);
        Some(width)
    }

    /// How many rows draft for the planned step: all (`None`), or the few of a partial probe.
    pub fn planned_drafting_rows(&self) -> Option<usize> {
        match (&self.mode, self.planned) {
            (WidthMode::Adaptive(c), Some(w)) if w > 0 => c.probe_rows(),
            _ => None,
        }
    }

    /// Drafts a row may copy past the planned width at this decode batch size, of the
    /// `copyable` its proposer can copy: all of them in a small batch, where the target
    /// forward is bound by streaming its weights and a few more positions cost little; none
    /// from `PARTIAL_PROBE_MIN_BATCH` rows up, where each verified position costs about the
    /// token it may return and the width chosen for the batch stands (measured: copies past
    /// it took batch 32 from 0.93x to 0.86x of plain decoding on chat prompts).
    pub fn copy_width(&self, decode_rows: usize, copyable: usize) -> usize {
        if matches!(self.mode, WidthMode::Off) || decode_rows >= PARTIAL_PROBE_MIN_BATCH { 0 } else { copyable }
    }

    /// What the adaptive controller learns from a pure step that verified `width` drafts per
    /// row: acceptance by position over every row that asked for drafts, and that row count.
    ///
    /// The controller's rate model gives each row `1 + Σ p_k` tokens per step at a width, so
    /// `p_k` must be a share of the rows that drafted for it, not of the rows that still had
    /// drafts after the confidence cut: counted over the survivors alone, the acceptance of the
    /// confident rows was credited to every row, a probe of a large batch looked worth leaving
    /// plain steps for, and batch 32 fell to 0.86x of plain decoding.
    pub fn controller_observation(&mut self, stats: &SpecDecodeStats, width: usize) -> (Vec<u64>, u64) {
        let cut = std::mem::take(&mut self.drafted_nothing) as u64;
        let mut accepted = stats.accepted_per_position.clone();
        if accepted.len() < width {
            // A step whose rows were all cut recorded no positions: they accepted nothing.
            accepted.resize(width, 0);
        }
        (accepted, stats.num_drafts + cut)
    }

    pub fn controller(&mut self) -> Option<&mut AdaptiveWidthController> {
        match &mut self.mode {
            WidthMode::Adaptive(c) => Some(c),
            _ => None,
        }
    }
}

impl WidthPolicy for EngineWidthPolicy {
    fn step_width(&mut self, decode_rows: usize, mixed: bool) -> usize {
        if matches!(self.mode, WidthMode::Off) {
            return 0;
        }
        // A plan made at drafting time, and the copies made with it, hold for the step right
        // after it only.
        let planned = self.planned.take();
        let copied = std::mem::take(&mut self.copied);
        self.widened_from = None;
        if mixed {
            if !self.mixed_enabled {
                return 0;
            }
            return self.mixed_width.unwrap_or_else(|| self.schedule_width(decode_rows)).min(self.max_width);
        }
        let chosen = match &mut self.mode {
            WidthMode::Adaptive(c) => planned.unwrap_or_else(|| c.next_step_width(decode_rows)),
            _ => self.schedule_width(decode_rows),
        }
        .min(self.max_width);
        let width = chosen.max(copied.min(self.max_copy_width));
        if width > chosen {
            self.widened_from = Some(chosen);
        }
        width
    }
}

#[cfg(test)]
mod tests {
    use specrs_core::width::AdaptiveWidthParams;

    use super::*;

    fn adaptive_policy() -> EngineWidthPolicy {
        let c = AdaptiveWidthController::new(vec![1, 2], AdaptiveWidthParams::default()).unwrap().with_plain_steps();
        EngineWidthPolicy {
            mode: WidthMode::Adaptive(Box::new(c)),
            max_width: 2,
            max_copy_width: 4,
            mixed_enabled: false,
            mixed_width: None,
            planned: None,
            copied: 0,
            widened_from: None,
            drafted_nothing: 0,
        }
    }

    /// Runs ten pure steps of `batch` rows in which nothing is accepted and verifying is
    /// expensive, so the controller settles on plain steps.
    fn teach_plain_steps(p: &mut EngineWidthPolicy, batch: usize) {
        for _ in 0..10 {
            let w = p.step_width(batch, false);
            let rows = batch as u64 * u64::from(w > 0);
            p.controller().unwrap().record_step(batch, w, &[0, 0][..w], rows, Some(1.0 + w as f64));
        }
    }

    #[test]
    fn a_width_planned_at_drafting_time_is_the_next_pure_steps_width() {
        let mut p = adaptive_policy();
        teach_plain_steps(&mut p, 32);
        assert_eq!(p.controller().unwrap().chosen_width(32), 0);
        let planned = p.plan_next_pure_step(32);
        assert_eq!(planned, Some(0));
        assert_eq!(p.step_width(32, false), 0, "the step runs the planned width");
        assert_eq!(p.planned, None, "a plan serves one step");
    }

    #[test]
    fn a_partial_probe_plans_drafts_for_a_quarter_of_the_rows() {
        let mut p = adaptive_policy();
        // Batch 32 with nothing to start from: plain steps first, drafting for nobody.
        for _ in 0..4 {
            assert_eq!(p.plan_next_pure_step(32), Some(0));
            assert_eq!(p.planned_drafting_rows(), None);
            let w = p.step_width(32, false);
            p.controller().unwrap().record_step(32, w, &[], 0, Some(1.0));
        }
        // Then the probe: the widest width, drafted for 8 of the 32 rows.
        assert_eq!(p.plan_next_pure_step(32), Some(2));
        assert_eq!(p.planned_drafting_rows(), Some(8));
        assert_eq!(p.step_width(32, false), 2);
        assert_eq!(p.planned_drafting_rows(), None, "the plan is spent");
    }

    #[test]
    fn a_mixed_step_discards_the_plan() {
        let mut p = adaptive_policy();
        p.mixed_enabled = true;
        p.plan_next_pure_step(4);
        p.step_width(4, true);
        assert_eq!(p.planned, None);
    }

    #[test]
    fn copied_drafts_widen_the_next_pure_step_and_say_what_was_chosen() {
        let mut p = adaptive_policy();
        teach_plain_steps(&mut p, 2);
        assert_eq!(p.plan_next_pure_step(2), Some(0), "plain steps win");
        p.copied = 3;
        assert_eq!(p.step_width(2, false), 3, "widened to the copies, past K");
        assert_eq!(p.widened_from, Some(0), "the controller chose a plain step");
        assert_eq!(p.plan_next_pure_step(2), Some(0));
        p.copied = 7;
        assert_eq!(p.step_width(2, false), 4, "capped at the longest copy a row may make");
        assert_eq!(p.widened_from, Some(0), "the controller chose a plain step");
        // The copies served that step only.
        assert_eq!(p.plan_next_pure_step(2), Some(0));
        assert_eq!(p.step_width(2, false), 0);
        assert_eq!(p.widened_from, None);
        // A mixed step verifies its own width; copies do not widen it.
        p.mixed_enabled = true;
        p.mixed_width = Some(1);
        p.copied = 2;
        assert_eq!(p.step_width(2, true), 1);
        assert_eq!((p.copied, p.widened_from), (0, None));
    }

    #[test]
    fn rows_copy_past_the_width_in_small_batches_only() {
        let p = adaptive_policy();
        assert_eq!(p.copy_width(1, 3), 3);
        assert_eq!(p.copy_width(PARTIAL_PROBE_MIN_BATCH - 1, 3), 3);
        assert_eq!(p.copy_width(PARTIAL_PROBE_MIN_BATCH, 3), 0);
        assert_eq!(p.copy_width(32, 3), 0);
    }

    #[test]
    fn rows_cut_to_nothing_count_as_verified_rows_that_accepted_nothing() {
        let mut p = adaptive_policy();
        p.drafted_nothing = 6;
        // Two rows kept drafts: both accepted the first, one the second.
        let mut stats = SpecDecodeStats::new();
        stats.record_row(2, 2);
        stats.record_row(2, 1);
        assert_eq!(p.controller_observation(&stats, 2), (vec![2, 1], 8));
        assert_eq!(p.drafted_nothing, 0, "the count serves one step");
        assert_eq!(p.controller_observation(&stats, 2), (vec![2, 1], 2));
    }

    #[test]
    fn a_step_whose_rows_were_all_cut_is_timed_at_its_width() {
        let mut p = adaptive_policy();
        p.drafted_nothing = 1;
        let (accepted, rows) = p.controller_observation(&SpecDecodeStats::new(), 2);
        assert_eq!((accepted.as_slice(), rows), (&[0, 0][..], 1));
        let c = p.controller().unwrap();
        c.record_step(1, 2, &accepted, rows, Some(0.013));
        // Timed as what it was, a width-2 step that drafted and verified nothing, and its
        // acceptance is a row that accepted nothing.
        assert_eq!(c.step_time(0, 2), 0.013);
        assert_eq!(c.acceptance_estimate(), vec![0.0, 0.0]);
    }

    #[test]
    fn only_adaptive_plain_steps_plan_ahead() {
        let mut p = EngineWidthPolicy {
            mode: WidthMode::Fixed(3),
            max_width: 3,
            max_copy_width: 3,
            mixed_enabled: false,
            mixed_width: None,
            planned: None,
            copied: 0,
            widened_from: None,
            drafted_nothing: 0,
        };
        assert_eq!(p.plan_next_pure_step(8), None);
        assert_eq!(p.step_width(8, false), 3);
    }
}
