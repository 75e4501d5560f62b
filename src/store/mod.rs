//! Store stage: usage records and spend, kept off the request path. (The SQLite backend and
//! its batching writer are being written.)

pub mod record;

pub use record::{CSV_HEADER, UsageRecord};
