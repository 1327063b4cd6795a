//! Automatic prefix caching: full KV blocks keyed by their content, so a later sequence that
//! starts with the same tokens adopts them instead of computing them again (vLLM's APC).
//!
//! A block's key ([`BlockHash`]) covers every token before it, its own tokens *and the token
//! after it*. That last token is what makes a cached block exact for EAGLE-style drafters too:
//! their KV at position `p` pairs the target's hidden state at `p` with the token at `p + 1`,
//! so a block's drafter KV depends on the first token of the next block. (vLLM instead drops
//! the last matched block for EAGLE; keying on the next token keeps every block that is
//! exact.) It also means a hit always leaves at least the prompt's last token to compute,
//! which the first sampled token needs the logits of.
//!
//! Which blocks are cached and which of those no table holds (kept, evicted least recently
//! released first) is bookkept here; reference counts and the free list stay in
//! [`crate::kv_blocks::KvBlockManager`], which consults this index when it allocates.

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};

use crate::kv_blocks::BlockId;

/// The content key of one full block: a 128-bit hash of the key of the block before it, the
/// block's tokens and the token after them. Two independent 64-bit SipHash halves make an
/// accidental collision (which would silently reuse the wrong keys and values) negligible.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockHash(u128);

impl BlockHash {
    /// The key of a block whose predecessor has key `parent` (`None` for the first block),
    /// given its tokens followed by the next token.
    pub fn of(parent: Option<BlockHash>, tokens_and_next: &[u32]) -> Self {
        let half = |domain: u8| {
            let mut h = DefaultHasher::new();
            domain.hash(&mut h);
            parent.map(|p| p.0).hash(&mut h);
            tokens_and_next.hash(&mut h);
            h.finish()
        };
        Self((u128::from(half(0)) << 64) | u128::from(half(1)))
    }
}

/// The block keys of one growing token sequence: block `i` gets its key once the token after
/// it exists, `tokens[(i + 1) * block_size]`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlockHasher {
    hashes: Vec<BlockHash>,
}

impl BlockHasher {
    /// Keys every block that `tokens` (the whole sequence so far) newly completes; returns the
    /// new keys.
    pub fn update(&mut self, tokens: &[u32], block_size: usize) -> &[BlockHash] {
        let before = self.hashes.len();
        // Block i needs tokens up to and including index (i + 1) * block_size.
        let complete = tokens.len().saturating_sub(1) / block_size;
        for i in before..complete {
            let parent = i.checked_sub(1).map(|p| self.hashes[p]);
            self.hashes.push(BlockHash::of(parent, &tokens[i * block_size..=(i + 1) * block_size]));
        }
        &self.hashes[before..]
    }

    pub fn hashes(&self) -> &[BlockHash] {
        &self.hashes
    }
}

/// Which blocks hold cached content, and which of those no sequence holds.
#[derive(Debug, Clone, Default)]
pub(crate) struct PrefixIndex {
    by_hash: HashMap<BlockHash, BlockId>,
    hash_of: HashMap<BlockId, BlockHash>,
    /// Cached blocks no table holds, by when the last one let go: the oldest is evicted first.
    idle: BTreeMap<u64, BlockId>,
    idle_since: HashMap<BlockId, u64>,
    clock: u64,
}

impl PrefixIndex {
    /// The block holding the content keyed `hash`.
    pub(crate) fn lookup(&self, hash: &BlockHash) -> Option<BlockId> {
        self.by_hash.get(hash).copied()
    }

    pub(crate) fn is_cached(&self, block: BlockId) -> bool {
        self.hash_of.contains_key(&block)
    }

    /// Keys `block` by `hash`. A block already keyed, or a key another block already holds
    /// (two sequences computed the same prefix at once), is left as it is: false.
    pub(crate) fn insert(&mut self, hash: BlockHash, block: BlockId) -> bool {
        if self.by_hash.contains_key(&hash) || self.hash_of.contains_key(&block) {
            return false;
        }
        self.by_hash.insert(hash, block);
        self.hash_of.insert(block, hash);
        true
    }

    pub(crate) fn num_cached(&self) -> usize {
        self.hash_of.len()
    }

    pub(crate) fn num_idle(&self) -> usize {
        self.idle.len()
    }

    /// The last table holding a cached block let it go: it waits to be adopted or evicted.
    pub(crate) fn park(&mut self, block: BlockId) {
        debug_assert!(self.is_cached(block));
        self.clock += 1;
        self.idle.insert(self.clock, block);
        self.idle_since.insert(block, self.clock);
    }

