//! Limits stage: decisions that refuse a key before any upstream is touched. `budget` keeps
//! each key's spend in memory (loaded from the store at start, advanced as records are made).

pub mod budget;
