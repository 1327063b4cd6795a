//! Sampling on slices: request parameters, counter-based random numbers, logit processing
//! and draws from the processed distribution.
//!
//! One position is processed as logit bias → allowed tokens → penalties → bad words →
//! temperature → top-k → top-p → min-p → renormalise ([`SamplingWorkspace::processed_probs`])
//! and sampled by inverse CDF with one uniform ([`sample_inverse_cdf`]) from a pure `(seed, stream, counter)` generator
//! ([`uniform`]). Plain decoding and every acceptance rule go through these functions, so a
//! sampled token means the same thing on every path.

mod bad_words;
mod distribution;
mod exp;
mod logits;
mod params;
mod penalties;
mod rng;
mod truncation;

pub use bad_words::{OutputTail, bad_word_token_ids};
pub use distribution::{SamplingWorkspace, first_token_allowed, processed_probs, sample_inverse_cdf};
pub use logits::{argmax, log_softmax_in_place, logprobs_of, logsumexp, max_value, rank_of, softmax_in_place, top_n};
pub use params::{GREEDY_TEMPERATURE, MAX_ABS_ADDITIVE_PENALTY, MAX_LOGPROBS, SamplingParams, choice_seed};
pub use penalties::PenaltyContext;
pub use rng::{GOLDEN_GAMMA, RngStream, random_bits, splitmix64_mix, uniform};
