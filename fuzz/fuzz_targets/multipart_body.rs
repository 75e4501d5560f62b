//! The multipart probe and rewrite (audio uploads) on any form bytes: never a panic; when a
//! form probes, the rewritten form probes again with the upstream's model.
#![no_main]

use std::sync::OnceLock;

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use modelgate::route::body::{for_upstream, probe_multipart};

const BOUNDARY: &str = "fuzzboundary";

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
    })
}

fuzz_target!(|data: &[u8]| {
    let body = Bytes::copy_from_slice(data);
    let Ok(probe) = runtime().block_on(probe_multipart(&body, BOUNDARY)) else {
        return;
    };
    let out = for_upstream(&body, &probe, Some("whisper-up"), false);
    let again = runtime()
        .block_on(probe_multipart(&out, BOUNDARY))
        .expect("the rewritten form probes");
    assert_eq!(again.model, "whisper-up");
});