    /// A parked block is adopted again: it leaves the eviction order. False if it was not parked.
    pub(crate) fn unpark(&mut self, block: BlockId) -> bool {
        match self.idle_since.remove(&block) {
            Some(since) => self.idle.remove(&since).is_some(),
            None => false,
        }
    }

    /// Takes the least recently released parked block for new content, forgetting its key.
    pub(crate) fn evict_oldest(&mut self) -> Option<BlockId> {
        let (_, block) = self.idle.pop_first()?;
        self.idle_since.remove(&block);
        self.forget(block);
        Some(block)
    }

    /// Drops every key. Returns the parked blocks (now plain free blocks); held blocks stay
    /// with their tables, uncached.
    pub(crate) fn clear(&mut self) -> Vec<BlockId> {
        let parked = std::mem::take(&mut self.idle).into_values().collect();
        *self = Self { clock: self.clock, ..Self::default() };
        parked
    }

    /// Parked blocks, oldest first.
    #[cfg(test)]
    pub(crate) fn parked(&self) -> Vec<BlockId> {
        self.idle.values().copied().collect()
    }

    fn forget(&mut self, block: BlockId) {
        if let Some(hash) = self.hash_of.remove(&block) {
            self.by_hash.remove(&hash);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_is_keyed_only_once_the_token_after_it_exists() {
        let mut hasher = BlockHasher::default();
        assert!(hasher.update(&[1, 2, 3, 4], 4).is_empty());
        assert_eq!(hasher.update(&[1, 2, 3, 4, 5], 4).len(), 1);
        assert!(hasher.update(&[1, 2, 3, 4, 5, 6, 7, 8], 4).is_empty());
        assert_eq!(hasher.update(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 4).len(), 1);
        assert_eq!(hasher.hashes().len(), 2);
    }

    #[test]
    fn keys_depend_on_everything_before_the_block_and_the_next_token() {
        let key = |tokens: &[u32]| {
            let mut hasher = BlockHasher::default();
            hasher.update(tokens, 2).to_vec()
        };
        let base = key(&[1, 2, 3, 4, 5]);
        assert_eq!(base, key(&[1, 2, 3, 4, 5]));
        assert_eq!(base[0], key(&[1, 2, 3, 9, 9])[0], "block 0 covers tokens 0..=2");
        assert_ne!(base[0], key(&[1, 2, 7, 4, 5])[0], "the token after block 0 is part of its key");
        assert_ne!(base[1], key(&[0, 2, 3, 4, 5])[1], "block 1's key depends on block 0");
        assert_ne!(base[1], key(&[1, 2, 3, 4, 6])[1]);
    }

    #[test]
    fn incremental_keys_equal_keys_of_the_whole_sequence() {
        let tokens: Vec<u32> = (0..50).map(|i| i * 7 % 13).collect();
        let mut step_by_step = BlockHasher::default();
        for end in 1..=tokens.len() {
            step_by_step.update(&tokens[..end], 3);
        }
        let mut at_once = BlockHasher::default();
        at_once.update(&tokens, 3);
        assert_eq!(step_by_step, at_once);
        assert_eq!(at_once.hashes().len(), 49 / 3);
    }

    #[test]
    fn parked_blocks_are_evicted_least_recently_released_first_and_unparked_on_adoption() {
        let mut index = PrefixIndex::default();
        let keys: Vec<BlockHash> = (0..3).map(|i| BlockHash::of(None, &[i])).collect();
        for (block, key) in keys.iter().enumerate() {
            assert!(index.insert(*key, block as BlockId));
        }
        assert!(!index.insert(keys[0], 9), "a key already held stays with its block");
        assert!(!index.insert(BlockHash::of(None, &[42]), 1), "a block keeps its first key");
        index.park(2);
        index.park(0);
        index.park(1);
        assert!(index.unpark(0));
        assert!(!index.unpark(0));
        assert_eq!(index.parked(), vec![2, 1]);
        assert_eq!(index.evict_oldest(), Some(2));
        assert_eq!(index.lookup(&keys[2]), None, "an evicted block loses its key");
        assert_eq!(index.lookup(&keys[1]), Some(1));
        assert_eq!((index.num_cached(), index.num_idle()), (2, 1));
        assert_eq!(index.clear(), vec![1]);
        assert_eq!((index.num_cached(), index.num_idle(), index.evict_oldest()), (0, 0, None));
    }
}
