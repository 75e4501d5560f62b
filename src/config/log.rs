//! `[log]`: its raw form as serde reads it, and its check.

use std::path::PathBuf;

use serde::Deserialize;
use toml::Spanned;

use super::*;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLog {
    /// "on", "off", or a sample rate in 0..=1.
    pub(super) access: Option<Spanned<toml::Value>>,
    /// "json" (default) or "logfmt".
    pub(super) format: Option<Spanned<String>>,
    /// The access log to a file (appended) instead of stdout.
    pub(super) access_file: Option<String>,
}

/// `[log]`: the access log.
#[derive(Debug, Clone)]
pub struct Log {
    /// Share of requests in the access log (0: off).
    pub access_rate: f64,
    pub access_format: crate::ops::access_log::Format,
    /// The access log appended to this file; None: stdout.
    pub access_file: Option<PathBuf>,
}

/// `[log]`: the access log's sample rate, format and file.
pub(super) fn check(log: Option<&RawLog>, src: &Src<'_>, p: &mut Problems) -> Log {
    let file = src.file;
    let at = |s: std::ops::Range<usize>| src.at(s);
    use crate::ops::access_log::Format;
    let rate = match log.and_then(|l| l.access.as_ref()) {
        None => 1.0,
        Some(v) => match v.get_ref() {
            toml::Value::String(s) if s == "on" => 1.0,
            toml::Value::String(s) if s == "off" => 0.0,
            toml::Value::Float(f) if (0.0..=1.0).contains(f) => *f,
            toml::Value::Integer(i @ (0 | 1)) => *i as f64,
            _ => {
                p.push(Problem::new(
                    file,
                    at(v.span()),
                    "log.access",
                    "must be \"on\", \"off\" or a sample rate from 0 to 1",
                ));
                1.0
            }
        },
    };
    let format = match log.and_then(|l| l.format.as_ref()) {
        None => Format::Json,
        Some(f) => match f.get_ref().as_str() {
            "json" => Format::Json,
            "logfmt" => Format::Logfmt,
            other => {
                p.push(Problem::new(
                    file,
                    at(f.span()),
                    "log.format",
                    format!("'{other}' is not json or logfmt"),
                ));
                Format::Json
            }
        },
    };
    Log {
        access_rate: rate,
        access_format: format,
        access_file: log
            .and_then(|l| l.access_file.as_ref())
            .map(|f| src.dir.join(f)),
    }
}
