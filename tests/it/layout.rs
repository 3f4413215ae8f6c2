//! The house has no cycles: each top-level module of the library refers (`crate::…`) only to
//! modules on a lower floor, as `lib.rs`'s layout map says. A new reference upwards, or one
//! between two modules of the same floor, fails here with the file that makes it.

use std::path::Path;

/// Floors, lowest first. A module may use the modules of the floors below its own.
const FLOORS: &[&[&str]] = &[
    &[
        "digest",
        "backoff",
        "cause",
        "metrics",
        "admin_cli",
        "conn",
        "ui",
        "fuzz",
    ],
    &["model"],
    &["config"],
    &["store", "sitemap"],
    &["context"],
    &["source", "hub", "package"],
    &["notify", "ingest", "import", "workers", "destination"],
    &["error", "demo", "dump", "collect", "oaipmh"],
    &["inbox"],
    &["http"],
    &["app"],
];

/// The destination is a wing of its own: it shares the model, the sitemap reader and the
/// digests, never the server's store, hub, source or notifier.
const DESTINATION_NEVER_USES: &[&str] = &[
    "store", "hub", "source", "notify", "ingest", "import", "workers", "http", "app",
];

fn floor_of(module: &str) -> Option<usize> {
    FLOORS.iter().position(|f| f.contains(&module))
}

fn rust_files(p: &Path, out: &mut Vec<std::path::PathBuf>) {
    if !p.exists() {
        return;
    }
    if p.is_dir() {
        for e in std::fs::read_dir(p).unwrap() {
            rust_files(&e.unwrap().path(), out);
        }
    } else if p.extension().is_some_and(|e| e == "rs") {
        out.push(p.to_path_buf());
    }
}

/// The top-level modules a file names after `crate::`, grouped imports too
/// (`use crate::{model::X, sitemap}` names `model` and `sitemap`).
fn crate_uses(text: &str) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
            .collect()
    };
    let mut out = Vec::new();
    for (i, _) in text.match_indices("crate::") {
        let rest = &text[i + 7..];
        if let Some(group) = rest.strip_prefix('{') {
            // The top-level items of the group: split at commas outside nested braces.
            let mut depth = 0;
            let mut start = 0;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        out.push(ident(&group[start..j]));
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.push(ident(&group[start..j]));
                        start = j + 1;
                    }
                    _ => {}
                }
            }
        } else {
            out.push(ident(rest));
        }
    }
    out.retain(|u| !u.is_empty());
    out
}

#[test]
fn grouped_imports_are_read() {
    assert_eq!(
        crate_uses("use crate::{model::{A, B}, sitemap,\n  hub::X};\nlet x = crate::store::y;"),
        ["model", "sitemap", "hub", "store"]
    );
}

#[test]
fn modules_only_use_lower_floors() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let mut problems = Vec::new();
    for line in lib.lines() {
        let Some(module) = line
            .strip_prefix("pub mod ")
            .and_then(|l| l.strip_suffix(';'))
        else {
            continue;
        };
        let Some(own) = floor_of(module) else {
            problems.push(format!(
                "module {module} is on no floor of tests/it/layout.rs: place it"
            ));
            continue;
        };
        let mut files = Vec::new();
        rust_files(&src.join(format!("{module}.rs")), &mut files);
        rust_files(&src.join(module), &mut files);
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            for used in crate_uses(&text) {
                if used == module {
                    continue;
                }
                if module == "destination" && DESTINATION_NEVER_USES.contains(&used.as_str()) {
                    problems.push(format!(
                        "{} uses crate::{used}: the destination never uses the server's parts",
                        f.display()
                    ));
                }
                match floor_of(&used) {
                    Some(fl) if fl < own => {}
                    _ => problems.push(format!(
                        "{} uses crate::{used}, which is not below {module}",
                        f.display()
                    )),
                }
            }
        }
    }
    problems.dedup();
    assert!(
        problems.is_empty(),
        "the module layers have a cycle or an upward reference:\n{}",
        problems.join("\n")
    );
}

/// The code lines (comments left out) of every file under `src`, with the file's path
/// relative to `src`.
fn code_lines() -> Vec<(String, usize, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut out = Vec::new();
    for f in files {
        let rel = f.strip_prefix(&src).unwrap().to_string_lossy().into_owned();
        for (n, line) in std::fs::read_to_string(&f).unwrap().lines().enumerate() {
            if !line.trim_start().starts_with("//") {
                out.push((rel.clone(), n + 1, line.to_string()));
            }
        }
    }
    out
}

