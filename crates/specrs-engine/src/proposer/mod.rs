//! Proposers: what produces the draft tokens a step verifies.
//!
//! A proposer sees every row after the step's tokens are committed: the committed tokens,
//! which positions the target processed this step and which of them are now final, and the
//! target's hidden-state taps for those positions. It returns the drafts for the next step.
//! It never sees acceptance; acceptance never sees how drafts were made (vLLM's split).

pub mod block;
pub mod confidence;
pub mod copies_first;
pub mod guided_first;
pub mod lookup_first;
pub mod ngram;
pub mod sequential;
pub mod suffix;
pub mod suffix_first;

use std::sync::Arc;
use std::time::Duration;

use candle_core::{Device, Tensor};
use specrs_core::kv_blocks::SeqId;
use specrs_core::sampling::SamplingParams;
use specrs_core::scheduler::Scheduler;
use specrs_core::structured::{GuideCursor, GuideState, TokenSet};

use crate::error::Result;

/// One row of the step, as the proposer sees it after commit.
#[derive(Debug, Clone, Copy)]
pub struct ProposeRow<'a> {
    pub seq: SeqId,
    /// Every committed token (prompt + output) after this step.
    pub tokens: &'a [u32],
    /// How many leading `tokens` are the prompt.
    pub prompt_len: usize,
    /// Position of the first token the target processed this step.
    pub fed_start: usize,
    /// Leading processed positions whose keys, values and taps are committed (the last fed
    /// token plus the accepted drafts, or a prefill chunk). Position `p` among them pairs with
    /// the committed token `tokens[p + 1]`.
    pub num_valid: usize,
    /// Index of the row's first processed token in the step's flat batch (rows of taps).
    pub flat_start: usize,
    /// Drafts the row wants for the next step: 0 when it does not draft (it finishes, is
    /// mid-prefill, or the next step is planned plain), at most `K`. The adaptive controller
    /// asks for fewer than `K` when it has planned a narrower verify width.
    pub num_drafts: usize,
    /// Drafts the row may take by copying (prompt lookup, [`Proposer::copy_width`]) whatever
    /// `num_drafts` says: copies cost no drafter forward, so the next step verifies them even
    /// where the width planned for model drafts is narrower, or a plain step. 0 otherwise.
    pub num_copies: usize,
    /// A row that does not draft from the model but should feed a sequential drafter its
    /// committed positions this step, when that drafter runs anyway: prompt lookup drafted
    /// for it, and it is likely to need the model again soon.
    pub catch_up_now: bool,
    /// Feed this step's committed positions (and any kept from earlier steps) to a sequential
    /// drafter now, whether or not it drafts: a prompt chunk or a finishing sequence under
    /// prefix caching, whose blocks are cached only once the drafter's KV there is final.
    pub feed_now: bool,
    pub params: &'a SamplingParams,
    /// The row's step seed for drafters that sample.
    pub seed: u64,
    /// Where a guided row's output is in its structured-output guide ([`guide_state_after`]),
    /// walked once per step for every proposer to read; `None` for an unguided row.
    pub guide_state: Option<GuideState>,
}

/// The guide state after the output part of `tokens` (those past `prompt_len`), when `params`
/// has a guide.
pub fn guide_state_after(tokens: &[u32], prompt_len: usize, params: &SamplingParams) -> Option<GuideState> {
    let (prompt, output) = tokens.split_at(prompt_len.min(tokens.len()));
    params.guide.as_ref().map(|guide| GuideCursor::after(guide, prompt, output).state())
}

/// The draft-vocabulary index with the largest logit among those whose target token
/// `allowed` holds; `None` when it holds none of them.
pub(crate) fn allowed_argmax(row: &[f32], allowed: &TokenSet, to_target: &impl Fn(u32) -> u32) -> Option<u32> {
    (0..row.len() as u32).filter(|&j| allowed.contains(to_target(j)) && !row[j as usize].is_nan()).fold(
        None,
        |best: Option<u32>, j| match best {
            Some(b) if row[b as usize] >= row[j as usize] => best,
            _ => Some(j),
        },
    )
}

impl ProposeRow<'_> {
    /// The row wants drafts from the model.
    pub fn wants_drafts(&self) -> bool {
        self.num_drafts > 0
    }

    /// The row gets a proposal back: it wants model drafts or may copy some.
    pub fn may_draft(&self) -> bool {
        self.num_drafts > 0 || self.num_copies > 0
    }
}

/// Drafts for one row. `probs`, when present, holds the distribution each draft was sampled
/// from, for rejection sampling.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Proposal {
    pub drafts: Vec<u32>,
    pub probs: Option<DraftProbs>,
}

/// The distributions a row's sampled drafts were drawn from, in target-id space: one `V`-wide
/// row per draft.
#[derive(Debug, Clone)]
pub enum DraftProbs {
    /// `[drafts · V]` on the host, where the draft was drawn.
    Host(Vec<f32>),
    /// `[drafts, V]` f32 where the drafter's logits live: drawn there, only the draft ids
    /// came to the host, and verification on that device reads them in place.
    Device(Tensor),
}

