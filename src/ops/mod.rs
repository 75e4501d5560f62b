//! Operations: what the gateway does for its operator beside serving requests: the in-flight
//! count and shutdown drain, metrics, traces, the access log, the log's redaction and the
//! allocator's housekeeping. It stands below every stage and uses none of them.

pub mod access_log;
pub mod alloc;
pub mod lifecycle;
pub mod metrics;
pub mod redact;
pub mod telemetry;
