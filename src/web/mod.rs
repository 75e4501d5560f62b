//! Web stage: what the gateway answers itself over HTTP besides `/v1`: the usage API (and,
//! later, the usage page and the console).

pub mod usage_api;
