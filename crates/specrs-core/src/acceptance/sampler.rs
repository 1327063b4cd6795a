//! The dispatcher: picks each row's rule and walks its positions.

use super::greedy;
use super::phase::ThinkingTokens;
use super::position::{Position, Scratch, Verdict};
use super::reduced::{ReducedError, ReducedRow, Reductions, need};
use super::relaxed::RelaxedRule;
use super::row::{VerifyError, VerifyOutput, VerifyRow};
use super::stochastic;
use super::synthetic::SyntheticRule;
use crate::config::{AcceptanceRule, DraftProposal, SpeculativeConfig};
use crate::error::ConfigError;
use crate::sampling::{PenaltyContext, SamplingParams};

/// The rule one row runs, resolved once per row.
#[derive(Clone, Copy)]
enum RowRule<'a> {
    Synthetic(SyntheticRule),
    Greedy,
    /// Target-sample match, with the relaxed overlay where the row is in a reasoning span.
    TargetSample {
        relaxed: Option<RelaxedRule>,
    },
    /// Rejection sampling against the row's draft distributions (`[n · V]`), if any.
    Rejection {
        draft_probs: Option<&'a [f32]>,
    },
}

/// Verifies draft tokens against target logits under the pipeline's acceptance rule.
///
/// Built once per pipeline; `accept_row` and `accept_batch` are pure functions of their rows,
/// so a row's result never depends on the batch around it.
#[derive(Debug, Clone, PartialEq)]
pub struct AcceptanceSampler {
    rule: AcceptanceRule,
    draft_proposal: DraftProposal,
    vocab_size: usize,
    num_draft_steps: usize,
    /// Set when the config asks for relaxed acceptance and the rule is stochastic.
    relaxed: Option<RelaxedRule>,
    /// Set under the synthetic rule.
    synthetic: Option<SyntheticRule>,
    thinking: Option<ThinkingTokens>,
}

impl AcceptanceSampler {
    /// Builds the sampler for a pipeline drafting `num_draft_steps` tokens per step (`K`) over
    /// a vocabulary of `vocab_size`. `thinking_token_ids` are the tokenizer's reasoning
    /// `(start, end)` ids, required by `use_relaxed_acceptance_for_thinking`.
    pub fn new(
        config: &SpeculativeConfig,
        num_draft_steps: usize,
        vocab_size: usize,
        thinking_token_ids: Option<(u32, u32)>,
    ) -> Result<Self, ConfigError> {
        let config = config.clone().validated()?;
        config.check_pipeline_combinations()?;
        if num_draft_steps == 0 {
            return Err(ConfigError::field(
                "num_speculative_tokens",
                "speculative decoding drafts at least one token per step; got 0 draft steps",
            ));
        }
        if vocab_size == 0 {
            return Err(ConfigError::new("the target vocabulary is empty (vocab_size = 0)"));
        }
        let thinking = thinking_token_ids.map(|(start, end)| ThinkingTokens { start, end });
        if let Some(t) = thinking
            && (t.start as usize >= vocab_size || t.end as usize >= vocab_size)
        {
            return Err(ConfigError::new(format!(
                "reasoning token ids ({}, {}) are outside the vocabulary of {vocab_size} tokens",
                t.start, t.end
            )));
        }
        if config.use_relaxed_acceptance_for_thinking && thinking.is_none() {
            return Err(ConfigError::field(
                "use_relaxed_acceptance_for_thinking",
                "use_relaxed_acceptance_for_thinking needs the model's reasoning start/end token ids \
                 (e.g. <think> and </think>), and this tokenizer has none; unset the flag for this model",
            ));
        }
        let rule = config.acceptance_rule();
        // `validated` bounds relaxed_topk to >= 1 and relaxed_delta to [0, 1].
        let relaxed = (rule == AcceptanceRule::Stochastic && config.use_relaxed_acceptance_for_thinking).then(|| {
            RelaxedRule { topk: usize::try_from(config.relaxed_topk).unwrap_or(1), delta: config.relaxed_delta }
        });
        let synthetic = config.synthetic_acceptance_rate.map(|rate| SyntheticRule::new(rate, num_draft_steps));
        Ok(Self {
            rule,
            draft_proposal: config.draft_proposal,
            vocab_size,
            num_draft_steps,
            relaxed,
            synthetic,
            thinking,
        })
    }

