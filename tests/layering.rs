//! The layering the folder layout promises, checked on the source (the order of all top-level
//! modules: `tests/architecture.rs`): `src/http1/` (the HTTP/1 work the gateway does itself)
//! knows no keys, routes, records or proxy stages; it stands on `config/`, `ops/` and the error
//! enum only, and the stages above use it, never the reverse. Within `src/proxy/`,
//! forwarding does not know how a reply is relayed in a task of its own (`detach`) or on a
//! stream's own connection (`conn`).

use std::path::Path;

/// Every `.rs` file under `dir`, with its text.
fn rs_files(dir: &Path) -> Vec<(std::path::PathBuf, String)> {
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).expect("readable source folder") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).expect("readable source");
                files.push((path, text));
            }
        }
    }
    files
}

/// Every `crate::NAME` a file under `dir` refers to, with the file.
fn crate_refs(dir: &Path) -> Vec<(String, String)> {
    let mut refs = Vec::new();
    for (path, text) in rs_files(dir) {
        for (at, _) in text.match_indices("crate::") {
            let name: String = text[at + 7..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            refs.push((path.display().to_string(), name));
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
            ["http1", "config", "ops", "error"].contains(&name.as_str()),
            "{file} uses crate::{name}: http1 stands on config, ops and the error enum only"
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

/// The sibling modules a file of `dir` names (`super::NAME`, `crate::STAGE::NAME`), by file
/// stem: the stage's own folder (`mod.rs`, the stage's entry, left out).
fn sibling_graph(dir: &Path, stage: &str) -> Vec<(String, Vec<String>)> {
    let mut files: Vec<(String, String)> = Vec::new();
    for entry in std::fs::read_dir(dir).expect("readable source folder") {
        let path = entry.expect("entry").path();
        let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        if path.extension().is_none_or(|e| e != "rs") || stem == "mod" {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("readable source");
        files.push((stem.to_string(), text));
    }
    let names: Vec<String> = files.iter().map(|(n, _)| n.clone()).collect();
    files
        .iter()
        .map(|(name, text)| {
            let code: String = text
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n");
            let uses = names
                .iter()
                .filter(|other| *other != name)
                .filter(|other| {
                    [
                        format!("super::{other}"),
                        format!("crate::{stage}::{other}"),
                    ]
                    .iter()
                    .any(|p| {
                        code.match_indices(p.as_str()).any(|(at, _)| {
                            !code[at + p.len()..]
                                .starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
                        })
                    })
                })
                .cloned()
                .collect();
            (name.clone(), uses)
        })
        .collect()
}

/// A circle among the graph's nodes, if there is one.
fn circle(graph: &[(String, Vec<String>)]) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &[(String, Vec<String>)],
        path: &mut Vec<String>,
        done: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut found = path[at..].to_vec();
            found.push(node.to_string());
            return Some(found);
        }
        if done.iter().any(|n| n == node) {
            return None;
        }
        path.push(node.to_string());
        let next = graph
            .iter()
            .find(|(n, _)| n == node)
            .map(|(_, u)| u.clone());
        for n in next.unwrap_or_default() {
            if let Some(c) = visit(&n, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.push(node.to_string());
        None
    }
    let mut done = Vec::new();
    for (n, _) in graph {
        if let Some(c) = visit(n, graph, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

#[test]
fn the_circle_finder_finds_a_circle() {
    let g = |edges: &[(&str, &[&str])]| -> Vec<(String, Vec<String>)> {
        edges
            .iter()
            .map(|(n, u)| (n.to_string(), u.iter().map(|s| s.to_string()).collect()))
            .collect()
    };
    assert_eq!(
        circle(&g(&[("a", &["b"]), ("b", &["c"]), ("c", &[])])),
        None
    );
    let found = circle(&g(&[("a", &["b"]), ("b", &["c"]), ("c", &["a"])]));
    assert_eq!(found.map(|c| c.len()), Some(4));
}

/// No import circle among the proxy's files: admission, forwarding, the relay, the detached
/// tasks, the replies and the outcome each stand on the ones below them.
#[test]
fn the_proxys_files_import_no_circle() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/proxy");
    let graph = sibling_graph(&dir, "proxy");
    assert!(graph.len() >= 8, "{graph:?}");
    assert!(
        graph
            .iter()
            .any(|(n, u)| n == "forward" && u.iter().any(|x| x == "relay")),
        "the graph is read: {graph:?}"
    );
    if let Some(c) = circle(&graph) {
        panic!("an import circle in src/proxy: {}", c.join(" → "));
    }
}

/// A request's final status is settled in one place (`proxy::finish`), from what the writer
/// recorded as sent and the failure; nothing else names it.
#[test]
fn one_place_settles_a_requests_status() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut sites = Vec::new();
    for (path, text) in rs_files(&src) {
        if path.ends_with("proxy/outcome.rs") {
            continue;
        }
        for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
            if line.contains("outcome::settle(") || line.contains("ctx.outcome =") {
                sites.push(format!("{}: {}", path.display(), line.trim()));
            }
        }
    }
    assert_eq!(sites.len(), 1, "{sites:#?}");
    assert!(sites[0].contains("proxy/mod.rs"), "{sites:?}");
}

/// The web stage and the writer stand below the proxy, which hands the web stage its paths:
/// neither names it.
#[test]
fn the_web_stage_and_the_writer_know_no_proxy() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut refs = crate_refs(&src.join("web"));
    let writer = std::fs::read_to_string(src.join("http1/respond.rs")).expect("readable");
    if writer.contains("crate::proxy") {
        refs.push(("src/http1/respond.rs".into(), "proxy".into()));
    }
    for (file, name) in refs {
        assert_ne!(name, "proxy", "{file} uses crate::proxy");
    }
}