/// The web framework stays at the edges: the HTTP handlers, the application that serves them,
/// the error-to-status table, the connection layer, the destination's callback server and
/// the consoles' pages.
/// The domain (hub, source, store, notifier, destination's logic) is callable without it.
#[test]
fn axum_is_named_only_at_the_edges() {
    let allowed = |f: &str| {
        f.starts_with("http/")
            || f.starts_with("ui/")
            || f.starts_with("destination/console/")
            || ["app.rs", "error.rs", "conn.rs", "destination/follow.rs"].contains(&f)
    };
    let found: Vec<String> = code_lines()
        .into_iter()
        .filter(|(f, _, l)| l.contains("axum") && !allowed(f))
        .map(|(f, n, l)| format!("src/{f}:{n}: {}", l.trim()))
        .collect();
    assert!(
        found.is_empty(),
        "axum named outside http, app, error, conn, ui, the callback server and the harvester's console:\n{}",
        found.join("\n")
    );
}

/// The store's callers see the contract (`SetStore`, `HubStore`, the neutral types), never a
/// backend's own types: a backend can change, or a third be added, without touching them.
#[test]
fn no_backend_type_is_named_outside_the_store() {
    let found: Vec<String> = code_lines()
        .into_iter()
        .filter(|(f, _, l)| {
            !f.starts_with("store/")
                && ["elastic::", "embedded::", "EmbeddedStore", "ElasticStore"]
                    .iter()
                    .any(|t| l.contains(t))
        })
        .map(|(f, n, l)| format!("src/{f}:{n}: {}", l.trim()))
        .collect();
    assert!(
        found.is_empty(),
        "a backend's type named outside src/store:\n{}",
        found.join("\n")
    );
}

fn repo_file(rel: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(rel))
        .unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The configuration reference cannot drift: every key of the compiled-in defaults
