//! Paged KV-cache bookkeeping: which fixed-size blocks of the KV pool each sequence owns.
//!
//! The tensors live in `specrs-models`; this module only hands out block ids and turns a
//! sequence position into a *slot*, the row of the flat KV storage that position's keys and
//! values occupy: `slot = block_id * block_size + pos % block_size`.
//!
//! Contract:
//! - Every block is on the free list, parked in the prefix cache (cached content no table
//!   holds, see [`crate::prefix_cache`]), or held by one or more sequences' [`BlockTable`]s.
//!   Only cached full blocks are held by several tables, and none of them writes there: a
//!   sequence writes only at positions past the blocks it adopted or had cached.
//! - A table holding `len` tokens owns exactly `ceil(len / block_size)` blocks, so its
//!   capacity is the smallest multiple of `block_size` that is `>= len`.
//! - [`KvBlockManager::grow`] is all-or-nothing: when the pool cannot cover the new length it
//!   fails with [`KvError::OutOfBlocks`] and changes nothing, so the scheduler can try a
//!   narrower verify width or preempt a sequence without undoing half an allocation.
//! - [`KvBlockManager::truncate`] is the rollback of rejected drafts: it sets the length and
//!   frees only the blocks past the new end, costing O(freed blocks), never a copy.
//!
//! The free list is LIFO so a block freed by a rollback is the next one handed out: it is
//! still warm in cache, and a decode step that rolls back and regrows reuses the same block.
//! Parked cached blocks are handed out only when the free list is empty, the least recently
//! released first, and count as free everywhere else.

use std::collections::HashMap;
use std::ops::Range;

use thiserror::Error;

use crate::prefix_cache::{BlockHash, PrefixIndex};

/// Identifies a sequence (one request's row) in the block manager.
pub type SeqId = u64;

/// Index of a block in the KV pool.
pub type BlockId = u32;

/// Errors of KV block bookkeeping and memory planning.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KvError {
    #[error(
        "sequence {seq} needs {needed} more KV blocks to grow from {current_len} to {new_len} tokens, but only {free} are free"
    )]
    OutOfBlocks { seq: SeqId, current_len: usize, new_len: usize, needed: usize, free: usize },
    #[error("KV block {block} was freed twice")]
    DoubleFree { block: BlockId },
    #[error("KV block {block} does not exist: the pool has {num_blocks} blocks")]
    UnknownBlock { block: BlockId, num_blocks: usize },
    #[error("KV cache has no sequence {seq}")]
    UnknownSequence { seq: SeqId },
    #[error("position {pos} of sequence {seq} is past its KV capacity of {capacity} tokens; grow the sequence first")]
    PositionOutOfRange { seq: SeqId, pos: usize, capacity: usize },
    #[error("cannot truncate sequence {seq} to {len} tokens: it holds only {current_len}; use grow to lengthen it")]
    TruncateBeyondLength { seq: SeqId, len: usize, current_len: usize },
    #[error("KV cache parameter {name} must be at least 1")]
    ZeroParameter { name: &'static str },
    #[error("sequence {seq} cannot adopt a cached prefix: it already holds KV blocks")]
    AdoptIntoHeldSequence { seq: SeqId },
    #[error("sequence {seq} cannot adopt KV block {block}: it is neither cached nor held")]
    AdoptUncachedBlock { seq: SeqId, block: BlockId },
    #[error(
        "a KV pool of {num_blocks} blocks of {block_size} tokens has more slots than a u32 slot index can address; lower the memory budget or the block size"
    )]
    TooManySlots { num_blocks: usize, block_size: usize },
    #[error(
        "the KV cache budget of {budget} holds {num_blocks} blocks of {block_size} tokens at {bytes_per_token} bytes per token, but one sequence of max_model_len={max_model_len} tokens needs {blocks_per_sequence} blocks; raise the KV memory budget, lower max_model_len, or store the KV cache in a smaller dtype"
    )]
    BudgetTooSmall {
        budget: ByteSize,
        bytes_per_token: u64,
        block_size: usize,
        num_blocks: usize,
        max_model_len: usize,
        blocks_per_sequence: usize,
    },
}

/// A byte count that displays as `1610612736 bytes (1.50 GiB)`, so messages stay exact and
/// readable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteSize(pub u64);

impl std::fmt::Display for ByteSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const GIB: f64 = (1u64 << 30) as f64;
        const MIB: f64 = (1u64 << 20) as f64;
        let bytes = self.0 as f64;
        if bytes >= GIB {
            write!(f, "{} bytes ({:.2} GiB)", self.0, bytes / GIB)
        } else {
            write!(f, "{} bytes ({:.2} MiB)", self.0, bytes / MIB)
        }
    }
}

/// A fixed pool of `num_blocks` blocks of `block_size` tokens each, with a LIFO free list.
#[derive(Debug, Clone)]
pub struct BlockAllocator {
    block_size: usize,
    /// Stack of free block ids; the top is the most recently freed (warmest) block.
    free_list: Vec<BlockId>,
    /// `is_free[b]` mirrors membership of `b` in `free_list`, making double frees detectable
    /// in O(1).
    is_free: Vec<bool>,
}

