//! [`Trie`]: a compressed trie over key sequences whose nodes may hold an
//! entry, with byte accounting and least-recently-used eviction.
//!
//! The trie knows nothing about caches: an entry is any value with a size in
//! bytes. Nodes live in an arena (`Vec<Option<Node>>` plus a free list) and
//! are addressed by [`NodeId`]; a node with no entry and fewer than two
//! children is merged away, so every node is the root, a branch point or an
//! entry.

use std::collections::BTreeMap;

/// Index of a node in the arena.
pub(crate) type NodeId = usize;

const ROOT: NodeId = 0;

#[derive(Debug)]
struct Node<E> {
    /// Keys on the edge from the parent (empty only for the root).
    edge: Vec<u64>,
    /// Keys from the root to the end of this node's edge.
    depth: usize,
    parent: Option<NodeId>,
    /// Children by the first key of their edge.
    children: BTreeMap<u64, NodeId>,
    entry: Option<Slot<E>>,
}

#[derive(Debug)]
struct Slot<E> {
    value: E,
    bytes: usize,
    /// Tick of the last insert or use: smaller is older.
    used: u64,
}

/// The outcome of [`Trie::find`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Found {
    /// Leading keys of the query that some stored sequence shares.
    pub matched: usize,
    /// Entries on the matched path ending at or before `matched`, as
    /// `(node, depth)`, deepest first.
    pub on_path: Vec<(NodeId, usize)>,
    /// The most recently used entry whose sequence extends the matched keys
    /// past the last `on_path` node (depth ≥ `matched`), if any.
    pub below: Option<(NodeId, usize)>,
}

/// A compressed trie of entries keyed by `u64` sequences.
#[derive(Debug)]
pub(crate) struct Trie<E> {
    nodes: Vec<Option<Node<E>>>,
    free: Vec<NodeId>,
    bytes: usize,
    entries: usize,
    tick: u64,
}

impl<E> Default for Trie<E> {
    fn default() -> Self {
        Trie::new()
    }
}

impl<E> Trie<E> {
    /// An empty trie.
    pub(crate) fn new() -> Trie<E> {
        Trie {
            nodes: vec![Some(Node {
                edge: Vec::new(),
                depth: 0,
                parent: None,
                children: BTreeMap::new(),
                entry: None,
            })],
            free: Vec::new(),
            bytes: 0,
            entries: 0,
            tick: 0,
        }
    }

    /// Bytes of all entries.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Entries stored.
    pub(crate) fn len(&self) -> usize {
        self.entries
    }

    /// True when no entry is stored.
    pub(crate) fn is_empty(&self) -> bool {
        self.entries == 0
    }

    /// Live nodes, the root included (for tests of the merging).
    #[cfg(test)]
    pub(crate) fn node_count(&self) -> usize {
        self.nodes.len() - self.free.len()
    }

    fn node(&self, id: NodeId) -> &Node<E> {
        self.nodes[id].as_ref().expect("live node")
    }

    fn node_mut(&mut self, id: NodeId) -> &mut Node<E> {
        self.nodes[id].as_mut().expect("live node")
    }

    fn alloc(&mut self, node: Node<E>) -> NodeId {
        match self.free.pop() {
            Some(id) => {
                self.nodes[id] = Some(node);
                id
            }
            None => {
                self.nodes.push(Some(node));
                self.nodes.len() - 1
            }
        }
    }

    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// The entry at `id`.
    pub(crate) fn get(&self, id: NodeId) -> Option<&E> {
        self.nodes
            .get(id)?
            .as_ref()?
            .entry
            .as_ref()
            .map(|s| &s.value)
    }

    /// Marks the entry at `id` as just used.
    pub(crate) fn touch(&mut self, id: NodeId) {
        let t = self.next_tick();
        if let Some(s) = self.node_mut(id).entry.as_mut() {
            s.used = t;
        }
    }

    /// Stores `value` (of `bytes`) under `keys`, returning the entry it
    /// replaces there, and the node that holds it.
    pub(crate) fn insert(&mut self, keys: &[u64], value: E, bytes: usize) -> (NodeId, Option<E>) {
        let mut at = ROOT;
        let mut i = 0;
        while i < keys.len() {
            let Some(&child) = self.node(at).children.get(&keys[i]) else {
                let depth = keys.len();
                let leaf = self.alloc(Node {
                    edge: keys[i..].to_vec(),
                    depth,
                    parent: Some(at),
                    children: BTreeMap::new(),
                    entry: None,
                });
                self.node_mut(at).children.insert(keys[i], leaf);
                at = leaf;
                break;
            };
            let edge = &self.node(child).edge;
            let common = edge
                .iter()
                .zip(&keys[i..])
                .take_while(|(a, b)| a == b)
                .count();
            if common < edge.len() {
                self.split(child, common);
            }
            at = child;
            i += common;
        }
        let used = self.next_tick();
        let old = self.node_mut(at).entry.replace(Slot { value, bytes, used });
        self.bytes += bytes;
        self.entries += 1;
        let old = old.map(|s| {
            self.bytes -= s.bytes;
            self.entries -= 1;
            s.value
        });
        (at, old)
    }

