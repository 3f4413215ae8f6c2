//! What the benchmarks share: their command-line numbers and the peers' Python tools.
#![allow(dead_code)] // each benchmark uses part of it

use std::path::{Path, PathBuf};

/// The number after `name` on the command line, or `default`.
pub fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map_or(default, |v| v.parse().expect("a number"))
}

/// A console script of PyPI `resync` (`resync-sync`, `resync-build`): the tests' Python
/// environment under target/ when present, else the one on PATH.
pub fn py_tool(name: &str) -> PathBuf {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target/tmp/pyenv/bin")
        .join(name);
    if venv.exists() {
        venv
    } else {
        name.into()
    }
}

/// One ingest line (NDJSON) for the file `rel` holding `body`.
pub fn ingest_line(rel: &str, body: &str, change: &str) -> String {
    use md5::{Digest, Md5};
    format!(
        r#"{{"change":"{change}","location":{{"type":"rel_path","value":"{rel}"}},"length":{},"md5":"{}","mime":"text/plain"}}"#,
        body.len(),
        resourcesync_hub::digest::hex_digest(Md5::digest(body.as_bytes()))
    )
}

/// The `p` quantile (0..1) of sorted figures (NaN for none).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}