impl DraftProbs {
    /// The first `n` distributions as host values (a copy from the device for `Device`).
    pub fn host_rows(&self, n: usize, vocab: usize) -> Result<std::borrow::Cow<'_, [f32]>> {
        Ok(match self {
            Self::Host(q) => std::borrow::Cow::Borrowed(&q[..n * vocab]),
            Self::Device(t) => std::borrow::Cow::Owned(t.narrow(0, 0, n)?.flatten_all()?.to_vec1::<f32>()?),
        })
    }
}

/// The processed draft distributions of logit rows `x [n, Vd]` (one parameter set per row, none
/// greedy) in target-id space, `[n, V]` where the logits are: processing over the draft
/// vocabulary equals processing the target-id row with every other token at -inf, as the
/// host does, and the probabilities are scattered to target ids (zero elsewhere) through
/// `draft_to_target`.
pub(crate) fn target_space_distributions(
    x: &Tensor,
    params: &[&SamplingParams],
    draft_to_target: Option<&Arc<Vec<u32>>>,
    vocab_size: usize,
) -> candle_core::Result<Tensor> {
    let q = specrs_models::reductions::processed_probs(x, params)?;
    Ok(match draft_to_target {
        None => q,
        Some(map) => {
            let ids = Tensor::from_slice(map.as_slice(), map.len(), x.device())?;
            Tensor::zeros((q.dim(0)?, vocab_size), q.dtype(), x.device())?.index_add(&ids, &q, 1)?
        }
    })
}

impl PartialEq for DraftProbs {
    /// Same values wherever they live.
    fn eq(&self, other: &Self) -> bool {
        let values = |p: &Self| match p {
            Self::Host(q) => Some(q.clone()),
            Self::Device(t) => t.flatten_all().and_then(|t| t.to_vec1::<f32>()).ok(),
        };
        values(self).is_some_and(|a| Some(a) == values(other))
    }
}

/// What a proposer needs from the target forward of a step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TapRequest {
    /// Hugging Face `hidden_states` indices.
    pub taps: Vec<usize>,
    pub final_hidden: bool,
}

/// The target's outputs of the step that proposers read.
pub struct StepTaps<'a> {
    /// One `[T, hidden]` tensor per requested tap, rows in flat batch order.
    pub taps: &'a [Tensor],
    pub final_hidden: Option<&'a Tensor>,
}

pub trait Proposer: Send {
    /// Name for logs.
    fn name(&self) -> &str;

    /// Drafts per step (`K`).
    fn num_speculative_tokens(&self) -> usize;

    /// KV slots past a row's committed tokens that drafting writes (the engine reserves them
    /// before [`Self::propose`] and rolls them back after): `K + 1` for a chain of `K` drafts
    /// one position apart; a block drafter writes its whole block.
    fn draft_lookahead(&self) -> usize {
        self.num_speculative_tokens() + 1
    }

    /// Drafts a row may copy (prompt lookup) whatever width the next step was planned at: rows
    /// get `num_copies` up to this. 0 for proposers that do not copy.
    fn copy_width(&self) -> usize {
        0
    }

    /// Hidden states the proposer reads from every target forward.
    fn tap_request(&self) -> TapRequest {
        TapRequest::default()
    }

    /// The device the drafter runs on, when it reads the target's hidden states: the engine
    /// moves them there first. It differs from the target's under data parallelism with
    /// `draft_head_parallelism="device0"` (every replica drafts with the head on the first
    /// device). `None` for proposers that read no hidden states.
    fn input_device(&self) -> Option<&Device> {
        None
    }

    /// Proposes the next drafts for every row that may draft ([`ProposeRow::may_draft`]), in row
    /// order: at most `num_drafts` from the model, or at most `max(num_drafts, num_copies)`
    /// copied. Updates any per-sequence state from the committed positions of every row. The
    /// scheduler (block tables) has already reserved KV for `tokens.len() + draft_lookahead()`
    /// tokens of rows that may draft.
    fn propose(&mut self, rows: &[ProposeRow<'_>], taps: &StepTaps<'_>, scheduler: &Scheduler)
    -> Result<Vec<Proposal>>;

    /// Time the last [`Self::propose`] spent feeding positions kept from earlier steps in which
    /// the row did not draft: a one-off cost of those plain steps, not a cost of the width the
    /// drafts are for, so the adaptive controller leaves it out of its step times.
    fn take_catch_up_time(&mut self) -> Duration {
        Duration::ZERO
    }

    /// Bytes of drafter KV per token, for the memory planner.
    fn kv_bytes_per_token(&self) -> u64 {
        0
    }

    /// Allocates drafter state for a KV pool of `num_blocks` blocks of `block_size` tokens; the
    /// drafter addresses its KV through the target's block tables.
    fn allocate(&mut self, _num_blocks: usize, _block_size: usize) -> Result<()> {
        Ok(())
    }

    /// Forgets a sequence (finished, cancelled or preempted).
    fn release(&mut self, _seq: SeqId) {}

    /// Forgets what the drafter keeps from finished requests (suffix decoding's shared tree
    /// of outputs). Returns how many requests' outputs went.
    fn forget_cached_outputs(&mut self) -> usize {
        0
    }

    /// How many leading positions of `seq` hold final drafter KV, given that the target has
    /// computed `computed`: the prefix cache shares only blocks final in both. A drafter with
    /// no KV, or one that writes every committed position each step, has all of them.
    fn kv_final_len(&self, _seq: SeqId, computed: usize) -> usize {
        computed
    }
}