    /// The acceptance rule, by precedence synthetic > stochastic > greedy.
    pub fn rule(&self) -> AcceptanceRule {
        self.rule
    }

    pub fn draft_proposal(&self) -> DraftProposal {
        self.draft_proposal
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    pub fn num_draft_steps(&self) -> usize {
        self.num_draft_steps
    }

    /// The relaxed thinking rule when it is active.
    pub fn relaxed_rule(&self) -> Option<RelaxedRule> {
        self.relaxed
    }

    /// The calibrated synthetic rule under the synthetic acceptance rule.
    pub fn synthetic_rule(&self) -> Option<SyntheticRule> {
        self.synthetic
    }

    /// The startup log line, e.g. `Speculative acceptance rule: stochastic
    /// (draft_proposal=argmax, relaxed=off)`.
    pub fn describe(&self) -> String {
        let relaxed = match self.relaxed {
            Some(r) => format!("on, topk={}, delta={}", r.topk, r.delta),
            None => "off".to_string(),
        };
        let mut line = format!(
            "Speculative acceptance rule: {} (draft_proposal={}, relaxed={relaxed})",
            self.rule.as_str(),
            self.draft_proposal.as_str(),
        );
        if let Some(s) = self.synthetic {
            line.push_str(&format!(
                "; synthetic mean joint acceptance {} over {} drafts = {:.6} per position. \
                 Benchmark only: emitted tokens are the target argmax, not a faithful decode",
                s.mean_joint_rate, self.num_draft_steps, s.per_position_rate
            ));
        }
        line
    }

    /// Verifies one row.
    pub fn accept_row(&self, row: &VerifyRow) -> Result<VerifyOutput, VerifyError> {
        self.accept_row_with(row, &mut Scratch::new(self.vocab_size))
    }

    /// Verifies each row in order, sharing scratch buffers; each row's result is its own (a
    /// row whose request masks every token at a position ends there alone).
    pub fn accept_batch(&self, rows: &[VerifyRow]) -> Vec<Result<VerifyOutput, VerifyError>> {
        let mut scratch = Scratch::new(self.vocab_size);
        rows.iter().map(|row| self.accept_row_with(row, &mut scratch)).collect()
    }

    /// What [`Self::accept_reduced_row`] reads for a row with these parameters, or `None`
    /// when the row must be verified on its logits ([`Self::accept_row`]): rows with
    /// penalties or a logit bias.
    pub fn reductions_for(&self, params: &SamplingParams) -> Option<Reductions> {
        if params.adjusts_logits() {
            return None;
        }
        Some(match self.rule_for(params, None) {
            RowRule::Synthetic(_) | RowRule::Greedy => Reductions::default(),
            RowRule::TargetSample { relaxed } => {
                Reductions { target_sample: true, relaxed_topk: relaxed.map(|r| r.topk), ..Default::default() }
            }
            RowRule::Rejection { .. } => Reductions { target_sample: true, rejection: true, relaxed_topk: None },
        })
    }

    /// Verifies one row from its per-position reductions: the same rules, random streams and
    /// outputs as [`Self::accept_row`] on the logits the reductions came from.
    pub fn accept_reduced_row(&self, row: &ReducedRow) -> Result<VerifyOutput, ReducedError> {
        row.check()?;
        let rule = self.rule_for(row.params, None);
        let mut walk = Walk::without_penalties(row.in_thinking, self.thinking);
        for (i, (&draft, pos)) in row.drafts.iter().zip(row.positions).enumerate() {
            let counter = i as u64;
            let verdict = match rule {
                RowRule::Synthetic(synthetic) if synthetic.coin_accepts(row.seed, counter) => Verdict::Accept,
                RowRule::Greedy if draft == pos.argmax => Verdict::Accept,
                RowRule::Synthetic(_) | RowRule::Greedy => Verdict::Reject { recovered: pos.argmax },
                RowRule::TargetSample { relaxed: Some(relaxed) } if walk.in_thinking => {
                    relaxed.decide(draft, &need(pos.relaxed, i, "relaxed statistics")?)
                }
                RowRule::TargetSample { .. } => {
                    let sample = need(pos.target_sample, i, "target sample")?;
                    if sample == draft { Verdict::Accept } else { Verdict::Reject { recovered: sample } }
                }
                RowRule::Rejection { .. } => {
                    let p = need(pos.draft_p, i, "draft probability")?;
                    if stochastic::accepts_against_draft(row.seed, counter, p, pos.draft_q) {
                        Verdict::Accept
                    } else {
                        Verdict::Reject { recovered: need(pos.residual_sample, i, "residual sample")? }
                    }
                }
            };
            match verdict {
                Verdict::Accept => walk.commit_draft(draft, false),
                Verdict::AcceptRelaxed => walk.commit_draft(draft, true),
                Verdict::Reject { recovered } => return Ok(walk.finish(row.drafts, recovered, false)),
            }
        }
        let n = row.drafts.len();
        let bonus_pos = &row.positions[n];
        let bonus = match rule {
            RowRule::Synthetic(_) | RowRule::Greedy => bonus_pos.argmax,
            RowRule::TargetSample { .. } | RowRule::Rejection { .. } => {
                need(bonus_pos.target_sample, n, "target sample")?
            }
        };
        Ok(walk.finish(row.drafts, bonus, true))
    }

    fn row_rule<'a>(&self, row: &VerifyRow<'a>) -> RowRule<'a> {
        self.rule_for(row.params, row.draft_probs)
    }

    fn rule_for<'a>(&self, params: &SamplingParams, draft_probs: Option<&'a [f32]>) -> RowRule<'a> {
        if let Some(synthetic) = self.synthetic {
            return RowRule::Synthetic(synthetic);
        }
        if self.rule == AcceptanceRule::Greedy || params.is_greedy() {
            return RowRule::Greedy;
        }
        match self.draft_proposal {
            DraftProposal::Argmax => RowRule::TargetSample { relaxed: self.relaxed },
            DraftProposal::Sampled => RowRule::Rejection { draft_probs },
        }
    }

    /// Walks the row's positions in order until the first rejection, then emits the
    /// recovered token, or the bonus token when every draft was accepted. Positions past the
    /// first rejection are never processed.
    fn accept_row_with(&self, row: &VerifyRow, scratch: &mut Scratch) -> Result<VerifyOutput, VerifyError> {
        row.check(self.vocab_size)?;
        let rule = self.row_rule(row);
        let mut walk = Walk::start(row, self.thinking);
        for (i, &draft) in row.drafts.iter().enumerate() {
            let pos = walk.position(row, i, self.vocab_size);
            if !walk.allows_any_token(&pos, scratch) {
                return Ok(walk.dead_end(row.drafts));
            }
            let verdict = match rule {
                RowRule::Synthetic(synthetic) => {
                    synthetic.verify(&pos, || greedy::target_argmax(&pos, &mut scratch.workspace))
                }
                RowRule::Greedy => greedy::verify(&pos, draft, &mut scratch.workspace),
                RowRule::TargetSample { relaxed: Some(relaxed) } if walk.in_thinking => {
                    relaxed.verify(pos.logits, draft)
                }
                RowRule::TargetSample { .. } => {
                    stochastic::verify_by_target_sample(&pos, draft, &mut scratch.workspace)
                }
                RowRule::Rejection { draft_probs } => {
                    let vocab = self.vocab_size;
                    let q = draft_probs.map(|q| &q[i * vocab..(i + 1) * vocab]);
                    stochastic::verify_against_draft(&pos, draft, q, scratch)
                }
            };
            match verdict {
                Verdict::Accept => walk.commit_draft(draft, false),
                Verdict::AcceptRelaxed => walk.commit_draft(draft, true),
                Verdict::Reject { recovered } => return Ok(walk.finish(row.drafts, recovered, false)),
            }
        }
        let pos = walk.position(row, row.drafts.len(), self.vocab_size);
        if !walk.allows_any_token(&pos, scratch) {
            return Ok(walk.dead_end(row.drafts));
        }
        let bonus = match rule {
            RowRule::Synthetic(_) | RowRule::Greedy => greedy::target_argmax(&pos, &mut scratch.workspace),
            RowRule::TargetSample { .. } | RowRule::Rejection { .. } => {
                stochastic::sample_target(&pos, &mut scratch.workspace)
            }
        };
        Ok(walk.finish(row.drafts, bonus, true))
    }
}

