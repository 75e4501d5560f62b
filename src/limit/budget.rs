//! Spend per key, in memory: loaded from the store at start, advanced when a record is made,
//! checked before a request goes upstream. Beside each key's spend, what the requests in
//! flight hold of its budget (`budget_mode = "reserve"`, see `reserve`): a request's worst
//! cost is held at admission, against the spend and every other hold, and settled to its real
//! cost when it ends, so requests in flight cannot together pass the budget.
//!
//! Counted in whole picocredits (10⁻¹² credit, the unit a record's cost is rounded to), so a
//! sum is exact: eight costs of 0.1 reach a budget of 0.8. In floating point they add up to
//! 0.7999999999999999, and a ninth request was served while every page showed the budget
//! spent. Figures that come in as floating point (the store's totals, Redis's) are read to
//! the nearest picocredit.

use std::collections::HashMap;
use std::sync::Arc;

use dashmap::DashMap;

use crate::config::keys::Key;

/// Picocredits in a credit.
const PICO: f64 = 1e12;

/// Credits as whole picocredits (saturating far beyond any budget: 1.7e26 credits).
pub fn pico(credits: f64) -> i128 {
    (credits * PICO).round() as i128
}

/// Whether `spent` credits have reached `budget`, to the picocredit.
pub fn reached(spent: f64, budget: f64) -> bool {
    pico(spent) >= pico(budget)
}

/// Credits to the nearest picocredit, as the pages show a spend.
pub fn exact(credits: f64) -> f64 {
    pico(credits) as f64 / PICO
}

/// What is left of `budget` after `spent`, to the picocredit (never below 0): 0 exactly when
/// `reached` says so.
pub fn remaining(spent: f64, budget: f64) -> f64 {
    (pico(budget) - pico(spent)).max(0) as f64 / PICO
}

/// A key's spend and what requests in flight hold of its budget, in picocredits.
#[derive(Debug, Default, Clone, Copy)]
struct Account {
    spent: i128,
    held: i128,
}

#[derive(Debug, Default)]
pub struct Spend {
    by_key: DashMap<String, Account, foldhash::fast::RandomState>,
}

impl Spend {
    pub fn from_totals(totals: HashMap<String, f64>) -> Spend {
        Spend {
            by_key: totals
                .into_iter()
                .map(|(k, v)| {
                    let spent = pico(v);
                    (k, Account { spent, held: 0 })
                })
                .collect(),
        }
    }

    pub fn get(&self, key_id: &str) -> f64 {
        self.by_key
            .get(key_id)
            .map_or(0.0, |a| a.spent as f64 / PICO)
    }

    /// What requests in flight hold of the key's budget.
    pub fn held(&self, key_id: &str) -> f64 {
        self.by_key
            .get(key_id)
            .map_or(0.0, |a| a.held as f64 / PICO)
    }

    pub fn add(&self, key_id: &str, cost: f64) {
        let cost = pico(cost);
        if cost > 0 {
            let mut a = self.by_key.entry(key_id.to_string()).or_default();
            a.spent = a.spent.saturating_add(cost);
        }
    }

    /// Raises each key's spend to at least `totals` (the store's, which other gateways of a
    /// fleet add to); never lowers it (this gateway's latest costs may not be stored yet).
    pub fn raise_to(&self, totals: &HashMap<String, f64>) {
        for (key, total) in totals {
            let total = pico(*total);
            let mut a = self.by_key.entry(key.clone()).or_default();
            if total > a.spent {
                a.spent = total;
            }
        }
    }

    /// The key's spend has reached its budget.
    pub fn exhausted(&self, key: &Key) -> bool {
        key.budget.is_some_and(|b| {
            let spent = self.by_key.get(&key.id).map_or(0, |a| a.spent);
            spent >= pico(b)
        })
    }

    /// Holds part of the key's budget for one request: `decide` is told what is left after
    /// the spend (picocredits, after `floor` (the fleet's spend) when that is higher) and
    /// what other requests hold, and says what to hold, or why not. Decided and held under
    /// the key's lock, so two requests never both count the same credits as left. None for
    /// a key without a budget.
    pub fn hold<E>(
        self: &Arc<Self>,
        key: &Key,
        floor: i128,
        decide: impl FnOnce(i128, i128) -> Result<i128, E>,
    ) -> Result<Option<BudgetHold>, E> {
        let Some(budget) = key.budget.map(pico) else {
            return Ok(None);
        };
        let mut a = self.by_key.entry(key.id.clone()).or_default();
        let left = budget - a.spent.max(floor);
        let amount = decide(left, a.held)?.max(0);
        a.held = a.held.saturating_add(amount);
        drop(a);
        Ok(Some(BudgetHold {
            spend: Arc::clone(self),
            key_id: key.id.clone(),
            amount,
        }))
    }
}

/// Credits held of a key's budget by one request: settled to its real cost when it ends
/// (`settle`), released if it is dropped unsettled.
#[derive(Debug)]
pub struct BudgetHold {
    spend: Arc<Spend>,
    key_id: String,
    amount: i128,
}

impl BudgetHold {
    /// The hold, in credits.
    pub fn credits(&self) -> f64 {
        self.amount as f64 / PICO
    }

    /// Replaces the hold by the request's real cost, in one step (no moment counts neither).
    pub fn settle(mut self, cost: f64) {
        let amount = std::mem::take(&mut self.amount);
        let mut a = self.spend.by_key.entry(self.key_id.clone()).or_default();
        a.held = a.held.saturating_sub(amount).max(0);
        a.spent = a.spent.saturating_add(pico(cost).max(0));
    }
}

impl Drop for BudgetHold {
    fn drop(&mut self) {
        if self.amount != 0 {
            if let Some(mut a) = self.spend.by_key.get_mut(&self.key_id) {
                a.held = a.held.saturating_sub(self.amount).max(0);
            }
        }
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

    #[test]
    fn costs_add_up_exactly_to_the_budget() {
        let t = KeyTable::parse("k", "[[keys]]\nid='a'\nsecret='sk-aaaaaaaa'\nbudget=0.8\n")
            .expect("keys");
        let a = t
            .get_by_hash(&crate::config::keys::sha256(b"sk-aaaaaaaa"))
            .expect("a");
        let s = Spend::default();
        for _ in 0..7 {
            s.add("a", 0.1);
        }
        assert!(!s.exhausted(a));
        s.add("a", 0.1);
        assert!(s.exhausted(a), "8 x 0.1 is 0.8: {}", s.get("a"));
        assert_eq!(s.get("a"), 0.8);
        // A store's or Redis's floating-point total reads to the picocredit.
        assert!(reached(0.7999999999999999, 0.8));
        assert!(!reached(0.799999999999, 0.8));
        assert_eq!(remaining(0.7999999999999999, 0.8), 0.0);
        assert_eq!(remaining(9e-10, 1e-9), 1e-10);
        assert_eq!(exact(9e-10), 9e-10);
        let r = Spend::from_totals(HashMap::from([("a".to_string(), 0.7999999999999999)]));
        assert!(r.exhausted(a));
    }
}
