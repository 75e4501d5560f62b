//! modelgate: an OpenAI-compatible gateway on Pingora. Modules follow one request:
//! config → server → proxy (auth → route → upstream → reply) → admin.

pub mod access_log;
pub mod admin;
pub mod alloc;
pub mod auth;
pub mod cli;
pub mod client;
pub mod config;
pub mod cors;
pub mod error;
pub mod http1;
pub mod lifecycle;
pub mod limit;
pub mod meter;
pub mod metrics;
pub mod mock_upstream;
pub mod proxy;
pub mod redact;
pub mod respond;
pub mod route;
pub mod server;
pub mod state;
pub mod store;
pub mod telemetry;
pub mod tls;
pub mod upstream;
pub mod web;
