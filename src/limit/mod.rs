//! Limits stage: decisions that refuse a key before any upstream is touched. `rate` holds the
//! exact rpm/tpm/concurrency windows; `budget` keeps each key's spend in memory; `shared` counts
//! both in Redis for a fleet.

pub mod budget;
pub mod rate;
pub mod reserve;
pub mod shared;
