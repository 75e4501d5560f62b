//! modelgate: an OpenAI-compatible gateway on Pingora. The modules follow one request, top
//! to bottom: cli → server → state → proxy → http1 → web → auth → limit → route → upstream →
//! meter → store → config → ops; each uses only those below it (`tests/architecture.rs`).

pub mod auth;
pub mod cli;
pub mod config;
pub mod error;
pub mod http1;
pub mod limit;
pub mod meter;
pub mod mock_upstream;
pub mod ops;
pub mod proxy;
pub mod route;
pub mod server;
pub mod state;
pub mod store;
pub mod upstream;
pub mod web;
