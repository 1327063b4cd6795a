//! A depth-bounded suffix tree over token sequences with occurrence counts.
//!
//! Every substring `u` of at most `max_depth` tokens of the stored sequences has a count: how
//! many start positions it occurs at. Suffix decoding reads a continuation's probability as
//! `count(u + t) / count(u)` and follows the most frequent child.
//!
//! Layout: a node is one token deeper than its parent (no edge labels). Storing every
//! substring would cost `max_depth` nodes per token, so a substring that occurs once keeps no
//! descendants: its node (a *leaf*) remembers where its single occurrence starts, and the
//! tokens below it are read from that sequence ("virtual" positions). Every continuation of a
//! substring that occurs at least twice is a real node. A leaf gains its first child when a
//! second occurrence arrives and the two part ways. Nodes cost `O(repeated substrings)`,
//! which for text is a few per token.
//!
//! Appending a token extends the `max_depth` most recent suffixes of its sequence, oldest
//! first: an older suffix's occurrence is then already one token longer when a younger one
//! splits the leaf it lives in, so the split reads its continuation correctly. Removing a
//! sequence walks each of its suffixes down the real nodes and decrements them; a node whose
//! count falls to zero goes with its subtree. A node left with one occurrence keeps the real
//! child its survivor continues into, so it never needs to know where that occurrence starts.

use std::collections::{HashMap, VecDeque};

/// Identifies a sequence in a tree; chosen by the caller.
pub type SequenceKey = u64;

type NodeId = u32;
const ROOT: NodeId = 0;

/// Where a substring's single occurrence starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Occurrence {
    seq: SequenceKey,
    start: u32,
}

#[derive(Debug, Clone, Default)]
struct Node {
    /// Start positions the node's substring occurs at.
    count: u32,
    /// Tokens from the root: the substring's length.
    depth: u32,
    /// Real children by token, sorted by token.
    children: Vec<(u32, NodeId)>,
    /// Set on a node that occurs once and whose occurrence continues below it virtually.
    occurrence: Option<Occurrence>,
}

impl Node {
    fn child(&self, token: u32) -> Option<NodeId> {
        self.children.binary_search_by_key(&token, |&(t, _)| t).ok().map(|i| self.children[i].1)
    }

    /// The most frequent child, the smallest token among equals.
    fn likeliest_child(&self, nodes: &[Node]) -> Option<(u32, NodeId)> {
        self.children.iter().copied().fold(None, |best, (token, id)| match best {
            Some((_, b)) if nodes[b as usize].count >= nodes[id as usize].count => best,
            _ => Some((token, id)),
        })
    }
}

#[derive(Debug, Clone, Default)]
struct Sequence {
    tokens: Vec<u32>,
    /// The suffixes still shorter than `max_depth`, oldest first: their start and the deepest
    /// real node on their path when last extended (deeper real nodes may have appeared since).
    open: VecDeque<(u32, NodeId)>,
}

/// A continuation the tree proposes after a matched pattern.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SuffixDraft {
    pub tokens: Vec<u32>,
    /// Estimated probability of reaching each token: the product of the count ratios above it.
    pub probs: Vec<f32>,
    /// The sum of `probs`: the expected number of accepted drafts, which ranks candidates.
    pub score: f32,
    /// Tokens of the pattern the continuation was found after.
    pub match_len: usize,
}

/// Limits of one speculation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpeculationLimits {
    /// The most tokens to propose.
    pub max_tokens: usize,
    /// A match of `n` tokens proposes at most `floor(n * max_spec_factor + max_spec_offset)`.
    pub max_spec_factor: f32,
    pub max_spec_offset: f32,
    /// Stop before a token whose estimated probability falls below this.
    pub min_token_prob: f32,
}

/// A position in the tree: the deepest real node on a path, and the path's length (deeper
/// than the node only below a leaf, along its single occurrence).
#[derive(Debug, Clone, Copy)]
struct Cursor {
    node: NodeId,
    depth: u32,
}

/// See the module docs.
#[derive(Debug, Clone)]
pub struct SuffixTree {
    max_depth: usize,
    nodes: Vec<Node>,
    free: Vec<NodeId>,
    sequences: HashMap<SequenceKey, Sequence>,
}