/// (`config.default.toml`) is in `docs/configuration.md`'s table, by its whole name or, on a
/// row grouping a table's keys (`hub.lease_default_secs`, `lease_min_secs`), by its own; and
/// the table names no key the defaults lack.
#[test]
fn the_configuration_reference_names_every_key_and_no_other() {
    fn flat(prefix: &str, v: &toml::Value, out: &mut Vec<String>) {
        for (k, x) in v.as_table().unwrap() {
            match x {
                toml::Value::Table(_) => flat(&format!("{prefix}{k}."), x, out),
                _ => out.push(format!("{prefix}{k}")),
            }
        }
    }
    let defaults: toml::Value = repo_file("config.default.toml").parse().unwrap();
    let mut keys = Vec::new();
    flat("", &defaults, &mut keys);
    let doc = repo_file("docs/configuration.md");
    let rows: Vec<&str> = doc.lines().filter(|l| l.starts_with("| `")).collect();
    let missing: Vec<&String> = keys
        .iter()
        .filter(|k| {
            let (section, name) = k.rsplit_once('.').unwrap();
            !doc.contains(&format!("`{k}`"))
                && !rows.iter().any(|r| {
                    r.starts_with(&format!("| `{section}.")) && r.contains(&format!("`{name}`"))
                })
        })
        .collect();
    assert!(
        missing.is_empty(),
        "keys of config.default.toml missing from docs/configuration.md: {missing:?}"
    );
    let mut unknown = Vec::new();
    for r in &rows {
        let first = r.split('|').nth(1).unwrap();
        for name in first.split('`').skip(1).step_by(2) {
            let dotted = name.contains('.') && !name.contains(['[', '*', ' ']);
            if dotted && !keys.iter().any(|k| k == name) {
                unknown.push(name.to_string());
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "docs/configuration.md names keys config.default.toml does not have: {unknown:?}"
    );
}

/// `docs/architecture.md`, the one map of the code, lists the floors this test checks.
#[test]
fn the_architecture_page_has_the_floors_this_test_checks() {
    let doc = repo_file("docs/architecture.md");
    let floors: Vec<Vec<String>> = doc
        .split("## Floors")
        .nth(1)
        .expect("a Floors section")
        .lines()
        .filter_map(|l| {
            let (n, rest) = l.split_once(". ")?;
            n.parse::<usize>().ok()?;
            Some(
                rest.split('`')
                    .skip(1)
                    .step_by(2)
                    .map(str::to_string)
                    .collect(),
            )
        })
        .collect();
    let want: Vec<Vec<String>> = FLOORS
        .iter()
        .map(|f| f.iter().map(|m| m.to_string()).collect())
        .collect();
    assert_eq!(floors, want, "docs/architecture.md's floors");
}

/// GitHub's anchor of a heading: lower case, punctuation but `-` and `_` dropped, spaces `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim_start_matches('#')
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every link of the README and the guides leads somewhere: each relative link to a file that
/// exists, each `#anchor` to a heading of its page; and the README stays a guide (at most 400
/// lines: the rest is in `docs/`).
#[test]
fn the_readme_and_guides_link_to_what_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut pages = vec![root.join("README.md")];
    for e in std::fs::read_dir(root.join("docs")).unwrap() {
        pages.push(e.unwrap().path());
    }
    let headings = |p: &Path| -> Vec<String> {
        std::fs::read_to_string(p)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with('#'))
            .map(anchor)
            .collect()
    };
    let mut broken = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        let dir = page.parent().unwrap();
        for part in text.split("](").skip(1) {
            let target = part.split([')', ' ']).next().unwrap();
            if target.contains("://") || target.starts_with("mailto:") || target.starts_with('/') {
                continue;
            }
            let (file, frag) = target.split_once('#').unwrap_or((target, ""));
            let file = if file.is_empty() {
                page.clone()
            } else {
                dir.join(file)
            };
            if !file.exists() {
                broken.push(format!("{}: {target} (no such file)", page.display()));
            } else if !frag.is_empty() && !headings(&file).iter().any(|h| h == frag) {
                broken.push(format!("{}: {target} (no such heading)", page.display()));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    let lines = std::fs::read_to_string(root.join("README.md"))
        .unwrap()
        .lines()
        .count();
    assert!(
        lines <= 400,
        "the README has {lines} lines: guides go to docs/"
    );
}

/// The non-test functions of a file and their lengths in lines: a `fn` from its signature to
/// the closing brace at its own indentation; a file's `#[cfg(test)] mod tests` is left out.
fn function_lengths(text: &str) -> Vec<(String, usize)> {
    let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or(text);
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let t = l.trim_start();
        let indent = l.len() - t.len();
        let sig = t
            .trim_start_matches("pub ")
            .trim_start_matches("pub(crate) ")
            .trim_start_matches("pub(super) ")
            .trim_start_matches("async ");
        let Some(name) = sig.strip_prefix("fn ") else {
            continue;
        };
        let name: String = name
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let close = format!("{}}}", " ".repeat(indent));
        if let Some(end) = lines[i..].iter().position(|l| l.starts_with(&close)) {
            out.push((name, end + 1));
        }
    }
    out
}

#[test]
fn function_lengths_are_read() {
    let text = "fn a() {\n    x();\n}\n\nimpl X {\n    pub async fn b(\n        y: u8,\n    ) {\n        if y {\n        }\n    }\n}\n#[cfg(test)]\nmod tests {\n    fn long() {\n    }\n}\n";
    assert_eq!(
        function_lengths(text),
        [("a".to_string(), 3), ("b".to_string(), 6)]
    );
}

/// The house's counts (issue 59): no file of `src/source/` over 600 lines, no non-test
/// function over 150 lines in the protocol code (`oaipmh/`, `collect/`, `hub/`,
/// `admin_cli.rs`), and the parts the server hands a context never reach for the page
/// generator (`crate::source`).
#[test]
fn the_house_keeps_its_counts() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut problems = Vec::new();
    let mut files = Vec::new();
    rust_files(&src.join("source"), &mut files);
    for f in &files {
        let n = std::fs::read_to_string(f).unwrap().lines().count();
        if n > 600 {
            problems.push(format!("{}: {n} lines (at most 600)", f.display()));
        }
    }
    let mut files = Vec::new();
    for d in ["oaipmh", "collect", "hub", "admin_cli.rs"] {
        rust_files(&src.join(d), &mut files);
    }
    for f in &files {
        for (name, n) in function_lengths(&std::fs::read_to_string(f).unwrap()) {
            if n > 150 {
                problems.push(format!(
                    "{}: fn {name} is {n} lines (at most 150)",
                    f.display()
                ));
            }
        }
    }
    let mut files = Vec::new();
    for d in [
        "collect",
        "oaipmh",
        "notify",
        "dump",
        "ingest.rs",
        "workers",
    ] {
        rust_files(&src.join(d), &mut files);
    }
    for f in &files {
        if crate_uses(&std::fs::read_to_string(f).unwrap()).contains(&"source".to_string()) {
            problems.push(format!(
                "{} uses crate::source: it is handed the context",
                f.display()
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
