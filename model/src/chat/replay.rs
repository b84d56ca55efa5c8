//! The server's memory of sampled tool-call bytes, by call id.
//!
//! DeepSeek V4 writes its calls in DSML; the API hands them to the client
//! as JSON with a call id. When the client sends that call back in a later
//! request's history, rendering it canonically could differ from what the
//! model sampled (whitespace, parameter order, number formatting), which
//! changes the prompt and defeats prompt caching. So each response's DSML
//! block is remembered here under its call ids, and history that names one
//! of them renders the original bytes.
//!
//! The store is bounded: it keeps the [`ReplayStore::DEFAULT_CAPACITY`]
//! most recently used ids and forgets older ones (least recently used
//! first). Unknown or forgotten ids fall back to the canonical rendering,
//! which is what the model would have written in the usual case.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use super::dsml::ReplayMap;

#[derive(Debug, Default)]
struct Inner {
    /// id -> (bytes, last use).
    by_id: HashMap<String, (Arc<str>, u64)>,
    /// last use -> id, oldest first.
    order: BTreeMap<u64, String>,
    clock: u64,
}

impl Inner {
    fn touch(&mut self, id: &str) -> Option<Arc<str>> {
        self.clock += 1;
        let now = self.clock;
        let (raw, used) = self.by_id.get_mut(id)?;
        self.order.remove(used);
        *used = now;
        self.order.insert(now, id.to_string());
        Some(raw.clone())
    }
}

/// Call id -> the DSML bytes of the block the call was sampled in; a
/// bounded LRU shared by all requests.
#[derive(Debug)]
pub struct ReplayStore {
    capacity: usize,
    inner: Mutex<Inner>,
}

impl Default for ReplayStore {
    fn default() -> Self {
        ReplayStore::new(ReplayStore::DEFAULT_CAPACITY)
    }
}

impl ReplayStore {
    /// Ids remembered by default (a block is typically well under 1 KiB).
    pub const DEFAULT_CAPACITY: usize = 4096;

    pub fn new(capacity: usize) -> ReplayStore {
        ReplayStore {
            capacity: capacity.max(1),
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Remember `raw` for every id of one block.
    pub fn insert<'a>(&self, ids: impl IntoIterator<Item = &'a str>, raw: &str) {
        let raw: Arc<str> = raw.into();
        let mut g = self.lock();
        for id in ids {
            g.clock += 1;
            let now = g.clock;
            if let Some((_, used)) = g.by_id.insert(id.to_string(), (raw.clone(), now)) {
                g.order.remove(&used);
            }
            g.order.insert(now, id.to_string());
            while g.by_id.len() > self.capacity {
                let Some((_, oldest)) = g.order.pop_first() else {
                    break;
                };
                g.by_id.remove(&oldest);
            }
        }
    }

    /// The bytes remembered for `id` (marking it used).
    pub fn get(&self, id: &str) -> Option<Arc<str>> {
        self.lock().touch(id)
    }

    pub fn len(&self) -> usize {
        self.lock().by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A renderer's replay map for the calls in `ids` that are known.
    pub fn map_for<'a>(&self, ids: impl IntoIterator<Item = &'a str>) -> ReplayMap {
        let mut m = ReplayMap::new();
        for id in ids {
            if let Some(raw) = self.get(id) {
                m.insert([id], &raw);
            }
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn least_recently_used_ids_are_forgotten_first() {
        let s = ReplayStore::new(2);
        s.insert(["a"], "A");
        s.insert(["b"], "B");
        assert_eq!(s.get("a").as_deref(), Some("A"));
        s.insert(["c"], "C");
        assert_eq!(s.len(), 2);
        assert!(s.get("b").is_none(), "b was the least recently used");
        assert_eq!(s.get("a").as_deref(), Some("A"));
        assert_eq!(s.get("c").as_deref(), Some("C"));
        let m = s.map_for(["a", "zz"]);
        assert_eq!(m.get("a"), Some("A"));
        assert_eq!(m.len(), 1);
    }

    #[test]
    fn one_block_is_stored_under_each_of_its_ids() {
        let s = ReplayStore::default();
        s.insert(["x", "y"], "RAW");
        assert_eq!(s.get("y").as_deref(), Some("RAW"));
        assert_eq!(s.get("x").as_deref(), Some("RAW"));
    }
}