impl SuffixTree {
    /// A tree counting substrings of at most `max_depth` tokens (`max_depth >= 1`).
    pub fn new(max_depth: usize) -> Self {
        assert!(max_depth >= 1, "a suffix tree needs max_depth >= 1");
        Self { max_depth, nodes: vec![Node::default()], free: Vec::new(), sequences: HashMap::new() }
    }

    pub fn max_depth(&self) -> usize {
        self.max_depth
    }

    /// Live nodes, the root included (for memory accounting).
    pub fn num_nodes(&self) -> usize {
        self.nodes.len() - self.free.len()
    }

    /// Tokens stored across all sequences.
    pub fn num_tokens(&self) -> usize {
        self.nodes[ROOT as usize].count as usize
    }

    pub fn contains(&self, seq: SequenceKey) -> bool {
        self.sequences.contains_key(&seq)
    }

    /// The tokens stored for `seq`.
    pub fn sequence(&self, seq: SequenceKey) -> Option<&[u32]> {
        self.sequences.get(&seq).map(|s| s.tokens.as_slice())
    }

    /// Appends `tokens` to `seq`, creating it when new.
    pub fn extend(&mut self, seq: SequenceKey, tokens: &[u32]) {
        for &token in tokens {
            self.append(seq, token);
        }
    }

    /// Appends one token to `seq`, creating it when new.
    pub fn append(&mut self, seq: SequenceKey, token: u32) {
        let max_depth = self.max_depth;
        let sequence = self.sequences.entry(seq).or_default();
        let position = sequence.tokens.len() as u32;
        sequence.tokens.push(token);
        sequence.open.push_back((position, ROOT));
        if sequence.open.len() > max_depth {
            sequence.open.pop_front();
        }
        self.nodes[ROOT as usize].count += 1;
        // Oldest suffix first (see the module docs).
        for i in 0..self.sequences[&seq].open.len() {
            let (start, last) = self.sequences[&seq].open[i];
            let node = self.extend_suffix(seq, start, last, position, token);
            self.sequences.get_mut(&seq).expect("appending to it").open[i].1 = node;
        }
    }

    /// Extends the suffix `tokens[start..position]` of `seq` by `token` (now at `position`);
    /// `last` is the deepest real node it reached before. Returns the deepest real node of
    /// the extended suffix.
    fn extend_suffix(&mut self, seq: SequenceKey, start: u32, last: NodeId, position: u32, token: u32) -> NodeId {
        let tokens = &self.sequences[&seq].tokens;
        let length = position - start;
        // Real nodes may have appeared below `last` since: another occurrence split a leaf.
        let mut node = last;
        while self.nodes[node as usize].depth < length {
            let next = tokens[(start + self.nodes[node as usize].depth) as usize];
            match self.nodes[node as usize].child(next) {
                Some(child) => node = child,
                None => break,
            }
        }
        let n = &mut self.nodes[node as usize];
        if n.depth < length {
            // Below a leaf: this occurrence is its only one and simply grows.
            debug_assert_eq!(n.count, 1, "every continuation of a repeated substring is a real node");
            return node;
        }
        if node != ROOT && n.count == 1 {
            // This occurrence is the node's only one and continues below it virtually.
            n.occurrence = Some(Occurrence { seq, start });
            return node;
        }
        let Some(child) = n.child(token) else {
            let depth = n.depth + 1;
            return self.add_child(node, token, depth, Occurrence { seq, start });
        };
        let c = &mut self.nodes[child as usize];
        c.count += 1;
        if let Some(other) = c.occurrence.take() {
            // A second occurrence reached a leaf: give the first its own real child.
            let depth = c.depth;
            let next = self.sequences[&other.seq].tokens.get((other.start + depth) as usize).copied();
            if let Some(next) = next.filter(|_| (depth as usize) < self.max_depth) {
                self.add_child(child, next, depth + 1, other);
            }
        }
        child
    }

    fn add_child(&mut self, parent: NodeId, token: u32, depth: u32, occurrence: Occurrence) -> NodeId {
        let node = Node { count: 1, depth, children: Vec::new(), occurrence: Some(occurrence) };
        let id = match self.free.pop() {
            Some(id) => {
                self.nodes[id as usize] = node;
                id
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as NodeId
            }
        };
        let children = &mut self.nodes[parent as usize].children;
        let at = children.binary_search_by_key(&token, |&(t, _)| t).expect_err("a new child");
        children.insert(at, (token, id));
        id
    }

