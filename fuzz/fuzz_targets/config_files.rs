//! The config and keys file parsers on any text: never a panic, only problems named.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use modelgate::config::Config;
use modelgate::config::keys::KeyTable;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = KeyTable::parse("keys.toml", text);
    let _ = Config::parse_lenient(Path::new("/nonexistent/modelgate.toml"), text);
});
