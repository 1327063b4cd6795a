//! Verify-width policy: the per-batch-size schedule, the mixed-batch width and the adaptive
//! controller, and the one function that decides a step's width from them.

pub mod adaptive;
pub mod schedule;

pub use adaptive::{AdaptiveWidthController, AdaptiveWidthParams, WidthSwitch, batch_bucket, parse_adaptive_widths};
pub use schedule::{VerifyWidthRange, VerifyWidthSchedule, normalize_schedule};