    /// Removes `seq` and every count it added; false when it is not stored.
    pub fn remove(&mut self, seq: SequenceKey) -> bool {
        let Some(sequence) = self.sequences.remove(&seq) else {
            return false;
        };
        let tokens = sequence.tokens;
        let mut path = Vec::with_capacity(self.max_depth.min(tokens.len()));
        for start in 0..tokens.len() {
            self.nodes[ROOT as usize].count -= 1;
            path.clear();
            let mut node = ROOT;
            let end = tokens.len().min(start + self.max_depth);
            for &token in &tokens[start..end] {
                match self.nodes[node as usize].child(token) {
                    Some(child) => {
                        path.push((node, token, child));
                        node = child;
                    }
                    // The rest lies below a leaf, virtually.
                    None => break,
                }
            }
            for &(_, _, child) in &path {
                self.nodes[child as usize].count -= 1;
            }
            // Counts only shrink downwards, so the first emptied node heads all emptied ones.
            if let Some(&(parent, token, child)) = path.iter().find(|&&(_, _, c)| self.nodes[c as usize].count == 0) {
                let children = &mut self.nodes[parent as usize].children;
                let at = children.binary_search_by_key(&token, |&(t, _)| t).expect("a real child");
                children.remove(at);
                self.free_subtree(child);
            }
        }
        true
    }

    fn free_subtree(&mut self, root: NodeId) {
        let mut stack = vec![root];
        while let Some(id) = stack.pop() {
            let node = std::mem::take(&mut self.nodes[id as usize]);
            debug_assert_eq!(node.count, 0, "only emptied nodes are freed");
            stack.extend(node.children.iter().map(|&(_, c)| c));
            self.free.push(id);
        }
    }

    /// The token at `depth` below `cursor` along a leaf's single occurrence.
    fn virtual_token(&self, cursor: Cursor) -> Option<u32> {
        if cursor.depth as usize >= self.max_depth {
            return None;
        }
        let occurrence = self.nodes[cursor.node as usize].occurrence?;
        self.sequences[&occurrence.seq].tokens.get((occurrence.start + cursor.depth) as usize).copied()
    }

    /// Where `pattern` ends in the tree, when it occurs.
    fn find(&self, pattern: &[u32]) -> Option<Cursor> {
        let mut cursor = Cursor { node: ROOT, depth: 0 };
        for &token in pattern {
            let node = &self.nodes[cursor.node as usize];
            if cursor.depth == node.depth
                && let Some(child) = node.child(token)
            {
                cursor = Cursor { node: child, depth: cursor.depth + 1 };
                continue;
            }
            if self.virtual_token(cursor) != Some(token) {
                return None;
            }
            cursor.depth += 1;
        }
        Some(cursor)
    }

    /// Follows the likeliest continuation from `cursor` while its estimated probability stays
    /// at or above `min_token_prob`, for at most `max_tokens` tokens.
    fn continuation(&self, mut cursor: Cursor, max_tokens: usize, min_token_prob: f32) -> SuffixDraft {
        let mut draft = SuffixDraft::default();
        let mut prob = 1.0f32;
        while draft.tokens.len() < max_tokens && (cursor.depth as usize) < self.max_depth {
            let node = &self.nodes[cursor.node as usize];
            let token = if cursor.depth == node.depth
                && let Some((token, child)) = node.likeliest_child(&self.nodes)
            {
                prob *= self.nodes[child as usize].count as f32 / node.count as f32;
                cursor.node = child;
                token
            } else if let Some(token) = self.virtual_token(cursor) {
                token
            } else {
                break;
            };
            if prob < min_token_prob {
                break;
            }
            cursor.depth += 1;
            draft.tokens.push(token);
            draft.probs.push(prob);
            draft.score += prob;
        }
        draft
    }

