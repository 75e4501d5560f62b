//! The layering of `src/`, read off its imports: a top-level module may use only the modules
//! below it in `LAYERS` (the request's path from the entry down to what every stage stands on,
//! as in the style guide's folder list), so there is no circle between top-level modules. An
//! import that runs up the table fails this test unless `KNOWN` names it; `KNOWN` lists the
//! upward imports still to be taken out, and an entry no longer needed fails too, so the list
//! only shrinks.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Top-level modules, top first. Each may use those below it. The style guide's folder list,
/// except that `http1` (the wire: the connection loop, the reply writer every stage answers
/// through, the upstream exchange) stands below the stages that write through it, and
/// `error` (what every stage returns; it uses nothing) at the bottom.
const LAYERS: &[&str] = &[
    "cli",
    "server",
    "state",
    "proxy",
    "web",
    "auth",
    "limit",
    "route",
    "translate",
    "upstream",
    "http1",
    "meter",
    "store",
    "config",
    "ops",
    "mock_upstream",
    "error",
];

/// Upward imports still allowed: (from, to). None; an entry here fails the test once it is
/// no longer needed, so the list can only shrink.
const KNOWN: &[(&str, &str)] = &[];

fn rank(module: &str) -> Option<usize> {
    LAYERS.iter().position(|m| *m == module)
}

/// Every `crate::<module>` a file of `module` names, outside comments.
fn uses(dir: &Path, out: &mut BTreeMap<(String, String), String>) {
    for entry in std::fs::read_dir(dir).expect("src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            uses(&path, out);
            continue;
        }
        if path.extension().is_none_or(|x| x != "rs") {
            continue;
        }
        let rel = path
            .strip_prefix(Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
            .expect("under src");
        let top = rel
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .map(|c| c.trim_end_matches(".rs").to_string())
            .expect("a name");
        if top == "main" || top == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read");
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for (at, _) in code.match_indices("crate::") {
                let name: String = code[at + 7..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() && name != top {
                    out.entry((top.clone(), name))
                        .or_insert_with(|| format!("{}:{}", rel.display(), n + 1));
                }
            }
        }
    }
}

#[test]
fn every_module_uses_only_modules_below_it() {
    let mut edges = BTreeMap::new();
    uses(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut edges,
    );
    let known: BTreeSet<(String, String)> = KNOWN
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    let mut problems = Vec::new();
    let mut needed = BTreeSet::new();
    for ((from, to), at) in &edges {
        let (Some(f), Some(t)) = (rank(from), rank(to)) else {
            problems.push(format!("{at}: {from} or {to} is not in LAYERS"));
            continue;
        };
        if t < f {
            if known.contains(&(from.clone(), to.clone())) {
                needed.insert((from.clone(), to.clone()));
            } else {
                problems.push(format!("{at}: {from} uses {to}, which stands above it"));
            }
        }
    }
    for k in known.difference(&needed) {
        problems.push(format!(
            "KNOWN lists {k:?}, which is no longer used: take it out"
        ));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Folders a request passes through on a runtime thread: no blocking file I/O and no sleeping
/// thread there (the store's writer, the journal's segments and config loading run elsewhere).
const REQUEST_PATH: &[&str] = &[
    "proxy", "web", "auth", "limit", "route", "upstream", "http1", "meter",
];

/// Files of those folders that may block, and why.
const MAY_BLOCK: &[(&str, &str)] = &[(
    "route/reload.rs",
    "the reload service: reads the config and keys files on its own runtime, never a request's",
)];

/// The code of `text` before its `#[cfg(test)]` module, without comments.
fn code_before_tests(text: &str) -> Vec<(usize, &str)> {
    text.lines()
        .enumerate()
        .take_while(|(_, l)| !l.trim_start().starts_with("#[cfg(test)]"))
        .map(|(n, l)| (n + 1, l.split("//").next().unwrap_or("")))
        .collect()
}

fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("folder") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            walk(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn nothing_on_the_request_path_blocks_its_thread() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut problems = Vec::new();
    for folder in REQUEST_PATH {
        let mut files = Vec::new();
        walk(&src.join(folder), &mut files);
        for path in files {
            let rel = path
                .strip_prefix(&src)
                .expect("under src")
                .display()
                .to_string();
            if rel.ends_with("_tests.rs") || MAY_BLOCK.iter().any(|(f, _)| *f == rel) {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("read");
            for (n, code) in code_before_tests(&text) {
                for blocking in ["std::fs::", "File::open", "OpenOptions", "thread::sleep"] {
                    if code.contains(blocking) {
                        problems.push(format!("src/{rel}:{n}: {blocking}"));
                    }
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
