//! Which upstream made each stored response of the Responses API, so that
//! `/v1/responses/{id}` (retrieve, delete, input items, cancel) goes back to the one server
//! that has it. A response belongs to the key that made it: another key gets a 404, as if it
//! did not exist. Bounded, in memory: the oldest ids are forgotten first, and a restart
//! forgets them all (then only a gateway with a single upstream can still tell where one is).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// Most ids remembered.
const CAP: usize = 100_000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub key_id: String,
    /// The model whose route served it (a fallback's, if one did).
    pub model: String,
    pub pool: String,
    /// The URL of the upstream in that pool.
    pub upstream: String,
}

#[derive(Default)]
pub struct StoredResponses {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    by_id: HashMap<String, Origin>,
    /// Arrival order, for forgetting the oldest (may hold ids already forgotten).
    order: VecDeque<String>,
}

impl StoredResponses {
    pub fn remember(&self, id: String, origin: Origin) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if inner.by_id.insert(id.clone(), origin).is_none() {
            inner.order.push_back(id);
        }
        while inner.by_id.len() > CAP || inner.order.len() > 2 * CAP {
            let Some(old) = inner.order.pop_front() else {
                break;
            };
            inner.by_id.remove(&old);
        }
    }

    /// Where `id` was made, if `key_id` made it.
    pub fn find(&self, id: &str, key_id: &str) -> Option<Origin> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.by_id.get(id).filter(|o| o.key_id == key_id).cloned()
    }

    pub fn forget(&self, id: &str) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.by_id.remove(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin(key: &str) -> Origin {
        Origin {
            key_id: key.into(),
            model: "m".into(),
            pool: "p".into(),
            upstream: "http://u".into(),
        }
    }

    #[test]
    fn a_response_is_found_only_by_the_key_that_made_it_until_forgotten() {
        let s = StoredResponses::default();
        s.remember("resp_1".into(), origin("a"));
        assert_eq!(s.find("resp_1", "a"), Some(origin("a")));
        assert_eq!(s.find("resp_1", "b"), None);
        s.forget("resp_1");
        assert_eq!(s.find("resp_1", "a"), None);
    }

    #[test]
    fn the_oldest_are_forgotten_past_the_cap() {
        let s = StoredResponses::default();
        for i in 0..CAP + 10 {
            s.remember(format!("r{i}"), origin("a"));
        }
        assert_eq!(s.find("r0", "a"), None);
        assert_eq!(s.find("r9", "a"), None);
        assert!(s.find("r10", "a").is_some());
        assert!(s.find(&format!("r{}", CAP + 9), "a").is_some());
    }
}