impl BlockAllocator {
    /// A pool whose blocks are all free. Block 0 is handed out first.
    pub fn new(num_blocks: usize, block_size: usize) -> Result<Self, KvError> {
        if block_size == 0 {
            return Err(KvError::ZeroParameter { name: "block_size" });
        }
        // Slots are u32 in the attention kernels' slot mapping; every slot must fit.
        let num_slots = num_blocks as u128 * block_size as u128;
        if num_slots > u128::from(u32::MAX) + 1 {
            return Err(KvError::TooManySlots { num_blocks, block_size });
        }
        // num_blocks <= 2^32 / block_size, so every id fits in a u32.
        let free_list = (0..num_blocks).rev().map(|b| b as BlockId).collect();
        Ok(Self { block_size, free_list, is_free: vec![true; num_blocks] })
    }

    /// Takes a free block, the most recently freed one first.
    pub fn allocate(&mut self) -> Option<BlockId> {
        let block = self.free_list.pop()?;
        debug_assert!(self.is_free[block as usize], "free list held a used block");
        self.is_free[block as usize] = false;
        Some(block)
    }

    /// Takes `count` blocks, or none at all when fewer are free.
    pub fn allocate_many(&mut self, count: usize) -> Option<Vec<BlockId>> {
        if count > self.num_free() {
            return None;
        }
        let blocks: Vec<BlockId> = (0..count).filter_map(|_| self.allocate()).collect();
        debug_assert_eq!(blocks.len(), count);
        Some(blocks)
    }

    /// Returns a block to the pool. Freeing a free or nonexistent block is an error and leaves
    /// the pool unchanged.
    pub fn free(&mut self, block: BlockId) -> Result<(), KvError> {
        match self.is_free.get_mut(block as usize) {
            None => Err(KvError::UnknownBlock { block, num_blocks: self.num_total() }),
            Some(true) => Err(KvError::DoubleFree { block }),
            Some(is_free) => {
                *is_free = true;
                self.free_list.push(block);
                Ok(())
            }
        }
    }

    pub fn num_free(&self) -> usize {
        self.free_list.len()
    }

    pub fn num_total(&self) -> usize {
        self.is_free.len()
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }
}

/// The blocks one sequence owns, in position order, and how many KV tokens they hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlockTable {
    blocks: Vec<BlockId>,
    len: usize,
}

impl BlockTable {
    /// Block ids in position order: position `p` lives in `blocks()[p / block_size]`.
    pub fn blocks(&self) -> &[BlockId] {
        &self.blocks
    }

    /// Number of KV tokens the sequence holds.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions the owned blocks can hold.
    pub fn capacity(&self, block_size: usize) -> usize {
        self.blocks.len() * block_size
    }
}

/// Blocks needed to hold `len` tokens.
fn blocks_for(len: usize, block_size: usize) -> usize {
    len.div_ceil(block_size)
}

/// Every sequence's block table over one shared [`BlockAllocator`], with the prefix cache's
/// index of reusable full blocks.
#[derive(Debug, Clone)]
pub struct KvBlockManager {
    allocator: BlockAllocator,
    tables: HashMap<SeqId, BlockTable>,
    /// Tables holding each block.
    holders: Vec<u32>,
    prefix: PrefixIndex,
    prefix_caching: bool,
}

impl KvBlockManager {
    pub fn new(num_blocks: usize, block_size: usize) -> Result<Self, KvError> {
        Ok(Self::with_allocator(BlockAllocator::new(num_blocks, block_size)?))
    }

    /// A manager over the pool a [`KvPlan`] sized.
    pub fn from_plan(plan: &KvPlan) -> Result<Self, KvError> {
        Self::new(plan.num_blocks, plan.block_size)
    }

    pub fn with_allocator(allocator: BlockAllocator) -> Self {
        let holders = vec![0; allocator.num_total()];
        Self { allocator, tables: HashMap::new(), holders, prefix: PrefixIndex::default(), prefix_caching: false }
    }

    /// Keeps full blocks for reuse by later sequences with the same prefix
    /// ([`Self::cache_block`], [`Self::cached_prefix`]). Off, both do nothing.
    pub fn with_prefix_caching(mut self, enabled: bool) -> Self {
        self.prefix_caching = enabled;
        self
    }

    pub fn prefix_caching(&self) -> bool {
        self.prefix_caching
    }

    pub fn block_size(&self) -> usize {
        self.allocator.block_size()
    }

    /// Blocks a sequence may take: the free list and the parked cached blocks.
    pub fn num_free_blocks(&self) -> usize {
        self.allocator.num_free() + self.prefix.num_idle()
    }

    /// Blocks whose content is cached, held or parked.
    pub fn num_cached_blocks(&self) -> usize {
        self.prefix.num_cached()
    }

    pub fn num_total_blocks(&self) -> usize {
        self.allocator.num_total()
    }

    /// Sequences holding a table (including ones truncated to zero tokens).
    pub fn num_sequences(&self) -> usize {
        self.tables.len()
    }

    pub fn contains(&self, seq: SeqId) -> bool {
        self.tables.contains_key(&seq)
    }

    /// New blocks a sequence of `current_len` tokens needs to hold `new_len`; 0 when
    /// shrinking or staying within its capacity.
    pub fn blocks_needed(&self, current_len: usize, new_len: usize) -> usize {
        let block_size = self.block_size();
        blocks_for(new_len, block_size).saturating_sub(blocks_for(current_len, block_size))
    }

