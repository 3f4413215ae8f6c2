//! The Python reference client `resync` against the live server: baseline, 50 changes through
//! ingest, incremental from the open Change List, then an audit that says IN SYNC.

use std::path::Path;
use std::process::Command;

use crate::support::*;

/// Runs resync-sync in `cwd` (where it keeps its `.resync-client-status.cfg`).
fn resync(cwd: &Path, args: &[&str]) -> String {
    let out = Command::new(PyEnv::get().bin("resync-sync"))
        .current_dir(cwd)
        .args(args)
        .output()
        .expect("resync-sync runs");
    let text = output_text(&out);
    assert!(
        !text.contains("Traceback") && !text.contains("FatalError"),
        "resync-sync {args:?} failed:\n{text}"
    );
    text
}

fn write(root: &Path, rel: &str, body: &str) -> String {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, body).unwrap();
    let lastmod = "2024-02-03T04:05:06Z";
    let t = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_706_933_106);
    std::fs::File::options()
        .write(true)
        .open(&p)
        .unwrap()
        .set_modified(t)
        .unwrap();
    format!(
        r#"{{"change":"CHANGE","location":{{"type":"rel_path","value":"{rel}"}},"length":{},"md5":"{}","mime":"text/plain","lastmod":"{lastmod}"}}"#,
        body.len(),
        md5_hex(body.as_bytes())
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resync_client_baseline_incremental_audit() {
    let (mut c, dir) = test_config();
    let root = dir.path().join("src");
    std::fs::create_dir_all(&root).unwrap();
    add_file_set(&mut c, "s", &root, None);
    let app = TestApp::start_with(c).await;
    let dest = dir.path().join("dest");
    std::fs::create_dir_all(&dest).unwrap();

    let lines: Vec<String> = (0..30)
        .map(|i| {
            write(&root, &format!("a/r{i}.txt"), &format!("first {i}\n"))
                .replace("CHANGE", "created")
        })
        .collect();
    app.ingest_ok("s", &lines.join("\n")).await;

    let cap = format!("{}/sets/s/capabilitylist.xml", app.config.base_url());
    let mapping = format!("{}/files/s/={}", app.config.base_url(), dest.display());
    let run = |mode: &str, extra: &[&str]| {
        let mut args = vec![mode, "--capabilitylist", &cap, "--delete", "--verbose"];
        args.extend_from_slice(extra);
        args.push(&mapping);
        let args: Vec<String> = args.into_iter().map(String::from).collect();
        let cwd = dir.path().to_path_buf();
        async move {
            tokio::task::spawn_blocking(move || {
                resync(&cwd, &args.iter().map(String::as_str).collect::<Vec<_>>())
            })
            .await
            .unwrap()
        }
    };
    let out = run("--baseline", &[]).await;
    assert_eq!(
        std::fs::read_dir(dest.join("a")).unwrap().count(),
        30,
        "{out}"
    );
    // The snapshot's `at` is where a destination's incremental sync starts. (resync 2.0.1
    // records the newest `lastmod` instead, re-reads the baseline's own creates, and then its
    // prune_dupes drops every create->delete pair: so it is told `--from` explicitly.)
    let (_, rl) = app.get_doc("/sets/s/resourcelist.xml").await;
    let at = rl.md["at"].clone();

    // 50 changes: 20 updates, 20 creates, 10 deletes.
    let mut lines = Vec::new();
    for i in 0..20 {
        lines.push(
            write(
                &root,
                &format!("a/r{i}.txt"),
                &format!("second version {i}\n"),
            )
            .replace("CHANGE", "updated"),
        );
        lines.push(
            write(&root, &format!("b/n{i}.txt"), &format!("new {i}\n"))
                .replace("CHANGE", "created"),
        );
    }
    for i in 20..30 {
        std::fs::remove_file(root.join(format!("a/r{i}.txt"))).unwrap();
        lines.push(change_line("deleted", &format!("a/r{i}.txt"), "", 0));
    }
    let report = app.ingest_ok("s", &lines.join("\n")).await;
    assert_eq!(report["applied"], 50);

    let (_, cl) = app.get_doc("/sets/s/changelist.xml").await;
    assert!(!cl.is_index, "one open change list");
    let open = format!("{}/sets/s/changelist.xml", app.config.base_url());
    let out = run("--incremental", &["--changelist-uri", &open, "--from", &at]).await;
    assert_eq!(
        std::fs::read_to_string(dest.join("a/r3.txt")).unwrap(),
        "second version 3\n",
        "{out}"
    );
    assert!(dest.join("b/n19.txt").exists(), "{out}");
    assert!(!dest.join("a/r25.txt").exists(), "{out}");

    let out = run("--audit", &[]).await;
    assert!(
        out.contains("IN SYNC"),
        "audit did not report IN SYNC:\n{out}"
    );
    app.stop().await;
}

/// The source guide's `resync` block (docs/source.md), run as written (with the server's address) next to
/// `serve --demo`: baseline, incremental from the open Change List after a change, audit IN
/// SYNC, every demo file in the mirror folder it names.
#[test]
fn the_readme_resync_example_runs_as_written() {
    let script = crate::support::doc_sh_block(
        "docs/source.md",
        "**Pulling with the Python `resync` client**",
    );
    let script = script.as_str();
    let tmp = tempfile::tempdir().unwrap();
    let server = ChildServer::demo(tmp.path());
    let base = format!("http://{}", server.addr);
    let bin = PyEnv::get().bin("resync-sync");
    let path = format!(
        "{}:{}",
        bin.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("sh")
        .current_dir(tmp.path())
        .env("PATH", path)
        .args(["-e", "-c", &script.replace("http://127.0.0.1:8080", &base)])
        .output()
        .unwrap();
    let text = output_text(&out);
    assert!(out.status.success(), "{text}");
    assert!(
        !text.contains("Traceback") && !text.contains("FatalError"),
        "{text}"
    );
    assert!(text.contains("IN SYNC"), "{text}");
    let mirrored = walkdir::WalkDir::new(tmp.path().join("mirror/demo"))
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file())
        .count();
    assert_eq!(mirrored, 24, "the demo's 24 files:\n{text}");
}
