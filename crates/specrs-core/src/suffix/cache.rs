//! The two kinds of suffix trees suffix decoding drafts from, and their lifetimes.
//!
//! - One tree per running request over its prompt and output: repeats within the request
//!   (quoting the prompt, code edits, lists).
//! - One shared tree over the outputs of the last `max_cached_requests` requests, running ones
//!   included, evicted oldest first: repeats across requests (agent loops, several samples of
//!   one prompt, RL rollouts). A request's output joins it token by token as it is generated.
//!
//! A speculation asks both trees and keeps the higher-scoring draft (the request's own on a
//! tie).

use std::collections::{HashMap, HashSet, VecDeque};

use super::tree::{SequenceKey, SpeculationLimits, SuffixDraft, SuffixTree};
use crate::config::SpeculativeConfig;

/// Identifies a request in the cache; never reused while its output may be cached.
pub type RequestKey = SequenceKey;

/// The request's own tree keeps prompt and output as one sequence.
const OWN: SequenceKey = 0;

/// `suffix_decoding_*` of the speculative config, validated.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SuffixCacheConfig {
    /// The deepest substring the trees count: it bounds match length plus draft length.
    pub max_tree_depth: usize,
    /// Requests whose outputs the shared tree keeps; 0 keeps none (own trees only).
    pub max_cached_requests: usize,
    /// A match of `n` tokens drafts at most `floor(n * max_spec_factor)` tokens.
    pub max_spec_factor: f32,
    /// Drafting stops before a token whose estimated probability falls below this.
    pub min_token_prob: f32,
}

impl SuffixCacheConfig {
    /// The `suffix_decoding_*` fields of a validated config.
    pub fn from_config(spec: &SpeculativeConfig) -> Self {
        Self {
            max_tree_depth: spec.suffix_decoding_max_tree_depth as usize,
            max_cached_requests: spec.suffix_decoding_max_cached_requests as usize,
            max_spec_factor: spec.suffix_decoding_max_spec_factor as f32,
            min_token_prob: spec.suffix_decoding_min_token_prob as f32,
        }
    }
}

/// See the module docs.
#[derive(Debug, Clone)]
pub struct SuffixCache {
    config: SuffixCacheConfig,
    running: HashMap<RequestKey, SuffixTree>,
    outputs: SuffixTree,
    /// Requests whose output `outputs` keeps, oldest first, and the same as a set.
    cached: VecDeque<RequestKey>,
    is_cached: HashSet<RequestKey>,
}

impl SuffixCache {
    pub fn new(config: SuffixCacheConfig) -> Self {
        Self {
            config,
            running: HashMap::new(),
            outputs: SuffixTree::new(config.max_tree_depth),
            cached: VecDeque::new(),
            is_cached: HashSet::new(),
        }
    }

    pub fn config(&self) -> &SuffixCacheConfig {
        &self.config
    }

    pub fn is_running(&self, request: RequestKey) -> bool {
        self.running.contains_key(&request)
    }

    /// Requests whose outputs the shared tree keeps.
    pub fn num_cached(&self) -> usize {
        self.cached.len()
    }

    /// Output tokens the shared tree keeps.
    pub fn num_cached_tokens(&self) -> usize {
        self.outputs.num_tokens()
    }

    /// Starts (or restarts) `request`: its own tree gets the prompt, and the shared tree a
    /// slot for its output, evicting the oldest output beyond `max_cached_requests`. A restart
    /// drops what the request had produced before.
    pub fn start_request(&mut self, request: RequestKey, prompt: &[u32]) {
        let mut own = SuffixTree::new(self.config.max_tree_depth);
        own.extend(OWN, prompt);
        self.running.insert(request, own);
        if self.is_cached.remove(&request) {
            self.outputs.remove(request);
            self.cached.retain(|&r| r != request);
        }
        if self.config.max_cached_requests == 0 {
            return;
        }
        self.cached.push_back(request);
        self.is_cached.insert(request);
        while self.cached.len() > self.config.max_cached_requests {
            let oldest = self.cached.pop_front().expect("longer than the limit");
            self.is_cached.remove(&oldest);
            self.outputs.remove(oldest);
        }
    }

    /// Appends generated tokens to a running request's own tree and, while cached, to the
    /// shared one. Ignored for a request that is not running.
    pub fn add_output(&mut self, request: RequestKey, tokens: &[u32]) {
        let Some(own) = self.running.get_mut(&request) else {
            return;
        };
        own.extend(OWN, tokens);
        // The slot may have been evicted while the request ran.
        if self.is_cached.contains(&request) {
            self.outputs.extend(request, tokens);
        }
    }

    /// Ends a request: its own tree goes, its output stays cached for later requests.
    pub fn stop_request(&mut self, request: RequestKey) {
        self.running.remove(&request);
    }

    /// Forgets the outputs of every request that has finished (the engine's
    /// `reset_suffix_cache`): later requests draft from their own text and from requests still
    /// running, whose outputs stay. Returns how many outputs went.
    pub fn forget_finished_outputs(&mut self) -> usize {
        let before = self.cached.len();
        let (running, outputs, is_cached) = (&self.running, &mut self.outputs, &mut self.is_cached);
        self.cached.retain(|request| {
            let keep = running.contains_key(request);
            if !keep {
                is_cached.remove(request);
                outputs.remove(*request);
            }
            keep
        });
        before - self.cached.len()
    }

