//! `[telemetry]` and `[metrics]`: what the gateway reports about itself; their raw forms as
//! serde reads them, and their checks.

use serde::Deserialize;
use toml::Spanned;

use super::*;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTelemetry {
    pub(super) otlp_endpoint: Spanned<String>,
    pub(super) service_name: Option<String>,
    pub(super) sample_rate: Option<Spanned<f64>>,
}

/// `[telemetry]`: the OTLP/HTTP endpoint, the service name, the sample rate.
pub(super) fn check(
    raw: Option<&Spanned<RawTelemetry>>,
    src: &Src<'_>,
    p: &mut Problems,
) -> Option<crate::ops::telemetry::TelemetryConfig> {
    let file = src.file;
    let at = |s: std::ops::Range<usize>| src.at(s);
    raw.and_then(|t| {
        let r = t.get_ref();
        let endpoint = r.otlp_endpoint.get_ref();
        let endpoint_ok = (endpoint.starts_with("http://") || endpoint.starts_with("https://"))
            && endpoint.parse::<http::Uri>().is_ok();
        if !endpoint_ok {
            p.push(Problem::new(
                file,
                at(r.otlp_endpoint.span()),
                "telemetry.otlp_endpoint",
                "must be an http:// or https:// URL",
            ));
        }
        let sample_rate = r.sample_rate.as_ref().map_or(1.0, |s| *s.get_ref());
        if !(0.0..=1.0).contains(&sample_rate) {
            p.push(Problem::new(
                file,
                r.sample_rate.as_ref().and_then(|s| at(s.span())),
                "telemetry.sample_rate",
                "must be between 0 and 1",
            ));
            return None;
        }
        endpoint_ok.then(|| crate::ops::telemetry::TelemetryConfig {
            otlp_endpoint: endpoint.clone(),
            service_name: r.service_name.clone().unwrap_or_else(|| "modelgate".into()),
            sample_rate,
        })
    })
}

/// `[metrics]`.
#[derive(Debug, Clone, Default)]
pub struct MetricsConfig {
    /// Per-key series on `/metrics`.
    pub key_label: bool,
}

pub(super) fn metrics(raw: Option<&super::raw::RawMetrics>) -> MetricsConfig {
    MetricsConfig {
        key_label: raw.and_then(|m| m.key_label).unwrap_or(false),
    }
}