    /// KV tokens a sequence holds; 0 for an unknown sequence.
    pub fn len(&self, seq: SeqId) -> usize {
        self.tables.get(&seq).map_or(0, BlockTable::len)
    }

    /// Positions a sequence can hold without allocating; 0 for an unknown sequence.
    pub fn capacity(&self, seq: SeqId) -> usize {
        self.tables.get(&seq).map_or(0, |table| table.capacity(self.block_size()))
    }

    /// A sequence's block ids in position order; empty for an unknown sequence.
    pub fn block_table(&self, seq: SeqId) -> &[BlockId] {
        self.tables.get(&seq).map_or(&[], |table| table.blocks())
    }

    /// Whether [`grow`](Self::grow) to `new_len` would succeed now.
    pub fn can_grow(&self, seq: SeqId, new_len: usize) -> bool {
        self.blocks_needed(self.len(seq), new_len) <= self.num_free_blocks()
    }

    /// Makes `seq` hold `new_len` tokens, allocating blocks as needed; registers an unknown
    /// sequence. Never shrinks: a `new_len` below the current length leaves the sequence as
    /// it is (use [`truncate`](Self::truncate) to roll back). On [`KvError::OutOfBlocks`]
    /// nothing changes.
    pub fn grow(&mut self, seq: SeqId, new_len: usize) -> Result<(), KvError> {
        let current_len = self.len(seq);
        if new_len <= current_len {
            // Registering here keeps "grow(seq, 0) makes seq known" true for new sequences.
            self.tables.entry(seq).or_default();
            return Ok(());
        }
        let needed = self.blocks_needed(current_len, new_len);
        let new_blocks = self.take_blocks(needed).ok_or_else(|| KvError::OutOfBlocks {
            seq,
            current_len,
            new_len,
            needed,
            free: self.num_free_blocks(),
        })?;
        let table = self.tables.entry(seq).or_default();
        table.blocks.extend(new_blocks);
        table.len = new_len;
        debug_assert_eq!(table.blocks.len(), blocks_for(new_len, self.allocator.block_size()));
        Ok(())
    }

    /// Rolls `seq` back to `len` tokens (rejected drafts), freeing the blocks past
    /// `ceil(len / block_size)`. Returns the number of blocks freed.
    pub fn truncate(&mut self, seq: SeqId, len: usize) -> Result<usize, KvError> {
        let block_size = self.allocator.block_size();
        let table = self.tables.get_mut(&seq).ok_or(KvError::UnknownSequence { seq })?;
        if len > table.len {
            return Err(KvError::TruncateBeyondLength { seq, len, current_len: table.len });
        }
        let freed = table.blocks.split_off(blocks_for(len, block_size));
        table.len = len;
        self.let_go(&freed);
        Ok(freed.len())
    }

    /// Frees every block of `seq` and forgets it. Returns the number of blocks freed; an
    /// unknown sequence frees nothing.
    pub fn release(&mut self, seq: SeqId) -> usize {
        let Some(table) = self.tables.remove(&seq) else {
            return 0;
        };
        self.let_go(&table.blocks);
        table.blocks.len()
    }

    /// The longest run of cached blocks that starts the sequence keyed `hashes`, in order.
    /// Empty with prefix caching off.
    pub fn cached_prefix(&self, hashes: &[BlockHash]) -> Vec<BlockId> {
        if !self.prefix_caching {
            return Vec::new();
        }
        hashes.iter().map_while(|h| self.prefix.lookup(h)).collect()
    }

    /// How many of `blocks` are parked: adopting them takes that many from
    /// [`Self::num_free_blocks`].
    pub fn num_parked(&self, blocks: &[BlockId]) -> usize {
        blocks.iter().filter(|&&b| self.holders.get(b as usize) == Some(&0)).count()
    }

    /// Starts `seq` (holding nothing yet) on a cached prefix from [`Self::cached_prefix`]: it
    /// holds `blocks` and `blocks.len() * block_size` tokens of KV it never computed.
    pub fn adopt_prefix(&mut self, seq: SeqId, blocks: &[BlockId]) -> Result<(), KvError> {
        if self.tables.get(&seq).is_some_and(|t| !t.blocks.is_empty()) {
            return Err(KvError::AdoptIntoHeldSequence { seq });
        }
        if let Some(&block) = blocks.iter().find(|&&b| !self.prefix.is_cached(b) || (b as usize) >= self.holders.len())
        {
            return Err(KvError::AdoptUncachedBlock { seq, block });
        }
        for &block in blocks {
            if self.holders[block as usize] == 0 {
                let parked = self.prefix.unpark(block);
                debug_assert!(parked, "an unheld cached block is parked");
            }
            self.holders[block as usize] += 1;
        }
        let table = self.tables.entry(seq).or_default();
        table.blocks = blocks.to_vec();
        table.len = blocks.len() * self.allocator.block_size();
        Ok(())
    }

    /// Caches block `index` of `seq` under `hash`, the key of the tokens it holds (with the one
    /// after): its keys and values must be final for every model sharing the tables. Returns
    /// whether it was newly cached (not when caching is off, the block is already cached, or
    /// another block already holds the same content).
    pub fn cache_block(&mut self, seq: SeqId, index: usize, hash: BlockHash) -> bool {
        let block_size = self.block_size();
        match self.tables.get(&seq) {
            Some(table) if self.prefix_caching && (index + 1) * block_size <= table.len => {
                self.prefix.insert(hash, table.blocks[index])
            }
            _ => false,
        }
    }

