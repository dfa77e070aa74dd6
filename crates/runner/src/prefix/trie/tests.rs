//! The prefix trie against a naive model: longest matches, byte accounting,
//! LRU eviction and node merging (no MLX involved).

use super::Trie;
use crate::prefix::keys;
use proptest::prelude::*;

fn lcp(a: &[u64], b: &[u64]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[derive(Debug, Clone)]
enum Op {
    Insert(Vec<u64>, usize),
    Find(Vec<u64>),
    Evict(usize),
}

fn seq() -> impl Strategy<Value = Vec<u64>> {
    // A tiny alphabet, so sequences share prefixes often.
    prop::collection::vec(0u64..3, 1..8)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (seq(), 1usize..100).prop_map(|(k, b)| Op::Insert(k, b)),
        seq().prop_map(Op::Find),
        (0usize..300).prop_map(Op::Evict),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The trie agrees with a list of (keys, bytes, last use) on matches,
    /// bytes and which entries eviction removes; bare nodes are merged away.
    #[test]
    fn trie_matches_a_naive_model(ops in prop::collection::vec(op(), 1..40)) {
        let mut trie: Trie<Vec<u64>> = Trie::new();
        let mut model: Vec<(Vec<u64>, usize, u64)> = Vec::new();
        let mut tick = 0u64;
        for op in ops {
            tick += 1;
            match op {
                Op::Insert(k, b) => {
                    let (_, old) = trie.insert(&k, k.clone(), b);
                    let had = model.iter().position(|(m, ..)| *m == k);
                    prop_assert_eq!(old.is_some(), had.is_some());
                    if let Some(i) = had {
                        model.remove(i);
                    }
                    model.push((k, b, tick));
                }
                Op::Find(q) => {
                    let f = trie.find(&q);
                    let want = model.iter().map(|(m, ..)| lcp(m, &q)).max().unwrap_or(0);
                    prop_assert_eq!(f.matched, want);
                    for &(id, depth) in &f.on_path {
                        let k = trie.get(id).unwrap();
                        prop_assert_eq!(k.len(), depth);
                        prop_assert!(depth <= f.matched && lcp(k, &q) == depth);
                    }
                    if let Some((id, depth)) = f.below {
                        let k = trie.get(id).unwrap();
                        prop_assert_eq!(k.len(), depth);
                        prop_assert!(depth >= f.matched && lcp(k, &q) == f.matched);
                    }
                }
                Op::Evict(budget) => {
                    let out = trie.evict_to(budget);
                    model.sort_by_key(|&(_, _, t)| t);
                    let mut want = Vec::new();
                    while model.iter().map(|(_, b, _)| b).sum::<usize>() > budget {
                        want.push(model.remove(0).0);
                    }
                    prop_assert_eq!(out, want);
                }
            }
            prop_assert_eq!(trie.len(), model.len());
            prop_assert_eq!(trie.bytes(), model.iter().map(|(_, b, _)| b).sum::<usize>());
            // Root plus entries plus branch points: never more than 2n nodes.
            prop_assert!(trie.node_count() <= 1 + 2 * model.len());
        }
        trie.clear();
        prop_assert_eq!(trie.node_count(), 1);
    }
}

#[test]
fn keys_are_tokens_or_token_pairs() {
    assert_eq!(keys(&[1, 2, 3], 0), vec![1, 2, 3]);
    assert_eq!(keys(&[1, 2, 3], 1), vec![(1 << 32) | 2, (2 << 32) | 3]);
    assert!(keys(&[7], 1).is_empty());
    // A different look-ahead token changes the key: a pair match verifies it.
    assert_ne!(keys(&[1, 2], 1), keys(&[1, 3], 1));
}