/// What a row's walk carries from one position to the next.
struct Walk {
    /// Drafts accepted so far.
    num_accepted: usize,
    num_relaxed_accepted: usize,
    /// The reasoning phase after committing the accepted drafts.
    in_thinking: bool,
    thinking: Option<ThinkingTokens>,
    /// History plus accepted drafts, for requests that adjust their logits (an empty one for
    /// a logit bias alone: it needs no counts).
    penalties: Option<PenaltyContext>,
}

impl Walk {
    fn start(row: &VerifyRow, thinking: Option<ThinkingTokens>) -> Self {
        let context = || PenaltyContext::for_params(row.history, row.prompt_len, row.params);
        Self {
            penalties: row.params.adjusts_logits().then(context),
            ..Self::without_penalties(row.in_thinking, thinking)
        }
    }

    fn without_penalties(in_thinking: bool, thinking: Option<ThinkingTokens>) -> Self {
        Self { num_accepted: 0, num_relaxed_accepted: 0, in_thinking, thinking, penalties: None }
    }

    /// Position `index` (`[V]` logits) as seen after the drafts committed so far.
    fn position<'a>(&'a self, row: &VerifyRow<'a>, index: usize, vocab: usize) -> Position<'a> {
        Position {
            index,
            logits: &row.logits[index * vocab..(index + 1) * vocab],
            params: row.params,
            seed: row.seed,
            penalties: self.penalties.as_ref(),
        }
    }

