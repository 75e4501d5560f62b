//! The usage API's query parameters (pages and CSV, a key's and the console's) on any query
//! string: never a panic, a query or a 400.
#![no_main]

use libfuzzer_sys::fuzz_target;
use modelgate::web::usage_api::parse_query;

fuzz_target!(|data: &[u8]| {
    let Ok(query) = std::str::from_utf8(data) else {
        return;
    };
    let now_ms = 1_795_000_000_000;
    for csv in [false, true] {
        let _ = parse_query(Some(query), Some("key"), now_ms, csv);
        let _ = parse_query(Some(query), None, now_ms, csv);
    }
});
