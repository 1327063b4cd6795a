//! Where a request goes among data-parallel replicas: to the replica that most likely holds its
//! prompt's start in its prefix cache, unless that replica is busier than the lightest by more
//! than a slack, and otherwise to the lightest (SGLang's cache-aware router makes the same
//! trade).
//!
//! The router cannot see the replicas' caches (they live on the engine threads, keyed by
//! token blocks), so it keeps its own approximate picture: the prompts it sent to each
//! replica, as hashes of their leading 64-byte chunks, the most recent kept. A prompt is its
//! text, its token ids, or its conversation (tools and template first, then the messages in
//! order), so prompts that share a start share leading chunks.

use std::collections::{HashSet, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};

use crate::request::Prompt;

/// Bytes of prompt per hashed chunk.
const CHUNK_BYTES: usize = 64;
/// Chunk hashes remembered per replica before the oldest are forgotten.
const REMEMBERED_CHUNKS: usize = 1 << 16;

/// The hashes of `prompt`'s whole leading chunks, each covering everything before it.
pub fn prefix_chunks(prompt: &Prompt) -> Vec<u64> {
    let bytes: Vec<u8> = match prompt {
        Prompt::Text(text) => text.as_bytes().to_vec(),
        Prompt::Tokens(ids) => ids.iter().flat_map(|t| t.to_le_bytes()).collect(),
        Prompt::Chat(conversation) => {
            let context = (&conversation.tools, &conversation.chat_template, &conversation.chat_template_kwargs);
            let mut bytes = serde_json::to_vec(&context).unwrap_or_default();
            for message in &conversation.messages {
                bytes.extend(serde_json::to_vec(message).unwrap_or_default());
            }
            bytes
        }
    };
    let mut hasher = DefaultHasher::new();
    bytes
        .chunks_exact(CHUNK_BYTES)
        .map(|chunk| {
            chunk.hash(&mut hasher);
            hasher.finish()
        })
        .collect()
}

/// The chunks one replica was sent, the most recent kept.
#[derive(Debug, Default)]
pub struct SentPrefixes {
    chunks: HashSet<u64>,
    order: VecDeque<u64>,
}

impl SentPrefixes {
    /// How many of `chunks` (a prompt's, in order) this replica was sent, from the first on.
    pub fn matched(&self, chunks: &[u64]) -> usize {
        chunks.iter().take_while(|c| self.chunks.contains(c)).count()
    }

    pub fn record(&mut self, chunks: &[u64]) {
        for &chunk in chunks {
            if self.chunks.insert(chunk) {
                self.order.push_back(chunk);
            }
        }
        while self.order.len() > REMEMBERED_CHUNKS {
            let oldest = self.order.pop_front().expect("longer than the bound");
            self.chunks.remove(&oldest);
        }
    }
}

/// The replica for a request: among those whose load is within `slack` of the lightest, the
/// one that matched the most leading chunks, then the lighter, then the first.
pub fn choose_replica(loads: &[usize], matched: &[usize], slack: usize) -> usize {
    let lightest = loads.iter().copied().min().unwrap_or(0);
    (0..loads.len())
        .filter(|&i| loads[i] <= lightest + slack)
        .min_by_key(|&i| (std::cmp::Reverse(matched[i]), loads[i], i))
        .expect("the lightest replica is within any slack")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat_template::ChatMessage;

    #[test]
    fn prompts_sharing_a_start_share_its_whole_chunks() {
        let long = "You are a helpful assistant. ".repeat(8);
        let a = prefix_chunks(&Prompt::Text(format!("{long}What is 2 + 2?")));
        let b = prefix_chunks(&Prompt::Text(format!("{long}Name a colour.")));
        assert_eq!(a.len(), (long.len() + 14) / CHUNK_BYTES);
        let shared = long.len() / CHUNK_BYTES;
        assert_eq!(a[..shared], b[..shared]);
        assert!(prefix_chunks(&Prompt::Text("short".into())).is_empty(), "no whole chunk");
        let other = prefix_chunks(&Prompt::Text(format!("!{long}")));
        assert!(other.iter().zip(&a).all(|(x, y)| x != y), "a chunk covers everything before it");

        let tokens = |last: u32| prefix_chunks(&Prompt::Tokens((0..40).chain([last]).collect()));
        assert_eq!(tokens(1).len(), 41 * 4 / CHUNK_BYTES);
        assert_eq!(tokens(1)[..2], tokens(2)[..2], "40 shared tokens: two whole chunks of 16");

        let chat = |question: &str| {
            let system = ChatMessage::new("system", &long);
            prefix_chunks(&Prompt::Chat(vec![system, ChatMessage::new("user", question)].into()))
        };
        assert_eq!(chat("Hi")[..shared], chat("Hello")[..shared], "the same system message");
    }

    #[test]
    fn a_replica_matches_the_chunks_it_was_sent_from_the_first_on() {
        let mut sent = SentPrefixes::default();
        sent.record(&[1, 2, 3]);
        assert_eq!(sent.matched(&[1, 2, 9, 3]), 2);
        assert_eq!(sent.matched(&[9, 1, 2]), 0, "counted from the first chunk on");
        for i in 0..REMEMBERED_CHUNKS as u64 {
            sent.record(&[100 + i]);
        }
        assert_eq!(sent.matched(&[1]), 0, "the oldest chunks are forgotten");
        assert_eq!(sent.matched(&[99 + REMEMBERED_CHUNKS as u64]), 1);
    }

    #[test]
    fn the_replica_holding_the_prefix_wins_within_the_slack_and_the_lightest_otherwise() {
        assert_eq!(choose_replica(&[1, 0], &[2, 0], 2), 0, "its cache beats one more request");
        assert_eq!(choose_replica(&[3, 0], &[2, 0], 2), 1, "but not three");
        assert_eq!(choose_replica(&[2, 1, 1], &[0, 0, 0], 2), 1, "no match: the lightest, the first on ties");
        assert_eq!(choose_replica(&[1, 1], &[3, 3], 2), 0);
        assert_eq!(choose_replica(&[2, 1], &[3, 3], 2), 1, "equal matches: the lighter");
    }
}
