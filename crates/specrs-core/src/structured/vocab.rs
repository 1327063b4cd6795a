//! The vocabulary as byte strings in a trie, and sets of token ids.
//!
//! A guide asks "which tokens keep the output valid from this state"; walking every token's
//! bytes would cost `O(V · len)` per state. The trie shares prefixes, and a walk prunes a
//! whole subtree at the first byte its automaton refuses, so most of the vocabulary is never
//! visited (llguidance and outlines-core make the same observation).

/// One trie node: the byte that leads to it, its children (contiguous in `nodes`) and the
/// tokens whose bytes end exactly here (a range of `token_ids`).
#[derive(Debug, Clone, Copy)]
struct TrieNode {
    byte: u8,
    children: (u32, u32),
    tokens: (u32, u32),
}

/// The tokens of a vocabulary as byte strings, for constraining generation.
#[derive(Debug)]
pub struct TokenVocabulary {
    vocab_size: usize,
    /// End-of-sequence ids: allowed exactly where the output may end.
    eos_token_ids: Vec<u32>,
    /// Node 0 is the root (the empty prefix).
    nodes: Vec<TrieNode>,
    token_ids: Vec<u32>,
    /// Each token's bytes (`None`: never emitted by a guide), for advancing by a token.
    token_bytes: Vec<Option<Box<[u8]>>>,
    /// The tokens that open and close a reasoning model's thinking (`<think>`, `</think>`).
    thinking_token_ids: Option<(u32, u32)>,
}

impl TokenVocabulary {
    /// `token_bytes[id]` is what token `id` appends to the output, or `None` for tokens a guide
    /// never emits (special tokens: chat markers, EOS, padding). Empty byte strings are left
    /// out too: they would let a guided output grow without moving its automaton.
    pub fn new(token_bytes: Vec<Option<Vec<u8>>>, eos_token_ids: Vec<u32>) -> Self {
        let token_bytes: Vec<Option<Box<[u8]>>> =
            token_bytes.into_iter().map(|b| b.filter(|b| !b.is_empty()).map(Vec::into_boxed_slice)).collect();
        let mut entries: Vec<(&[u8], u32)> =
            token_bytes.iter().enumerate().filter_map(|(id, bytes)| bytes.as_deref().map(|b| (b, id as u32))).collect();
        entries.sort_unstable();
        let mut nodes = vec![TrieNode { byte: 0, children: (0, 0), tokens: (0, 0) }];
        let mut token_ids = Vec::with_capacity(entries.len());
        // Breadth first, so that every node's children are allocated side by side: the queue
        // holds (node, the entries sharing its prefix, the prefix length).
        let mut queue = std::collections::VecDeque::from([(0usize, 0..entries.len(), 0usize)]);
        while let Some((node, range, depth)) = queue.pop_front() {
            let mut start = range.start;
            let tokens_start = token_ids.len() as u32;
            // Sorted entries put the ones ending at this depth first.
            while start < range.end && entries[start].0.len() == depth {
                token_ids.push(entries[start].1);
                start += 1;
            }
            nodes[node].tokens = (tokens_start, token_ids.len() as u32);
            let first_child = nodes.len() as u32;
            let mut i = start;
            while i < range.end {
                let byte = entries[i].0[depth];
                let group_end = i + entries[i..range.end].partition_point(|(b, _)| b[depth] == byte);
                let child = nodes.len();
                nodes.push(TrieNode { byte, children: (0, 0), tokens: (0, 0) });
                queue.push_back((child, i..group_end, depth + 1));
                i = group_end;
            }
            nodes[node].children = (first_child, nodes.len() as u32);
        }
        let vocab_size = token_bytes.len();
        Self { vocab_size, eos_token_ids, nodes, token_ids, token_bytes, thinking_token_ids: None }
    }

    /// The same vocabulary knowing its reasoning markers, so guides may hold off until the
    /// model's thinking is over.
    pub fn with_thinking_tokens(mut self, thinking_token_ids: Option<(u32, u32)>) -> Self {
        self.thinking_token_ids = thinking_token_ids;
        self
    }

    /// `(start, end)` of a reasoning model's thinking, when the vocabulary has them.
    pub fn thinking_token_ids(&self) -> Option<(u32, u32)> {
        self.thinking_token_ids
    }

    /// Whether `token` writes only whitespace (the line breaks models put after `</think>`).
    pub fn is_whitespace(&self, token: u32) -> bool {
        self.bytes_of(token).is_some_and(|b| b.iter().all(u8::is_ascii_whitespace))
    }

    /// What `token` appends to the output; `None` for special and unknown tokens.
    pub fn bytes_of(&self, token: u32) -> Option<&[u8]> {
        self.token_bytes.get(token as usize)?.as_deref()
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }

