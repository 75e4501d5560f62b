//! The book (`docs/src`, built by mdBook) and the README hold together: every page is in
//! `SUMMARY.md` and every entry there is a page; every relative link, image and include names a
//! file that exists, every `#anchor` a heading of its page (mdBook's ids), and every source
//! path quoted in backticks a path that exists; README stays one short page; no page cites a
//! tracker's issue numbers.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn pages(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("docs/src") {
        let path = e.expect("entry").path();
        if path.is_dir() {
            pages(&path, out);
        } else if path.extension().is_some_and(|x| x == "md") {
            out.push(path);
        }
    }
}

/// The text outside fenced code blocks and inline code.
fn prose(text: &str) -> String {
    unfenced(text)
        .lines()
        .map(|line| line.split('`').step_by(2).collect::<String>() + "\n")
        .collect()
}

/// The text outside fenced code blocks.
fn unfenced(text: &str) -> String {
    let mut fenced = false;
    let mut out = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            out.push_str(line);
        }
        out.push('\n');
    }
    out
}

/// Repository paths quoted in backticks: `src/…`, `tests/…`, `benches/…`, `scripts/…`,
/// `docs/…`, `conf/…` (a `:line` or a trailing `/` dropped; globs and placeholders skipped).
fn prose_paths(text: &str) -> Vec<String> {
    const ROOTS: [&str; 6] = ["src/", "tests/", "benches/", "scripts/", "docs/", "conf/"];
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|q| ROOTS.iter().any(|r| q.starts_with(r)))
        .filter(|q| !q.contains([' ', '*', '{', '<', '…']))
        // What a build makes (the rendered book) is not in a clean checkout.
        .filter(|q| !q.starts_with("docs/book"))
        .map(|q| q.split(':').next().unwrap_or(q).to_string())
        .collect()
}

/// Targets of `](target)` in `text` (links and images).
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        if let Some(end) = rest.find(')') {
            let target = rest[..end].split_whitespace().next().unwrap_or("");
            out.push(target.to_string());
        }
    }
    out
}

/// mdBook's id of a heading: letters, digits, `_` and `-` kept (lower case), spaces to `-`.
fn heading_id(heading: &str) -> String {
    let text: String = heading
        .chars()
        .filter(|c| !matches!(c, '`' | '*'))
        .collect();
    text.trim()
        .chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '_' || c == '-' {
                Some(c.to_ascii_lowercase())
            } else if c.is_whitespace() {
                Some('-')
            } else {
                None
            }
        })
        .collect()
}

fn anchors(page: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(page).unwrap_or_default();
    unfenced(&text)
        .lines()
        .filter(|line| line.starts_with('#'))
        .map(|line| heading_id(line.trim_start_matches('#')))
        .collect()
}

/// Problems with the links of `page` (a path relative to the repository in each).
fn check_links(page: &Path, problems: &mut Vec<String>) {
    let text = std::fs::read_to_string(page).expect("page");
    let dir = page.parent().expect("folder");
    let name = page
        .strip_prefix(root())
        .unwrap_or(page)
        .display()
        .to_string();
    for target in links(&prose(&text)) {
        if target.is_empty()
            || target.contains("://")
            || target.starts_with("mailto:")
            || target.starts_with('<')
        {
            continue;
        }
        let (file, anchor) = match target.split_once('#') {
            Some((f, a)) => (f, Some(a)),
            None => (target.as_str(), None),
        };
        let path = if file.is_empty() {
            page.to_path_buf()
        } else {
            dir.join(file)
        };
        if !path.exists() {
            problems.push(format!("{name}: {target}: no such file"));
            continue;
        }
        if let Some(anchor) = anchor
            && path.extension().is_some_and(|x| x == "md")
            && !anchors(&path).contains(anchor)
        {
            problems.push(format!("{name}: {target}: no such heading"));
        }
    }
    // `{{#include file}}` (mdBook) names a file beside the page.
    for part in text.split("{{#include ").skip(1) {
        let file = part.split("}}").next().unwrap_or("").trim();
        let file = file.split(':').next().unwrap_or(file);
        if !dir.join(file).exists() {
            problems.push(format!("{name}: include {file}: no such file"));
        }
    }
    // A path in backticks (`src/proxy/`, `benches/load.sh`) names something that exists.
    for part in prose_paths(&unfenced(&text)) {
        if !root().join(&part).exists() {
            problems.push(format!("{name}: `{part}`: no such path"));
        }
    }
    // Tracker issue numbers mean nothing to a reader.
    let lower = text.to_lowercase();
    for (at, _) in lower.match_indices("issue ") {
        let after = lower[at + 6..].trim_start_matches('#');
        if after.starts_with(|c: char| c.is_ascii_digit()) {
            problems.push(format!(
                "{name}: cites a tracker issue: {}",
                &text[at..at + 10]
            ));
        }
    }
}

#[test]
fn every_page_is_in_the_summary_and_every_link_resolves() {
    let src = root().join("docs/src");
    let mut all = Vec::new();
    pages(&src, &mut all);
    let summary = std::fs::read_to_string(src.join("SUMMARY.md")).expect("SUMMARY.md");
    let listed: BTreeSet<PathBuf> = links(&summary).iter().map(|l| src.join(l)).collect();
    let mut problems = Vec::new();
    for page in &all {
        if page.file_name().is_some_and(|n| n != "SUMMARY.md") && !listed.contains(page) {
            problems.push(format!("{} is not in SUMMARY.md", page.display()));
        }
        check_links(page, &mut problems);
    }
    for page in &listed {
        if !page.exists() {
            problems.push(format!(
                "SUMMARY.md lists {}, which is missing",
                page.display()
            ));
        }
    }
    for page in ["README.md", "CHANGELOG.md"] {
        check_links(&root().join(page), &mut problems);
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_readme_is_one_short_page() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let lines = readme.lines().count();
    assert!(lines <= 300, "README.md has {lines} lines");
    // The two commands a newcomer needs come before the first link into the book.
    let first_link = readme.find("](docs/").unwrap_or(readme.len());
    for command in ["scripts/run.sh", "scripts/test.sh"] {
        assert!(
            readme.find(command).is_some_and(|at| at < first_link),
            "{command} is not near the top of README.md"
        );
    }
}

#[test]
fn heading_ids_follow_mdbook() {
    assert_eq!(
        heading_id(" Running several instances"),
        "running-several-instances"
    );
    assert_eq!(heading_id(" `[log]` and TLS: 1/2"), "log-and-tls-12");
}

/// Every key the config file takes (each `pub(super)` field of a `Raw…` struct in
/// `src/config/`) is in the configuration reference.
#[test]
fn every_config_key_is_in_the_reference() {
    let reference =
        std::fs::read_to_string(root().join("docs/src/configuration.md")).expect("reference");
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(root().join("src/config")).expect("src/config") {
        let path = entry.expect("entry").path();
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let mut in_raw = false;
        for line in text.lines() {
            if line.starts_with("pub(super) struct Raw") {
                in_raw = true;
            } else if line.starts_with('}') {
                in_raw = false;
            } else if in_raw
                && let Some(field) = line.trim().strip_prefix("pub(super) ")
                && let Some((name, _)) = field.split_once(':')
                && ![
                    format!("`{name}`"),
                    format!("{name} ="),
                    format!("[{name}"),
                    format!(".{name}."),
                    format!("{{ {name},"),
                ]
                .iter()
                .any(|form| reference.contains(form.as_str()))
            {
                missing.push(format!("{}: {name}", path.display()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "not in docs/src/configuration.md:\n{}",
        missing.join("\n")
    );
}
