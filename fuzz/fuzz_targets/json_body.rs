//! The JSON body probe and the model splice on any bytes: never a panic; when a body probes,
//! the body sent upstream probes again with the upstream's model and the same `stream`, and,
//! when the client's body was valid JSON, is valid JSON asking for usage. (The probe reads only
//! the top level: bytes it skips, such as invalid UTF-8 inside a nested string, go upstream as
//! they came, and the upstream judges them.)
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use modelgate::route::body::{for_upstream, probe_json};

fuzz_target!(|data: &[u8]| {
    let Ok(probe) = probe_json(data) else { return };
    let body = Bytes::copy_from_slice(data);
    for ask_usage in [false, true] {
        let out = for_upstream(&body, &probe, Some("up/\"model\"\u{e9}"), ask_usage);
        let again = probe_json(&out).expect("the spliced body probes");
        assert_eq!(again.model, "up/\"model\"\u{e9}");
        assert_eq!(again.stream, probe.stream);
        if ask_usage && serde_json::from_slice::<serde_json::Value>(data).is_ok() {
            let v: serde_json::Value = serde_json::from_slice(&out).expect("JSON");
            assert_eq!(v["stream_options"]["include_usage"], true);
        }
    }
});