    /// Forgets every cached prefix (vLLM's `reset_prefix_cache`): parked blocks become free,
    /// held ones stay with their sequences, uncached. Returns how many blocks were cached.
    pub fn reset_prefix_cache(&mut self) -> usize {
        let cached = self.prefix.num_cached();
        for block in self.prefix.clear() {
            if let Err(error) = self.allocator.free(block) {
                debug_assert!(false, "freeing a parked block failed: {error}");
                tracing::error!("KV bookkeeping corrupt: {error}");
            }
        }
        cached
    }

    /// The KV storage row of position `pos` of `seq`.
    pub fn slot(&self, seq: SeqId, pos: usize) -> Result<u32, KvError> {
        let table = self.tables.get(&seq).ok_or(KvError::UnknownSequence { seq })?;
        let block_size = self.block_size();
        let block = table.blocks.get(pos / block_size).ok_or(KvError::PositionOutOfRange {
            seq,
            pos,
            capacity: table.capacity(block_size),
        })?;
        let slot = u64::from(*block) * block_size as u64 + (pos % block_size) as u64;
        // The allocator refuses pools of more than 2^32 slots, so every slot fits a u32.
        debug_assert!(slot <= u64::from(u32::MAX), "slot {slot} overflows u32");
        Ok(slot as u32)
    }

    /// The slots of positions `positions` of `seq`, in order (e.g. the verify span
    /// `[last token + drafts]`).
    pub fn slots(&self, seq: SeqId, positions: Range<usize>) -> Result<Vec<u32>, KvError> {
        positions.map(|pos| self.slot(seq, pos)).collect()
    }

    /// `count` blocks for new content, held once: from the free list, then by evicting the
    /// least recently released parked blocks. None at all when fewer are available.
    fn take_blocks(&mut self, count: usize) -> Option<Vec<BlockId>> {
        if count > self.num_free_blocks() {
            return None;
        }
        let from_free = count.min(self.allocator.num_free());
        let mut blocks = self.allocator.allocate_many(from_free)?;
        blocks.extend((from_free..count).filter_map(|_| self.prefix.evict_oldest()));
        debug_assert_eq!(blocks.len(), count);
        for &block in &blocks {
            self.holders[block as usize] = 1;
        }
        Some(blocks)
    }

    /// A table lets go of `blocks`: each no other table holds is parked when cached, freed
    /// otherwise. They were held, so failure means the bookkeeping is corrupt: loud in debug
    /// builds, logged (and the block left out of the pool) in release.
    fn let_go(&mut self, blocks: &[BlockId]) {
        // Pushed last block first, so the LIFO list hands a regrowing sequence the same
        // blocks in the same order.
        for &block in blocks.iter().rev() {
            let holders = &mut self.holders[block as usize];
            debug_assert!(*holders > 0, "letting go of unheld block {block}");
            *holders = holders.saturating_sub(1);
            if *holders > 0 {
                continue;
            }
            if self.prefix.is_cached(block) {
                self.prefix.park(block);
            } else if let Err(error) = self.allocator.free(block) {
                debug_assert!(false, "freeing an owned block failed: {error}");
                tracing::error!("KV bookkeeping corrupt: {error}");
            }
        }
    }
}

/// How much KV pool a memory budget buys.
///
/// The budget is the memory reserved for paged KV storage only: K and V of every layer of
/// every model that indexes KV through these block tables. When a drafter keeps its own KV
/// through the same tables (EAGLE, MTP), add its per-token bytes into `bytes_per_token`.
/// Weights, activations, logits, sampling buffers, CUDA graphs and allocator slack are not
/// part of it: subtract them from device memory before planning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvPlan {
    pub num_blocks: usize,
    pub block_size: usize,
    pub bytes_per_token: u64,
    pub bytes_per_block: u64,
    /// Bytes the pool occupies: `num_blocks * bytes_per_block`, at most the budget.
    pub total_bytes: u64,
    /// Blocks one sequence of `max_model_len` tokens needs.
    pub blocks_per_sequence: usize,
    /// Sequences of `max_model_len` tokens the pool holds at once (vLLM's "maximum
    /// concurrency"); shorter sequences fit more.
    pub max_full_length_sequences: usize,
}

/// Bytes of KV cache one token occupies: K and V for every layer.
/// Saturates instead of overflowing, which then plans zero blocks.
pub fn kv_bytes_per_token(num_layers: usize, num_kv_heads: usize, head_dim: usize, dtype_bytes: usize) -> u64 {
    const K_AND_V: u64 = 2;
    [num_layers, num_kv_heads, head_dim, dtype_bytes]
        .into_iter()
        .fold(K_AND_V, |bytes, factor| bytes.saturating_mul(factor as u64))
}

