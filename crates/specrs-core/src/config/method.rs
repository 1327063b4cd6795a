//! The closed vocabularies of the speculative configuration.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;

/// How drafts are produced. The first five follow Modular MAX; `Ngram` (prompt lookup) and
/// `Suffix` (vLLM's suffix decoding) are spec-rs extensions that need no draft model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SpeculativeMethod {
    Eagle,
    Mtp,
    Dflash,
    Dflash2,
    Dspark,
    Ngram,
    Suffix,
}

impl SpeculativeMethod {
    pub const ALL: [SpeculativeMethod; 7] =
        [Self::Eagle, Self::Mtp, Self::Dflash, Self::Dflash2, Self::Dspark, Self::Ngram, Self::Suffix];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Eagle => "eagle",
            Self::Mtp => "mtp",
            Self::Dflash => "dflash",
            Self::Dflash2 => "dflash2",
            Self::Dspark => "dspark",
            Self::Ngram => "ngram",
            Self::Suffix => "suffix",
        }
    }

    /// Block drafters propose a whole block per forward; the checkpoint fixes its width.
    pub fn is_block_draft(self) -> bool {
        matches!(self, Self::Dflash | Self::Dflash2 | Self::Dspark)
    }

    /// Drafts copied from earlier text rather than predicted by a model: no draft model, no
    /// draft distribution.
    pub fn is_model_free(self) -> bool {
        matches!(self, Self::Ngram | Self::Suffix)
    }

    /// The width a method drafts when `num_speculative_tokens` is unset, or `None` when the
    /// draft checkpoint decides (block drafters) or, for suffix decoding, the tree depth does.
    pub fn default_num_speculative_tokens(self) -> Option<usize> {
        match self {
            Self::Eagle | Self::Mtp => Some(2),
            // Prompt lookup drafts cost nothing to produce; four is where a verify step on the
            // default model still costs about as much as a plain decode step.
            Self::Ngram => Some(NGRAM_DEFAULT_NUM_SPECULATIVE_TOKENS),
            Self::Dflash | Self::Dflash2 | Self::Dspark | Self::Suffix => None,
        }
    }
}

/// Default draft width of the n-gram (prompt lookup) method.
pub const NGRAM_DEFAULT_NUM_SPECULATIVE_TOKENS: usize = 4;

impl fmt::Display for SpeculativeMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SpeculativeMethod {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.trim().to_ascii_lowercase();
        Self::ALL.into_iter().find(|m| m.as_str() == lower).ok_or_else(|| {
            ConfigError::field(
                "speculative_method",
                format!("unknown speculative_method '{s}'; expected one of eagle, mtp, dflash, dflash2, dspark, ngram, suffix"),
            )
        })
    }
}

/// How the drafter turns its logits into draft tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DraftProposal {
    /// Deterministic argmax drafts; verification matches a target sample.
    #[default]
    Argmax,
    /// Drafts sampled under the request's sampling parameters, keeping the draft distribution q
    /// so that verification is exact speculative (rejection) sampling.
    Sampled,
}

impl DraftProposal {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Argmax => "argmax",
            Self::Sampled => "sampled",
        }
    }
}

impl FromStr for DraftProposal {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "argmax" => Ok(Self::Argmax),
            "sampled" => Ok(Self::Sampled),
            _ => Err(ConfigError::field(
                "draft_proposal",
                format!("unknown draft_proposal '{s}'; expected 'argmax' or 'sampled'"),
            )),
        }
    }
}

/// Placement of draft-side work when the target spans several devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DraftPlacement {
    /// One copy on the first device, serving every row of the batch.
    #[default]
    Device0,
    /// One copy per data-parallel replica, each serving its own rows.
    Replica,
}

impl DraftPlacement {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Device0 => "device0",
            Self::Replica => "replica",
        }
    }

    pub fn parse(field: &str, s: &str) -> Result<Self, ConfigError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "device0" => Ok(Self::Device0),
            "replica" => Ok(Self::Replica),
            _ => Err(ConfigError::field(field, format!("unknown {field} '{s}'; expected 'device0' or 'replica'"))),
        }
    }
}
