//! The verify-width policy of a running engine: the static width, the batch-size schedule or
//! the adaptive controller for pure decode steps, and the mixed-batch width for steps that
//! share the target forward with prefill rows.

use specrs_core::scheduler::WidthPolicy;
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
    /// Drafts per step (the cap of every width).
    pub max_width: usize,
    /// Mixed steps verify at all (`enable_spec_decode_mixed_batches` and architecture support).
    pub mixed_enabled: bool,
    /// `num_speculative_tokens_mixed_batch`.
    pub mixed_width: Option<usize>,
    /// The width the last pure decode step was planned with, for the adaptive controller.
    pub last_pure_width: Option<usize>,
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
        let width = if mixed {
            if !self.mixed_enabled {
                return 0;
            }
            self.mixed_width.unwrap_or_else(|| self.schedule_width(decode_rows))
        } else {
            let w = match &mut self.mode {
                WidthMode::Adaptive(c) => c.next_step_width(decode_rows),
                _ => self.schedule_width(decode_rows),
            };
            self.last_pure_width = Some(w);
            w
        };
        width.min(self.max_width)
    }
}