    /// Splits `id`'s edge after `at` keys: `id` keeps the head and a new
    /// child takes the tail, the entry and the children.
    fn split(&mut self, id: NodeId, at: usize) {
        let node = self.node_mut(id);
        assert!(
            at > 0 && at < node.edge.len(),
            "split at {at} of an edge of {}",
            node.edge.len()
        );
        let tail = node.edge.split_off(at);
        let depth = node.depth;
        node.depth = depth - tail.len();
        let children = std::mem::take(&mut node.children);
        let entry = node.entry.take();
        let first = tail[0];
        let child = self.alloc(Node {
            edge: tail,
            depth,
            parent: Some(id),
            children,
            entry,
        });
        let grandchildren: Vec<NodeId> = self.node(child).children.values().copied().collect();
        for g in grandchildren {
            self.node_mut(g).parent = Some(child);
        }
        self.node_mut(id).children.insert(first, child);
    }

    /// The longest stored prefix of `keys` and the entries that can serve it.
    pub(crate) fn find(&self, keys: &[u64]) -> Found {
        let mut at = ROOT;
        let mut matched = 0;
        let mut on_path = Vec::new();
        let mut partial = None;
        loop {
            if self.node(at).entry.is_some() {
                on_path.push((at, self.node(at).depth));
            }
            let Some(&child) = keys
                .get(matched)
                .and_then(|k| self.node(at).children.get(k))
            else {
                break;
            };
            let edge = &self.node(child).edge;
            let common = edge
                .iter()
                .zip(&keys[matched..])
                .take_while(|(a, b)| a == b)
                .count();
            matched += common;
            if common < edge.len() {
                partial = Some(child);
                break;
            }
            at = child;
        }
        on_path.reverse();
        // Entries strictly below the last full node, or in the partly matched
        // child, extend the match; the node's own entry is already on the path.
        let below = match partial {
            Some(child) => self.freshest_in(child),
            None => self
                .node(at)
                .children
                .values()
                .filter_map(|&c| self.freshest_in(c))
                .max_by_key(|&(id, _)| self.used(id)),
        };
        Found {
            matched,
            on_path,
            below,
        }
    }

    fn used(&self, id: NodeId) -> u64 {
        self.node(id).entry.as_ref().map_or(0, |s| s.used)
    }

    /// The most recently used entry in the subtree of `id`.
    fn freshest_in(&self, id: NodeId) -> Option<(NodeId, usize)> {
        let mut best: Option<NodeId> = None;
        let mut stack = vec![id];
        while let Some(n) = stack.pop() {
            let node = self.node(n);
            if node.entry.is_some() && best.is_none_or(|b| self.used(n) > self.used(b)) {
                best = Some(n);
            }
            stack.extend(node.children.values().copied());
        }
        best.map(|n| (n, self.node(n).depth))
    }

    /// The entries on the path from the root to `id`, excluding `id`.
    pub(crate) fn ancestors_with_entries(&self, id: NodeId) -> Vec<NodeId> {
        let mut out = Vec::new();
        let mut at = self.node(id).parent;
        while let Some(p) = at {
            if self.node(p).entry.is_some() {
                out.push(p);
            }
            at = self.node(p).parent;
        }
        out
    }

    /// Removes and returns the entry at `id`, merging nodes it leaves bare.
    pub(crate) fn remove(&mut self, id: NodeId) -> Option<E> {
        let slot = self.nodes.get_mut(id)?.as_mut()?.entry.take()?;
        self.bytes -= slot.bytes;
        self.entries -= 1;
        self.prune(id);
        Some(slot.value)
    }

    /// The least recently used entry.
    pub(crate) fn oldest(&self) -> Option<NodeId> {
        self.nodes
            .iter()
            .enumerate()
            .filter_map(|(id, n)| n.as_ref()?.entry.as_ref().map(|s| (s.used, id)))
            .min()
            .map(|(_, id)| id)
    }

    /// Evicts least recently used entries until at most `budget` bytes are
    /// held; returns them, oldest first.
    pub(crate) fn evict_to(&mut self, budget: usize) -> Vec<E> {
        let mut out = Vec::new();
        while self.bytes > budget {
            let id = self.oldest().expect("bytes held means an entry exists");
            out.extend(self.remove(id));
        }
        out
    }

    /// Removes every entry.
    pub(crate) fn clear(&mut self) -> Vec<E> {
        let mut out = Vec::new();
        while let Some(id) = self.oldest() {
            out.extend(self.remove(id));
        }
        out
    }

    /// Drops `id` if it is a bare leaf, or merges it into its only child,
    /// then looks at its parent the same way.
    fn prune(&mut self, id: NodeId) {
        if id == ROOT {
            return;
        }
        let node = self.node(id);
        if node.entry.is_some() || node.children.len() > 1 {
            return;
        }
        let parent = node.parent.expect("non-root node has a parent");
        let first = node.edge[0];
        if let Some(&only) = node.children.values().next() {
            // Fold this node's edge into its only child.
            let head = self.node_mut(id).edge.clone();
            let child = self.node_mut(only);
            let mut edge = head;
            edge.extend_from_slice(&child.edge);
            child.edge = edge;
            child.parent = Some(parent);
            self.node_mut(parent).children.insert(first, only);
            self.nodes[id] = None;
            self.free.push(id);
            return;
        }
        self.node_mut(parent).children.remove(&first);
        self.nodes[id] = None;
        self.free.push(id);
        self.prune(parent);
    }
}

#[cfg(test)]
mod tests;