    /// Whether the request leaves any token at `pos`. Only rows whose request masks tokens can
    /// leave none (penalties and biases are finite); the check costs them one more pass over
    /// the row, and costs the others nothing.
    fn allows_any_token(&self, pos: &Position, scratch: &mut Scratch) -> bool {
        match &self.penalties {
            Some(context) if pos.params.masks_tokens() => {
                scratch.workspace.allows_any_token(pos.logits, pos.params, Some(context))
            }
            _ => true,
        }
    }

    fn phase_after(&self, token: u32) -> bool {
        self.thinking.map_or(self.in_thinking, |t| t.after(self.in_thinking, token))
    }

    fn commit_draft(&mut self, draft: u32, relaxed: bool) {
        self.num_accepted += 1;
        self.num_relaxed_accepted += usize::from(relaxed);
        self.in_thinking = self.phase_after(draft);
        if let Some(ctx) = self.penalties.as_mut() {
            ctx.record_output(draft);
        }
    }

    /// Ends the walk over `drafts` with `next`, the recovered or bonus token.
    fn finish(self, drafts: &[u32], next: u32, next_is_bonus: bool) -> VerifyOutput {
        let mut tokens = Vec::with_capacity(self.num_accepted + 1);
        tokens.extend_from_slice(&drafts[..self.num_accepted]);
        tokens.push(next);
        VerifyOutput {
            num_drafts: drafts.len(),
            num_accepted: self.num_accepted,
            tokens,
            next_is_bonus,
            in_thinking_after: self.phase_after(next),
            num_relaxed_accepted: self.num_relaxed_accepted,
            dead_end: false,
        }
    }

    /// Ends the walk at a position where nothing is allowed, with the drafts accepted before it.
    fn dead_end(self, drafts: &[u32]) -> VerifyOutput {
        VerifyOutput {
            num_drafts: drafts.len(),
            num_accepted: self.num_accepted,
            tokens: drafts[..self.num_accepted].to_vec(),
            next_is_bonus: false,
            in_thinking_after: self.in_thinking,
            num_relaxed_accepted: self.num_relaxed_accepted,
            dead_end: true,
        }
    }
}