    /// The draft for a running request whose committed tokens end with `context`, at most
    /// `max_tokens` long; empty for a request that is not running.
    pub fn speculate(&self, request: RequestKey, context: &[u32], max_tokens: usize) -> SuffixDraft {
        let Some(own) = self.running.get(&request) else {
            return SuffixDraft::default();
        };
        let context = &context[context.len().saturating_sub(self.config.max_tree_depth)..];
        let limits = SpeculationLimits {
            max_tokens,
            max_spec_factor: self.config.max_spec_factor,
            max_spec_offset: 0.0,
            min_token_prob: self.config.min_token_prob,
        };
        let mine = own.speculate(context, limits);
        let shared = self.outputs.speculate(context, limits);
        if shared.score > mine.score { shared } else { mine }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(max_cached_requests: usize) -> SuffixCacheConfig {
        SuffixCacheConfig { max_tree_depth: 16, max_cached_requests, max_spec_factor: 2.0, min_token_prob: 0.1 }
    }

    #[test]
    fn a_request_drafts_from_its_own_prompt() {
        let mut cache = SuffixCache::new(config(4));
        cache.start_request(1, &[10, 11, 12, 13, 14, 15]);
        cache.add_output(1, &[11, 12]);
        let draft = cache.speculate(1, &[10, 11, 12, 13, 14, 15, 11, 12], 8);
        assert_eq!(draft.tokens, vec![13, 14, 15, 11]);
        assert_eq!(draft.match_len, 2, "the factor of 2 allows four drafts");
    }

    #[test]
    fn a_later_request_drafts_from_an_earlier_output_but_not_its_prompt() {
        let mut cache = SuffixCache::new(config(4));
        cache.start_request(1, &[99, 98, 97]);
        cache.add_output(1, &[1, 2, 3, 4, 5, 6]);
        cache.stop_request(1);
        cache.start_request(2, &[7]);
        cache.add_output(2, &[1, 2, 3]);
        assert_eq!(cache.speculate(2, &[7, 1, 2, 3], 3).tokens, vec![4, 5, 6]);
        assert!(cache.speculate(2, &[98], 3).tokens.is_empty(), "prompts stay private to their request");
        assert!(cache.speculate(1, &[1, 2], 3).tokens.is_empty(), "a stopped request drafts nothing");
    }

    #[test]
    fn outputs_are_evicted_oldest_first() {
        let mut cache = SuffixCache::new(config(2));
        for (request, first) in [(1u64, 100u32), (2, 200), (3, 300)] {
            cache.start_request(request, &[0]);
            cache.add_output(request, &[first, first + 1, first + 2]);
            cache.stop_request(request);
        }
        assert_eq!(cache.num_cached(), 2);
        assert_eq!(cache.num_cached_tokens(), 6);
        cache.start_request(4, &[0]);
        assert!(cache.speculate(4, &[100, 101], 1).tokens.is_empty(), "request 1 is evicted (then 2, on 4's start)");
        assert!(cache.speculate(4, &[200, 201], 1).tokens.is_empty());
        assert_eq!(cache.speculate(4, &[300, 301], 1).tokens, vec![302]);
    }

    #[test]
    fn zero_cached_requests_keeps_only_each_requests_own_tree() {
        let mut cache = SuffixCache::new(config(0));
        cache.start_request(1, &[0]);
        cache.add_output(1, &[5, 6, 7]);
        assert_eq!(cache.speculate(1, &[5, 6], 1).tokens, vec![7], "its own tree holds its output");
        cache.stop_request(1);
        cache.start_request(2, &[0]);
        assert!(cache.speculate(2, &[5, 6], 1).tokens.is_empty());
        assert_eq!(cache.num_cached_tokens(), 0);
    }

    #[test]
    fn forgetting_finished_outputs_keeps_those_of_running_requests() {
        let mut cache = SuffixCache::new(config(4));
        for request in [1u64, 2] {
            cache.start_request(request, &[0]);
            cache.add_output(request, &[5, 6, 7]);
            cache.stop_request(request);
        }
        cache.start_request(3, &[0]);
        cache.add_output(3, &[20, 21, 22]);
        cache.start_request(4, &[0]);
        assert_eq!(cache.speculate(4, &[5, 6], 1).tokens, vec![7], "finished outputs draft before");

        assert_eq!(cache.forget_finished_outputs(), 2, "requests 1 and 2 had finished");
        assert_eq!((cache.num_cached(), cache.num_cached_tokens()), (2, 3), "3's output and 4's empty slot");
        assert!(cache.speculate(4, &[5, 6], 1).tokens.is_empty(), "finished outputs are gone");
        assert_eq!(cache.speculate(4, &[20, 21], 1).tokens, vec![22], "a running request's output stays");
        cache.add_output(3, &[23]);
        assert_eq!(cache.speculate(4, &[21, 22], 1).tokens, vec![23], "and keeps growing");
        assert_eq!(cache.forget_finished_outputs(), 0);
    }

    #[test]
    fn a_restart_forgets_what_the_request_produced() {
        let mut cache = SuffixCache::new(config(4));
        cache.start_request(1, &[0]);
        cache.add_output(1, &[5, 6, 7]);
        cache.start_request(1, &[0]);
        assert_eq!(cache.num_cached(), 1);
        assert_eq!(cache.num_cached_tokens(), 0);
        assert!(cache.speculate(1, &[5, 6], 1).tokens.is_empty());
    }
}