/// Sizes the KV pool for a budget of `budget_bytes` (see [`KvPlan`] for what it covers).
///
/// The pool never exceeds what `max_num_seqs` sequences of `max_model_len` tokens can use
/// together, since more blocks could never be allocated. `max_model_len` is the longest KV
/// length one sequence may hold, including the draft positions a verify step writes past the
/// committed tokens. Fails when the budget cannot hold even one such sequence.
pub fn plan_kv_blocks(
    budget_bytes: u64,
    bytes_per_token: u64,
    block_size: usize,
    max_model_len: usize,
    max_num_seqs: usize,
) -> Result<KvPlan, KvError> {
    if bytes_per_token == 0 {
        return Err(KvError::ZeroParameter { name: "bytes_per_token" });
    }
    for (name, value) in [("block_size", block_size), ("max_model_len", max_model_len), ("max_num_seqs", max_num_seqs)]
    {
        if value == 0 {
            return Err(KvError::ZeroParameter { name });
        }
    }
    let bytes_per_block = bytes_per_token.saturating_mul(block_size as u64);
    let blocks_per_sequence = blocks_for(max_model_len, block_size);
    let affordable = usize::try_from(budget_bytes / bytes_per_block).unwrap_or(usize::MAX);
    if affordable < blocks_per_sequence {
        return Err(KvError::BudgetTooSmall {
            budget: ByteSize(budget_bytes),
            bytes_per_token,
            block_size,
            num_blocks: affordable,
            max_model_len,
            blocks_per_sequence,
        });
    }
    let usable = blocks_per_sequence.saturating_mul(max_num_seqs);
    let num_blocks = affordable.min(usable);
    Ok(KvPlan {
        num_blocks,
        block_size,
        bytes_per_token,
        bytes_per_block,
        total_bytes: num_blocks as u64 * bytes_per_block,
        blocks_per_sequence,
        max_full_length_sequences: num_blocks / blocks_per_sequence,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use proptest::prelude::*;

    use super::*;

    fn manager(num_blocks: usize, block_size: usize) -> KvBlockManager {
        KvBlockManager::new(num_blocks, block_size).unwrap()
    }

    #[test]
    fn allocator_hands_out_block_zero_first_and_reuses_the_last_freed() {
        let mut pool = BlockAllocator::new(4, 16).unwrap();
        assert_eq!(pool.allocate(), Some(0));
        assert_eq!(pool.allocate(), Some(1));
        assert_eq!(pool.allocate(), Some(2));
        pool.free(0).unwrap();
        pool.free(2).unwrap();
        assert_eq!(pool.allocate(), Some(2));
        assert_eq!(pool.allocate(), Some(0));
        assert_eq!(pool.allocate(), Some(3));
        assert_eq!(pool.allocate(), None);
        assert_eq!((pool.num_free(), pool.num_total()), (0, 4));
    }

    #[test]
    fn allocator_rejects_double_and_unknown_frees_without_changing_the_pool() {
        let mut pool = BlockAllocator::new(2, 4).unwrap();
        let block = pool.allocate().unwrap();
        pool.free(block).unwrap();
        assert_eq!(pool.free(block), Err(KvError::DoubleFree { block }));
        assert_eq!(pool.free(7), Err(KvError::UnknownBlock { block: 7, num_blocks: 2 }));
        assert_eq!(pool.num_free(), 2);
    }

    #[test]
    fn allocate_many_is_all_or_nothing() {
        let mut pool = BlockAllocator::new(3, 4).unwrap();
        assert_eq!(pool.allocate_many(4), None);
        assert_eq!(pool.num_free(), 3);
        assert_eq!(pool.allocate_many(3), Some(vec![0, 1, 2]));
        assert_eq!(pool.allocate_many(0), Some(vec![]));
    }

    #[test]
    fn allocator_refuses_zero_block_size_and_unaddressable_pools() {
        assert_eq!(BlockAllocator::new(4, 0).unwrap_err(), KvError::ZeroParameter { name: "block_size" });
        // 2^16 blocks of 2^16 tokens is exactly 2^32 slots: the last one is u32::MAX.
        let mut largest = KvBlockManager::new(1 << 16, 1 << 16).unwrap();
        largest.grow(1, 1 << 32).unwrap();
        assert_eq!(largest.slot(1, (1 << 32) - 1), Ok(u32::MAX));
        assert!(matches!(BlockAllocator::new((1 << 16) + 1, 1 << 16), Err(KvError::TooManySlots { .. })));
    }

    #[test]
    fn grow_allocates_ceil_len_over_block_size_blocks() {
        let mut kv = manager(8, 4);
        kv.grow(7, 5).unwrap();
        assert_eq!(kv.block_table(7), &[0, 1]);
        assert_eq!((kv.len(7), kv.capacity(7)), (5, 8));
        kv.grow(7, 8).unwrap();
        assert_eq!(kv.block_table(7), &[0, 1], "growing within capacity allocates nothing");
        kv.grow(7, 9).unwrap();
        assert_eq!(kv.block_table(7), &[0, 1, 2]);
        assert_eq!(kv.num_free_blocks(), 5);
    }

    #[test]
    fn grow_never_shrinks_and_registers_new_sequences() {
        let mut kv = manager(4, 4);
        kv.grow(1, 6).unwrap();
        kv.grow(1, 2).unwrap();
        assert_eq!(kv.len(1), 6);
        kv.grow(2, 0).unwrap();
        assert!(kv.contains(2));
        assert_eq!((kv.num_sequences(), kv.len(2), kv.block_table(2)), (2, 0, &[][..]));
    }

    #[test]
    fn failed_grow_changes_nothing_and_reports_context() {
        let mut kv = manager(3, 4);
        kv.grow(1, 8).unwrap();
        let err = kv.grow(1, 17).unwrap_err();
        assert_eq!(err, KvError::OutOfBlocks { seq: 1, current_len: 8, new_len: 17, needed: 3, free: 1 });
        assert_eq!(
            err.to_string(),
            "sequence 1 needs 3 more KV blocks to grow from 8 to 17 tokens, but only 1 are free"
        );
        assert_eq!((kv.len(1), kv.block_table(1), kv.num_free_blocks()), (8, &[0, 1][..], 1));
        assert!(!kv.can_grow(1, 17));
        assert!(kv.can_grow(1, 12));
        assert!(kv.grow(2, 5).is_err());
        assert!(!kv.contains(2), "a failed first grow must not register the sequence");
    }

    #[test]
    fn truncate_rolls_back_rejected_drafts_and_frees_trailing_blocks() {
        let mut kv = manager(8, 4);
        // 6 committed tokens + a verify span of 5 (last token + 4 drafts) -> 10 positions.
        kv.grow(3, 6).unwrap();
        kv.grow(3, 10).unwrap();
        assert_eq!(kv.block_table(3), &[0, 1, 2]);
        // One draft accepted + bonus: 8 tokens committed.
        assert_eq!(kv.truncate(3, 8), Ok(1));
        assert_eq!((kv.len(3), kv.block_table(3)), (8, &[0, 1][..]));
        assert_eq!(kv.truncate(3, 7), Ok(0), "still inside the second block");
        assert_eq!(kv.truncate(3, 0), Ok(2));
        assert!(kv.contains(3));
        assert_eq!(kv.num_free_blocks(), 8);
        // Freed blocks go back warmest-first: regrowing gets the same blocks in order.
        kv.grow(3, 10).unwrap();
        assert_eq!(kv.block_table(3), &[0, 1, 2]);
    }

    #[test]
    fn truncate_refuses_to_lengthen_or_touch_unknown_sequences() {
        let mut kv = manager(4, 4);
        kv.grow(1, 3).unwrap();
        assert_eq!(kv.truncate(1, 4), Err(KvError::TruncateBeyondLength { seq: 1, len: 4, current_len: 3 }));
        assert_eq!(kv.truncate(9, 0), Err(KvError::UnknownSequence { seq: 9 }));
        assert_eq!(kv.len(1), 3);
    }

    #[test]
    fn release_frees_everything_and_unknown_sequences_are_a_no_op() {
        let mut kv = manager(4, 2);
        kv.grow(1, 5).unwrap();
        assert_eq!(kv.release(1), 3);
        assert_eq!(kv.release(1), 0);
        assert_eq!(kv.release(42), 0);
        assert_eq!((kv.num_free_blocks(), kv.num_sequences()), (4, 0));
    }

    #[test]
    fn slots_map_positions_through_the_block_table() {
        let mut kv = manager(8, 4);
        kv.grow(1, 4).unwrap(); // block 0
        kv.grow(2, 4).unwrap(); // block 1
        kv.grow(1, 6).unwrap(); // block 2
        assert_eq!(kv.block_table(1), &[0, 2]);
        assert_eq!(kv.slot(1, 3), Ok(3));
        assert_eq!(kv.slot(1, 4), Ok(8));
        assert_eq!(kv.slot(1, 7), Ok(11), "capacity, not length, bounds a slot");
        assert_eq!(kv.slots(1, 2..6), Ok(vec![2, 3, 8, 9]));
        assert_eq!(kv.slots(2, 0..0), Ok(vec![]));
        assert_eq!(kv.slot(1, 8), Err(KvError::PositionOutOfRange { seq: 1, pos: 8, capacity: 8 }));
        assert_eq!(kv.slot(5, 0), Err(KvError::UnknownSequence { seq: 5 }));
        assert!(kv.slots(1, 6..9).is_err());
    }

    #[test]
    fn blocks_needed_counts_only_new_blocks() {
        let kv = manager(1, 16);
        assert_eq!(kv.blocks_needed(0, 0), 0);
        assert_eq!(kv.blocks_needed(0, 1), 1);
        assert_eq!(kv.blocks_needed(16, 17), 1);
        assert_eq!(kv.blocks_needed(17, 32), 0);
        assert_eq!(kv.blocks_needed(17, 33), 1);
        assert_eq!(kv.blocks_needed(40, 3), 0);
    }

    #[test]
    fn kv_bytes_per_token_counts_k_and_v_of_every_layer() {
        // SmolLM2-135M: 30 layers, 3 KV heads of 64, float32.
        assert_eq!(kv_bytes_per_token(30, 3, 64, 4), 46_080);
        assert_eq!(kv_bytes_per_token(usize::MAX, 2, 1, 1), u64::MAX);
    }

    #[test]
    fn plan_fits_the_budget_and_caps_at_what_max_num_seqs_can_use() {
        let per_token = kv_bytes_per_token(30, 3, 64, 4);
        let plan = plan_kv_blocks(1 << 30, per_token, 16, 2048, 256).unwrap();
        assert_eq!(plan.bytes_per_block, 737_280);
        assert_eq!(plan.num_blocks, 1456); // floor(2^30 / 737280)
        assert_eq!(plan.blocks_per_sequence, 128);
        assert_eq!(plan.max_full_length_sequences, 11);
        assert!(plan.total_bytes <= 1 << 30);

        let capped = plan_kv_blocks(1 << 30, per_token, 16, 2048, 2).unwrap();
        assert_eq!(capped.num_blocks, 256);
        assert_eq!(capped.total_bytes, 256 * 737_280);
        assert!(KvBlockManager::from_plan(&capped).is_ok_and(|kv| kv.num_total_blocks() == 256));
    }

    #[test]
    fn plan_names_budget_per_token_bytes_and_remedies_when_too_small() {
        let err = plan_kv_blocks(64 << 20, 46_080, 16, 8192, 4).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the KV cache budget of 67108864 bytes (64.00 MiB) holds 91 blocks of 16 tokens at \
             46080 bytes per token, but one sequence of max_model_len=8192 tokens needs 512 \
             blocks; raise the KV memory budget, lower max_model_len, or store the KV cache in \
             a smaller dtype"
        );
        assert_eq!(plan_kv_blocks(1 << 30, 46_080, 0, 8192, 4), Err(KvError::ZeroParameter { name: "block_size" }));
        assert_eq!(plan_kv_blocks(1 << 30, 0, 16, 8192, 4), Err(KvError::ZeroParameter { name: "bytes_per_token" }));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Grow {
            seq: SeqId,
            new_len: usize,
        },
        /// Truncate to `percent`% of the current length; above 100 tries to lengthen.
        Truncate {
            seq: SeqId,
            percent: usize,
        },
        Release {
            seq: SeqId,
        },
        /// Cache block `index` of `seq` under the shared chain's key `index`.
        Cache {
            seq: SeqId,
            index: usize,
        },
        /// Adopt the cached part of the shared chain's first `blocks` keys.
        Adopt {
            seq: SeqId,
            blocks: usize,
        },
    }

    fn op() -> impl Strategy<Value = Op> {
        let seq = 0u64..5;
        prop_oneof![
            3 => (seq.clone(), 0usize..60).prop_map(|(seq, new_len)| Op::Grow { seq, new_len }),
            2 => (seq.clone(), 0usize..120).prop_map(|(seq, percent)| Op::Truncate { seq, percent }),
            1 => seq.clone().prop_map(|seq| Op::Release { seq }),
            2 => (seq.clone(), 0usize..8).prop_map(|(seq, index)| Op::Cache { seq, index }),
            2 => (seq, 0usize..8).prop_map(|(seq, blocks)| Op::Adopt { seq, blocks }),
        ]
    }

    /// Key `i` of the one prefix every sequence of the property test shares.
    fn chain_keys(n: usize) -> Vec<BlockHash> {
        let mut keys: Vec<BlockHash> = Vec::with_capacity(n);
        for i in 0..n {
            keys.push(BlockHash::of(keys.last().copied(), &[i as u32]));
        }
        keys
    }

    #[test]
    fn a_cached_prefix_is_shared_parked_when_released_and_adopted_again() {
        let mut kv = manager(6, 4).with_prefix_caching(true);
        let keys = chain_keys(3);
        kv.grow(1, 10).unwrap();
        assert!(kv.cache_block(1, 0, keys[0]));
        assert!(kv.cache_block(1, 1, keys[1]));
        assert!(!kv.cache_block(1, 2, keys[2]), "block 2 holds 2 of its 4 tokens");
        assert!(!kv.cache_block(1, 1, keys[1]), "already cached");
        assert_eq!(kv.num_cached_blocks(), 2);

        let hit = kv.cached_prefix(&keys);
        assert_eq!(hit, kv.block_table(1)[..2].to_vec(), "the walk stops at the first uncached key");
        assert_eq!(kv.num_parked(&hit), 0, "sequence 1 still holds them");
        kv.adopt_prefix(2, &hit).unwrap();
        assert_eq!((kv.len(2), kv.num_free_blocks()), (8, 3), "adoption takes no new block");
        kv.grow(2, 9).unwrap();
        assert_eq!(kv.block_table(2)[..2], kv.block_table(1)[..2]);
        assert_ne!(kv.block_table(2)[2], kv.block_table(1)[2]);

        kv.release(1);
        assert_eq!(kv.num_free_blocks(), 3, "shared blocks stay with sequence 2");
        kv.release(2);
        assert_eq!(kv.num_free_blocks(), 6, "parked blocks count as free");
        assert_eq!(kv.num_parked(&hit), 2);
        kv.adopt_prefix(3, &kv.cached_prefix(&keys)).unwrap();
        assert_eq!((kv.len(3), kv.num_free_blocks()), (8, 4));
        assert_eq!(kv.adopt_prefix(3, &hit), Err(KvError::AdoptIntoHeldSequence { seq: 3 }));
    }

    #[test]
    fn parked_blocks_are_handed_out_only_when_the_free_list_is_empty_oldest_first() {
        let mut kv = manager(4, 2).with_prefix_caching(true);
        let keys = chain_keys(2);
        kv.grow(1, 4).unwrap();
        kv.cache_block(1, 0, keys[0]);
        kv.cache_block(1, 1, keys[1]);
        let cached = kv.block_table(1).to_vec();
        kv.release(1);
        kv.grow(2, 4).unwrap();
        assert!(kv.block_table(2).iter().all(|b| !cached.contains(b)), "free blocks first");
        assert_eq!(kv.cached_prefix(&keys), cached);
        kv.grow(2, 6).unwrap();
        // A table lets go of its last block first, so a prefix's tail is evicted before its head.
        assert_eq!(kv.block_table(2)[2], cached[1], "the least recently released block goes first");
        assert_eq!(kv.cached_prefix(&keys), vec![cached[0]], "the prefix's first block is still cached");
    }

    #[test]
    fn prefix_caching_off_caches_and_finds_nothing() {
        let mut kv = manager(4, 2);
        kv.grow(1, 4).unwrap();
        let keys = chain_keys(1);
        assert!(!kv.cache_block(1, 0, keys[0]));
        assert!(kv.cached_prefix(&keys).is_empty());
    }

    #[test]
    fn reset_frees_parked_blocks_and_uncaches_held_ones() {
        let mut kv = manager(4, 2).with_prefix_caching(true);
        let keys = chain_keys(2);
        kv.grow(1, 4).unwrap();
        kv.grow(2, 2).unwrap();
        kv.cache_block(1, 0, keys[0]);
        kv.cache_block(2, 0, keys[1]);
        kv.release(1);
        assert_eq!(kv.reset_prefix_cache(), 2);
        assert_eq!((kv.num_cached_blocks(), kv.num_free_blocks()), (0, 3));
        assert!(kv.cached_prefix(&keys).is_empty());
        kv.release(2);
        assert_eq!(kv.num_free_blocks(), 4);
        assert_blocks_partitioned(&kv);
    }

    /// Every block is free, parked or held, a held block's count is the number of tables
    /// holding it, only cached blocks are held twice, and tables own ceil(len / bs).
    fn assert_blocks_partitioned(kv: &KvBlockManager) {
        let mut held: HashMap<BlockId, u32> = HashMap::new();
        for (seq, table) in &kv.tables {
            assert_eq!(table.blocks.len(), blocks_for(table.len, kv.block_size()), "seq {seq}");
            for &block in &table.blocks {
                *held.entry(block).or_default() += 1;
                assert!(!kv.allocator.is_free[block as usize], "held block {block} marked free");
            }
        }
        for (&block, &count) in &held {
            assert_eq!(kv.holders[block as usize], count, "holders of block {block}");
            assert!(count == 1 || kv.prefix.is_cached(block), "uncached block {block} held {count} times");
        }
        let free: HashSet<BlockId> = kv.allocator.free_list.iter().copied().collect();
        let parked: HashSet<BlockId> = kv.prefix.parked().into_iter().collect();
        assert_eq!(free.len() + parked.len(), kv.num_free_blocks(), "free list has duplicates");
        assert!(free.is_disjoint(&parked));
        assert!(parked.iter().all(|&b| kv.prefix.is_cached(b) && kv.holders[b as usize] == 0));
        assert!(held.keys().all(|b| !free.contains(b) && !parked.contains(b)));
        assert_eq!(free.len() + parked.len() + held.len(), kv.num_total_blocks());
    }

    proptest! {
        #[test]
        fn random_grow_truncate_release_cache_adopt_never_leak_or_double_allocate(
            ops in proptest::collection::vec(op(), 0..80),
        ) {
            let mut kv = manager(12, 4).with_prefix_caching(true);
            let keys = chain_keys(8);
            for op in ops {
                let before = kv.clone();
                match op {
                    Op::Grow { seq, new_len } => {
                        let expected_ok = kv.can_grow(seq, new_len);
                        let result = kv.grow(seq, new_len);
                        prop_assert_eq!(result.is_ok(), expected_ok);
                        if result.is_err() {
                            prop_assert_eq!(&kv.tables, &before.tables);
                            prop_assert_eq!(kv.num_free_blocks(), before.num_free_blocks());
                        } else {
                            prop_assert_eq!(kv.len(seq), new_len.max(before.len(seq)));
                        }
                    }
                    Op::Truncate { seq, percent } => {
                        let len = kv.len(seq) * percent / 100;
                        if kv.truncate(seq, len).is_ok() {
                            prop_assert_eq!(kv.len(seq), len);
                        } else {
                            prop_assert_eq!(&kv.tables, &before.tables);
                        }
                    }
                    Op::Release { seq } => {
                        let freed = kv.release(seq);
                        prop_assert_eq!(freed, before.block_table(seq).len());
                        prop_assert!(!kv.contains(seq));
                    }
                    Op::Cache { seq, index } => {
                        kv.cache_block(seq, index, keys[index]);
                    }
                    Op::Adopt { seq, blocks } => {
                        let hit = kv.cached_prefix(&keys[..blocks]);
                        let free_after = kv.num_free_blocks() - kv.num_parked(&hit);
                        if kv.adopt_prefix(seq, &hit).is_ok() {
                            prop_assert_eq!(kv.len(seq), hit.len() * kv.block_size());
                            prop_assert_eq!(kv.num_free_blocks(), free_after);
                        } else {
                            prop_assert_eq!(&kv.tables, &before.tables);
                        }
                    }
                }
                assert_blocks_partitioned(&kv);
            }
            let seqs: Vec<SeqId> = kv.tables.keys().copied().collect();
            for seq in seqs {
                kv.release(seq);
            }
            prop_assert_eq!(kv.num_free_blocks(), kv.num_total_blocks());
            prop_assert_eq!(kv.num_sequences(), 0);
            kv.reset_prefix_cache();
            assert_blocks_partitioned(&kv);
        }
    }
}