    /// The best-scoring continuation of `context` over every match length: each suffix of
    /// `context` of `n` tokens (`1 <= n < max_depth`, at most the context) that occurs in the
    /// tree proposes its likeliest continuation, limited by `limits`; the highest score wins,
    /// the longer match among equal scores. Empty when no suffix occurs.
    pub fn speculate(&self, context: &[u32], limits: SpeculationLimits) -> SuffixDraft {
        let mut best = SuffixDraft::default();
        let longest = context.len().min(self.max_depth - 1);
        for match_len in 1..=longest {
            let Some(cursor) = self.find(&context[context.len() - match_len..]) else {
                // A longer suffix contains this one: it cannot occur either.
                break;
            };
            let by_match = (match_len as f32 * limits.max_spec_factor + limits.max_spec_offset + 1e-6).max(0.0);
            let max_tokens = limits.max_tokens.min(by_match as usize);
            let draft = self.continuation(cursor, max_tokens, limits.min_token_prob);
            if draft.score >= best.score {
                best = SuffixDraft { match_len, ..draft };
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    /// Every substring of at most `depth` tokens and its number of occurrences, by brute force.
    fn brute_counts(seqs: &BTreeMap<SequenceKey, Vec<u32>>, depth: usize) -> HashMap<Vec<u32>, u32> {
        let mut counts = HashMap::new();
        for tokens in seqs.values() {
            for start in 0..tokens.len() {
                for end in start + 1..=tokens.len().min(start + depth) {
                    *counts.entry(tokens[start..end].to_vec()).or_insert(0) += 1;
                }
            }
        }
        counts
    }

    /// The speculation rule on brute-force counts: the reference the tree must equal.
    fn brute_speculate(
        counts: &HashMap<Vec<u32>, u32>,
        depth: usize,
        context: &[u32],
        l: SpeculationLimits,
    ) -> SuffixDraft {
        let mut best = SuffixDraft::default();
        for match_len in 1..=context.len().min(depth - 1) {
            let mut u = context[context.len() - match_len..].to_vec();
            if !counts.contains_key(&u) {
                break;
            }
            let by_match = (match_len as f32 * l.max_spec_factor + l.max_spec_offset + 1e-6).max(0.0);
            let max_tokens = l.max_tokens.min(by_match as usize);
            let mut draft = SuffixDraft { match_len, ..Default::default() };
            let mut prob = 1.0f32;
            while draft.tokens.len() < max_tokens && u.len() < depth {
                let parent = counts[&u];
                let next = counts
                    .iter()
                    .filter(|(s, _)| s.len() == u.len() + 1 && s.starts_with(&u))
                    .map(|(s, &c)| (c, s[u.len()]))
                    .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
                let Some((count, token)) = next else { break };
                prob *= count as f32 / parent as f32;
                if prob < l.min_token_prob {
                    break;
                }
                u.push(token);
                draft.tokens.push(token);
                draft.probs.push(prob);
                draft.score += prob;
            }
            if draft.score >= best.score {
                best = draft;
            }
        }
        best
    }

    /// The tree's counts: every real node's, and (count 1) each leaf's virtual descendants.
    fn assert_counts_match(tree: &SuffixTree, seqs: &BTreeMap<SequenceKey, Vec<u32>>) {
        let brute = brute_counts(seqs, tree.max_depth);
        let mut seen = 0;
        let mut stack = vec![(ROOT, Vec::new())];
        while let Some((id, prefix)) = stack.pop() {
            let node = &tree.nodes[id as usize];
            if id != ROOT {
                assert_eq!(Some(&node.count), brute.get(&prefix), "count of {prefix:?}");
                assert_eq!(node.depth as usize, prefix.len());
                seen += 1;
            }
            for &(token, child) in &node.children {
                let mut p = prefix.clone();
                p.push(token);
                stack.push((child, p));
            }
        }
        // Every substring occurring twice or more is a real node; the rest are reachable.
        for (s, &c) in &brute {
            let cursor = tree.find(s).unwrap_or_else(|| panic!("{s:?} occurs {c} times but is not found"));
            if c >= 2 {
                assert_eq!(tree.nodes[cursor.node as usize].depth as usize, s.len(), "{s:?} occurs {c} times");
            }
        }
        assert!(seen <= brute.len());
        assert_eq!(tree.num_tokens(), seqs.values().map(Vec::len).sum::<usize>());
    }

    fn limits(max_tokens: usize, factor: f32, min_prob: f32) -> SpeculationLimits {
        SpeculationLimits { max_tokens, max_spec_factor: factor, max_spec_offset: 0.0, min_token_prob: min_prob }
    }

    #[test]
    fn a_repeated_phrase_is_proposed_with_its_frequency() {
        let mut tree = SuffixTree::new(8);
        // "1 2 3" is followed by 4 twice and by 5 once.
        tree.extend(1, &[1, 2, 3, 4, 9, 1, 2, 3, 4, 8, 1, 2, 3, 5]);
        let draft = tree.speculate(&[7, 1, 2, 3], limits(4, 1.0, 0.1));
        assert_eq!(draft.tokens[0], 4);
        assert!((draft.probs[0] - 2.0 / 3.0).abs() < 1e-6, "{draft:?}");
        assert_eq!(draft.match_len, 3);
        // The spec factor limits a one-token match to one draft.
        let short = tree.speculate(&[3], limits(4, 1.0, 0.0));
        assert_eq!(short.tokens.len(), 1);
        // A high probability floor stops at the 2/3 branch.
        assert!(tree.speculate(&[7, 1, 2, 3], limits(4, 1.0, 0.9)).tokens.is_empty());
    }

    #[test]
    fn a_leaf_splits_when_a_second_occurrence_parts_ways() {
        let mut tree = SuffixTree::new(6);
        tree.extend(1, &[5, 6, 7, 8]);
        let single = tree.num_nodes();
        tree.extend(2, &[5, 6, 7, 9]);
        assert!(tree.num_nodes() > single);
        let draft = tree.speculate(&[5, 6, 7], limits(3, 1.0, 0.0));
        assert_eq!(draft.tokens, vec![8], "equal counts: the smaller token");
        assert_eq!(draft.probs, vec![0.5]);
        let seqs = BTreeMap::from([(1, vec![5, 6, 7, 8]), (2, vec![5, 6, 7, 9])]);
        assert_counts_match(&tree, &seqs);
    }

    #[test]
    fn removing_a_sequence_forgets_its_continuations() {
        let mut tree = SuffixTree::new(8);
        tree.extend(1, &[1, 2, 3, 4, 5]);
        tree.extend(2, &[1, 2, 3, 9, 9]);
        assert!(tree.remove(1));
        assert!(!tree.remove(1), "already gone");
        let draft = tree.speculate(&[1, 2, 3], limits(2, 1.0, 0.0));
        assert_eq!(draft.tokens, vec![9, 9]);
        assert_eq!(draft.probs, vec![1.0, 1.0]);
        assert!(tree.remove(2));
        assert_eq!(tree.num_nodes(), 1, "only the root is left");
        assert_eq!(tree.num_tokens(), 0);
    }

    #[test]
    fn depth_bounds_match_plus_speculation() {
        let mut tree = SuffixTree::new(4);
        tree.extend(1, &[1, 2, 3, 4, 5, 6]);
        // A 3-token match leaves one position under the depth of 4, a 2-token match two (and
        // the factor of 1 allows two): the higher score wins.
        let draft = tree.speculate(&[1, 2, 3], limits(8, 1.0, 0.0));
        assert_eq!((draft.tokens, draft.match_len), (vec![4, 5], 2));
        assert_eq!(tree.speculate(&[1], limits(8, 8.0, 0.0)).tokens, vec![2, 3, 4]);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        /// Interleaved appends to several sequences and removals: counts equal brute force,
        /// and speculation equals the rule evaluated on brute-force counts.
        #[test]
        fn counts_and_speculation_equal_brute_force(
            depth in 2usize..7,
            ops in proptest::collection::vec((0u64..4, proptest::collection::vec(0u32..4, 0..12), any::<bool>()), 1..14),
            contexts in proptest::collection::vec(proptest::collection::vec(0u32..4, 1..8), 6),
            min_prob in prop_oneof![Just(0.0f32), Just(0.3f32)],
        ) {
            let mut tree = SuffixTree::new(depth);
            let mut seqs: BTreeMap<SequenceKey, Vec<u32>> = BTreeMap::new();
            for (seq, tokens, remove) in ops {
                if remove && seqs.contains_key(&seq) {
                    prop_assert!(tree.remove(seq));
                    seqs.remove(&seq);
                } else {
                    tree.extend(seq, &tokens);
                    if !tokens.is_empty() {
                        seqs.entry(seq).or_default().extend(&tokens);
                    }
                }
                assert_counts_match(&tree, &seqs);
            }
            let brute = brute_counts(&seqs, depth);
            for context in &contexts {
                let l = limits(5, 1.5, min_prob);
                prop_assert_eq!(tree.speculate(context, l), brute_speculate(&brute, depth, context, l));
            }
        }
    }
}
