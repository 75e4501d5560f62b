//! The layering the folder layout promises, checked on the source: `src/http1/` (the HTTP/1
//! work the gateway does itself) knows no keys, routes, records or proxy stages; it sits just
//! above `config/`, and the stages above use it, never the reverse. Within `src/proxy/`,
//! forwarding does not know how a reply is relayed in a task of its own (`detach`) or on a
//! stream's own connection (`conn`).

use std::path::Path;

/// Every `crate::NAME` a file under `dir` refers to, with the file.
fn crate_refs(dir: &Path) -> Vec<(String, String)> {
    let mut refs = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).expect("readable source folder") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("readable source");
            for (at, _) in text.match_indices("crate::") {
                let name: String = text[at + 7..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                refs.push((path.display().to_string(), name));
            }
        }
    }
    refs
}

#[test]
fn http1_uses_nothing_of_the_gateway_but_config() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    assert!(
        src.join("http1/mod.rs").exists(),
        "src/http1 is where it is said to be"
    );
    for (file, name) in crate_refs(&src.join("http1")) {
        assert!(
            name == "http1" || name == "config",
            "{file} uses crate::{name}: http1 sits just above config"
        );
    }
}

#[test]
fn forwarding_knows_neither_detached_tasks_nor_the_streams_own_connection() {
    let forward = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/proxy/forward.rs");
    let text = std::fs::read_to_string(forward).expect("readable");
    for word in ["detach", "conn::", "super::conn"] {
        let used = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .any(|l| l.contains(word));
        assert!(
            !used,
            "forward.rs uses {word}: it returns the reply to its caller"
        );
    }
}
