//! The house has no cycles: each top-level module of the library refers (`crate::…`) only to
//! modules on a lower floor, as `lib.rs`'s layout map says. A new reference upwards, or one
//! between two modules of the same floor, fails here with the file that makes it.

use std::path::Path;

/// Floors, lowest first. A module may use the modules of the floors below its own.
const FLOORS: &[&[&str]] = &[
    &[
        "digest",
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
    &["source", "hub", "package"],
    &["notify", "ingest", "import", "workers", "destination"],
    &["error", "demo", "dump", "collect", "oaipmh"],
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
