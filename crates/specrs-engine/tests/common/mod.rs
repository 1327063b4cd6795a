//! Tiny checkpoints in their real formats, shared by the integration tests that compare
//! engines with each other (`device_paths`, `data_parallel`).

// Each test binary compiles this module and reads its own subset of it.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::Tensor;
use specrs_core::SpeculativeConfig;
use specrs_core::config::SpeculativeMethod;
use specrs_models::config::Architecture;
use specrs_models::testing::{self, TinyShape};

pub const SHAPE: TinyShape =
    TinyShape { vocab: 48, hidden: 64, layers: 3, heads: 4, kv_heads: 2, head_dim: 16, intermediate: 64 };

pub fn write(dir: &Path, cfg: &serde_json::Value, tensors: &HashMap<String, Tensor>) {
    testing::write_checkpoint(dir, cfg, tensors).unwrap();
}

/// Targets and drafters written once into a temporary directory.
pub struct Checkpoints {
    pub dir: tempfile::TempDir,
    /// A target whose next token is a fixed function of the last (the oracles predict it).
    pub bigram: PathBuf,
    /// A random target with tied embeddings.
    pub random: PathBuf,
    pub eagle3: PathBuf,
    pub mtp: PathBuf,
    /// A random EAGLE-1 head the random target mostly rejects.
    pub random_eagle1: PathBuf,
    /// Flat target and draft distributions (small output head, small draft weights): the
    /// rejection numbers depend on `q`, so a row verified against the wrong distribution or the
    /// wrong logit row changes the tokens (with near one-hot `p` and `q` they would not).
    pub soft: PathBuf,
    pub soft_eagle1: PathBuf,
    /// The soft target's tensors, for drafters that carry copies of its embedding.
    pub soft_target: HashMap<String, Tensor>,
}

impl Checkpoints {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let bigram = root.join("bigram");
        write(
            &bigram,
            &testing::target_config(Architecture::Llama, &SHAPE, false),
            &testing::bigram_target(Architecture::Llama, &SHAPE).unwrap(),
        );
        let random = root.join("random");
        write(
            &random,
            &testing::target_config(Architecture::Llama, &SHAPE, true),
            &testing::random_target(Architecture::Llama, &SHAPE, true, 3).unwrap(),
        );
        let eagle3 = root.join("eagle3");
        let (c, t) = testing::eagle3_oracle(&SHAPE, [1, 2, 3]).unwrap();
        write(&eagle3, &c, &t);
        let mtp = root.join("mtp");
        let (c, t) = testing::mtp_oracle(&SHAPE).unwrap();
        write(&mtp, &c, &t);
        let random_eagle1 = root.join("random-eagle1");
        let (c, t) = testing::eagle1_oracle(&SHAPE).unwrap();
        write(&random_eagle1, &c, &testing::randomized(t, 0.3, 100).unwrap());
        let soft = root.join("soft");
        let soft_target = testing::soft_target(&SHAPE, 5).unwrap();
        write(&soft, &testing::target_config(Architecture::Llama, &SHAPE, false), &soft_target);
        let soft_eagle1 = root.join("soft-eagle1");
        let (c, t) = testing::eagle1_oracle(&SHAPE).unwrap();
        write(&soft_eagle1, &c, &testing::randomized(t, 0.02, 200).unwrap());
        Self { dir, bigram, random, eagle3, mtp, random_eagle1, soft, soft_eagle1, soft_target }
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }
}

/// `K` drafts of `method` (n-gram lookups from one token on), adjusted by `f`.
pub fn spec(method: SpeculativeMethod, k: i64, f: impl FnOnce(&mut SpeculativeConfig)) -> SpeculativeConfig {
    let mut c = SpeculativeConfig {
        speculative_method: Some(method),
        num_speculative_tokens: Some(k),
        prompt_lookup_min: 1,
        ..SpeculativeConfig::default()
    };
    f(&mut c);
    c
}