    /// Every token whose whole byte string `step` accepts from `start`, where `step` moves
    /// a state by one byte (`None`: the byte is refused).
    pub fn tokens_accepted_from<S: Copy>(&self, start: S, step: impl Fn(S, u8) -> Option<S>) -> TokenSet {
        let mut set = TokenSet::empty(self.vocab_size);
        let root = self.nodes[0];
        let mut stack: Vec<(u32, S)> = Vec::with_capacity(64);
        let push_children = |stack: &mut Vec<(u32, S)>, node: TrieNode, state: S| {
            for child in node.children.0..node.children.1 {
                if let Some(next) = step(state, self.nodes[child as usize].byte) {
                    stack.push((child, next));
                }
            }
        };
        push_children(&mut stack, root, start);
        while let Some((index, state)) = stack.pop() {
            let node = self.nodes[index as usize];
            for &token in &self.token_ids[node.tokens.0 as usize..node.tokens.1 as usize] {
                set.insert(token);
            }
            push_children(&mut stack, node, state);
        }
        set
    }
}

/// A set of token ids below the vocabulary size, as a bit set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenSet {
    words: Vec<u64>,
    len: usize,
}

impl TokenSet {
    pub fn empty(vocab_size: usize) -> Self {
        Self { words: vec![0; vocab_size.div_ceil(64)], len: 0 }
    }

    /// Every token of the vocabulary.
    pub fn full(vocab_size: usize) -> Self {
        let mut set = Self::empty(vocab_size);
        (0..vocab_size as u32).for_each(|t| set.insert(t));
        set
    }

    /// Adds `token`; ids past the vocabulary are ignored.
    pub fn insert(&mut self, token: u32) {
        let (word, bit) = (token as usize / 64, token % 64);
        if let Some(w) = self.words.get_mut(word)
            && *w & (1 << bit) == 0
        {
            *w |= 1 << bit;
            self.len += 1;
        }
    }

    pub fn contains(&self, token: u32) -> bool {
        self.words.get(token as usize / 64).is_some_and(|w| w & (1 << (token % 64)) != 0)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.words
            .iter()
            .enumerate()
            .flat_map(|(i, &word)| (0..64u32).filter(move |b| word & (1 << b) != 0).map(move |b| i as u32 * 64 + b))
    }

    /// Sets the logit of every token outside the set to `-inf` (`logits` is `[V]`).
    pub fn mask_logits(&self, logits: &mut [f32]) {
        for (chunk, &word) in logits.chunks_mut(64).zip(&self.words) {
            if word == u64::MAX {
                continue;
            }
            for (bit, logit) in chunk.iter_mut().enumerate() {
                if word & (1 << bit) == 0 {
                    *logit = f32::NEG_INFINITY;
                }
            }
        }
        // Rows wider than the vocabulary (padded embeddings) never sample their padding.
        logits.iter_mut().skip(self.words.len() * 64).for_each(|l| *l = f32::NEG_INFINITY);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocabulary(tokens: &[&str]) -> TokenVocabulary {
        let bytes: Vec<Option<Vec<u8>>> = tokens.iter().map(|t| Some(t.as_bytes().to_vec())).collect();
        TokenVocabulary::new(bytes, vec![])
    }

    #[test]
    fn the_trie_walk_finds_exactly_the_tokens_a_brute_force_scan_finds() {
        let tokens = ["a", "ab", "abc", "b", "ba", "", "abd", "c", "ab", "bcd"];
        let vocab = vocabulary(&tokens);
        // The automaton: strings over {a, b} of at most two bytes.
        let step = |len: u8, byte: u8| (byte != b'c' && byte != b'd' && len < 2).then_some(len + 1);
        let set = vocab.tokens_accepted_from(0u8, step);
        let brute: Vec<u32> = (0..tokens.len() as u32)
            .filter(|&i| {
                let t = tokens[i as usize].as_bytes();
                !t.is_empty() && t.iter().try_fold(0u8, |s, &b| step(s, b)).is_some()
            })
            .collect();
        assert_eq!(set.iter().collect::<Vec<_>>(), brute);
        assert_eq!(brute, [0, 1, 3, 4, 8], "duplicates both found, the empty token never");
        assert_eq!(set.len(), 5);
    }

    #[test]
    fn special_tokens_are_never_accepted() {
        let vocab = TokenVocabulary::new(vec![Some(b"x".to_vec()), None], vec![1]);
        let set = vocab.tokens_accepted_from((), |(), _| Some(()));
        assert!(set.contains(0) && !set.contains(1));
        assert_eq!(vocab.eos_token_ids(), [1]);
        assert_eq!((vocab.bytes_of(0), vocab.bytes_of(1), vocab.bytes_of(2)), (Some(&b"x"[..]), None, None));
    }

    #[test]
    fn masking_leaves_members_and_sends_the_rest_and_padding_to_minus_infinity() {
        let mut set = TokenSet::empty(70);
        set.insert(3);
        set.insert(65);
        set.insert(3);
        set.insert(500);
        assert_eq!(set.len(), 2);
        let mut logits = vec![1.0f32; 130];
        set.mask_logits(&mut logits);
        let kept: Vec<usize> = (0..130).filter(|&i| logits[i] == 1.0).collect();
        assert_eq!(kept, [3, 65]);
    }
}
