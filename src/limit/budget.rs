//! Spend per key, in memory: loaded from the store at start, advanced when a record is made,
//! checked before a request goes upstream. A budget can be overshot by at most the requests
//! already in flight when it is reached, since their cost is only known when they end.

use std::collections::HashMap;

use dashmap::DashMap;

use crate::config::keys::Key;

#[derive(Debug, Default)]
pub struct Spend {
    by_key: DashMap<String, f64>,
}

impl Spend {
    pub fn from_totals(totals: HashMap<String, f64>) -> Spend {
        Spend {
            by_key: totals.into_iter().collect(),
        }
    }

    pub fn get(&self, key_id: &str) -> f64 {
        self.by_key.get(key_id).map_or(0.0, |v| *v)
    }

    pub fn add(&self, key_id: &str, cost: f64) {
        if cost > 0.0 {
            *self.by_key.entry(key_id.to_string()).or_insert(0.0) += cost;
        }
    }

    /// Raises each key's spend to at least `totals` (the store's, which other gateways of a
    /// fleet add to); never lowers it (this gateway's latest costs may not be stored yet).
    pub fn raise_to(&self, totals: &HashMap<String, f64>) {
        for (key, total) in totals {
            let mut v = self.by_key.entry(key.clone()).or_insert(0.0);
            if *total > *v {
                *v = *total;
            }
        }
    }

    /// The key's spend has reached its budget.
    pub fn exhausted(&self, key: &Key) -> bool {
        key.budget.is_some_and(|b| self.get(&key.id) >= b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::keys::KeyTable;

    #[test]
    fn a_key_is_exhausted_once_spend_reaches_its_budget() {
        let t = KeyTable::parse("k", "[[keys]]\nid='a'\nsecret='sk-aaaaaaaa'\nbudget=1.0\n[[keys]]\nid='b'\nsecret='sk-bbbbbbbb'\n")
            .expect("keys");
        let a = t
            .get_by_hash(&crate::config::keys::sha256(b"sk-aaaaaaaa"))
            .expect("a");
        let b = t
            .get_by_hash(&crate::config::keys::sha256(b"sk-bbbbbbbb"))
            .expect("b");
        let s = Spend::from_totals(HashMap::from([("a".to_string(), 0.4)]));
        assert!(!s.exhausted(a));
        s.add("a", 0.6);
        assert!(s.exhausted(a));
        s.add("b", 1e9);
        assert!(!s.exhausted(b), "no budget, never exhausted");
    }
}
