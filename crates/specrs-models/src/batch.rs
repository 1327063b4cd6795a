//! The ragged batch a forward pass runs: each row brings its own query tokens (a prefill
//! chunk, one decode token, or the last token plus drafts to verify) at its own positions,
//! attending to its own cached context through its block table.

/// Which keys a query token attends to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AttentionMask {
    /// Each query sees every earlier key of its row and itself.
    #[default]
    Causal,
    /// Each query sees its row's cached context and every query token of its row, earlier
    /// or later (DFlash-style block drafting).
    BlockNonCausal,
}

/// One row of the batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchRow {
    /// First query token of the row in the flat batch.
    pub query_start: usize,
    /// Query tokens of the row this step.
    pub query_len: usize,
    /// Keys the row holds once this step's tokens are written (cached + query_len).
    pub context_len: usize,
    /// Range of this row's block table inside [`ForwardBatch::block_tables`].
    pub block_table_start: usize,
    pub block_table_len: usize,
}

impl BatchRow {
    /// Keys cached before this step.
    pub fn cached_len(&self) -> usize {
        self.context_len - self.query_len
    }
}

/// Everything one forward pass needs besides the weights and the KV storage.
#[derive(Debug, Clone, Default)]
pub struct ForwardBatch {
    /// `[T]` token ids, rows back to back.
    pub input_ids: Vec<u32>,
    /// `[T]` RoPE positions.
    pub positions: Vec<u32>,
    pub rows: Vec<BatchRow>,
    /// `[T]` KV slot each query token's key and value are written to.
    pub slot_mapping: Vec<u32>,
    /// All rows' block tables back to back.
    pub block_tables: Vec<u32>,
    pub block_size: usize,
    /// Flat token indices whose logits are wanted, in output order.
    pub logits_indices: Vec<u32>,
    /// Hugging Face `hidden_states` indices to return (0 = embeddings, i = output of layer
    /// i - 1, num_layers = the final normed hidden state, as in transformers).
    pub taps: Vec<usize>,
    /// Return the final normed hidden state of every token.
    pub want_final_hidden: bool,
    pub mask: AttentionMask,
    /// Keys further than this behind a query are invisible (sliding-window attention).
    pub sliding_window: Option<usize>,
    /// Queries see only the keys of their own chunk of this many positions (Llama 4's chunked
    /// attention: key `x` is visible to a query at `p` when `x / chunk == p / chunk`).
    pub attention_chunk: Option<usize>,
}

impl ForwardBatch {
    /// The sliding window and the attention chunk, as `attention::visible_keys` takes them.
    pub fn key_limits(&self) -> (Option<usize>, Option<usize>) {
        (self.sliding_window, self.attention_chunk)
    }

    pub fn num_tokens(&self) -> usize {
        self.input_ids.len()
    }

    pub fn row_block_table(&self, row: &BatchRow) -> &[u32] {
        &self.block_tables[row.block_table_start..row.block_table_start + row.block_table_len]
    }

    /// Checks the invariants the kernels rely on; a violation is a bug in the caller.
    pub fn validate(&self) -> candle_core::Result<()> {
        let t = self.input_ids.len();
        if self.positions.len() != t || self.slot_mapping.len() != t {
            candle_core::bail!(
                "ForwardBatch: {} tokens but {} positions and {} slots",
                t,
                self.positions.len(),
                self.slot_mapping.len()
            );
        }
        let mut expected_start = 0;
        for (i, r) in self.rows.iter().enumerate() {
            if r.query_start != expected_start || r.query_len > r.context_len {
                candle_core::bail!("ForwardBatch: row {i} is inconsistent: {r:?}");
            }
            if r.block_table_start + r.block_table_len > self.block_tables.len()
                || r.block_table_len * self.block_size < r.context_len
            {
                candle_core::bail!("ForwardBatch: row {i} block table too short for {} keys", r.context_len);
            }
            expected_start += r.query_len;
        }
        if self.attention_chunk == Some(0) {
            candle_core::bail!("ForwardBatch: an attention chunk must hold at least one position");
        }
        if expected_start != t {
            candle_core::bail!("ForwardBatch: rows cover {expected_start} tokens of {t}");
        }
        if let Some(&bad) = self.logits_indices.iter().find(|&&i| i as usize >= t) {
            candle_core::bail!("ForwardBatch: logits index {bad} out of {t} tokens");
        }
        Ok(())
    }
}
