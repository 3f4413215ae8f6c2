//! The Ingestion 3 output: baseline snapshot, changes by push, `harvest snapshot`, `harvest
//! recreate`, read back with fastavro (the reference reader).

use std::collections::BTreeMap;
use std::path::Path;

use resourcesync_hub::destination::{self, config::OutputKind};

use crate::harvest::{
    applied, file_line, free_port, harvest_config, set_done, wait_state, ChildHarvester,
    TestHarvester,
};
use crate::hub::hub_config;
use crate::support::*;

/// An XML record's ingest line (the file server serves `.xml` as `text/xml`).
fn xml_line(root: &Path, change: &str, i: usize, version: u32) -> String {
    file_line(
        root,
        change,
        &format!("r/{i:04}.xml"),
        &format!("<record n=\"{i}\" v=\"{version}\"/>"),
    )
}

/// What fastavro reads from an activity folder: (records by id, schemas, codecs).
fn read_activity(folder: &Path) -> (BTreeMap<String, serde_json::Value>, serde_json::Value) {
    let v = py_tool_json("read_avro.py", &[folder.as_os_str()]);
    let records = v["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["id"].as_str().unwrap().to_string(), r.clone()))
        .collect();
    (records, v)
}

/// The documents the source holds: URI -> content (only the `.xml` ones are archived).
fn source_state(root: &Path, base: &str) -> BTreeMap<String, String> {
    walkdir::WalkDir::new(root)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "xml"))
        .map(|e| {
            let rel = e
                .path()
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            (
                format!("{base}/files/papers/{rel}"),
                std::fs::read_to_string(e.path()).unwrap(),
            )
        })
        .collect()
}

fn assert_records_equal(
    got: &BTreeMap<String, serde_json::Value>,
    want: &BTreeMap<String, String>,
    what: &str,
) {
    let got_ids: Vec<&String> = got.keys().collect();
    let want_ids: Vec<&String> = want.keys().collect();
    assert_eq!(got_ids, want_ids, "{what}: the same resources");
    for (id, doc) in want {
        let r = &got[id];
        assert_eq!(r["document"].as_str(), Some(doc.as_str()), "{what}: {id}");
        assert_eq!(r["mimetype"], "application_xml", "{what}: {id}");
        assert_eq!(r["provider"], "test", "{what}: {id}");
    }
}

/// The activity folders (with `_SUCCESS`) under the archive, oldest first.
fn activities(archive: &Path) -> Vec<std::path::PathBuf> {
    activities_of(archive, "test")
}

/// The whole story on one storage; returns the archive's object paths with timestamps
/// replaced by `TS` (to compare storages).
async fn end_to_end(s3: Option<&MotoS3>) -> Vec<String> {
    let (mut c, dir) = hub_config();
    let root = dir.path().join("root");
    add_file_set(&mut c, "papers", &root, None);
    let app = TestApp::start_with(c).await;
    let base = app.config.base_url();
    let mut lines: Vec<String> = (0..500).map(|i| xml_line(&root, "created", i, 1)).collect();
    // Not JSON, XML or Turtle: counted and listed, not archived.
    lines.push(file_line(&root, "created", "notes.txt", "plain text\n"));
    app.ingest_ok("papers", &lines.join("\n")).await;

    // Local: the archive itself. S3: a copy of the bucket, refreshed before each look.
    let archive = dir.path().join("archive");
    let mut hc = harvest_config(dir.path(), &app.url("/.well-known/resourcesync"));
    hc.output.kind = OutputKind::Ingestion3;
    hc.output.provider = "test".into();
    hc.output.root = archive.to_string_lossy().into_owned();
    if let Some(s3) = s3 {
        hc.output.root = "s3://archive/dpla".into();
        hc.output.s3_endpoint = s3.endpoint.clone();
        hc.output.s3_path_style = true;
    }
    let look = |hc: &destination::config::HarvestConfig| {
        let (out, dest) = (hc.output.clone(), archive.clone());
        async move {
            if s3.is_some() {
                tokio::task::spawn_blocking(move || copy_down(&out, &dest))
                    .await
                    .unwrap();
            }
        }
    };
    hc.output.snapshot_interval_secs = 0;
    hc.output.part_max_bytes = 8 * 1024;
    hc.follow.check_interval_secs = 3600;
    let h = TestHarvester::start(hc.clone()).await;
    wait_state(&h, "the baseline", 120, |s| set_done(s, 501)).await;
    wait_until("the baseline snapshot", || async {
        look(&hc).await;
        !activities(&archive).is_empty()
    })
    .await;
    let first = activities(&archive).remove(0);
    let (records, raw) = read_activity(&first);
    assert_records_equal(&records, &source_state(&root, &base), "baseline snapshot");
    assert!(
        raw["codecs"].as_array().unwrap().len() > 1,
        "cut into several parts at part_max_bytes"
    );
    assert!(raw["codecs"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c == "snappy"));
    let schema = &raw["schemas"][0];
    assert_eq!(schema["name"], "dpla.avro.v1.OriginalRecord");
    assert_eq!(
        schema["fields"][4]["type"]["symbols"],
        serde_json::json!(["application_json", "application_xml", "text_turtle"])
    );
    // The seed's layout and file formats.
    let name = first.file_name().unwrap().to_string_lossy().into_owned();
    let ts = &name[..15];
    assert_eq!(
        first.strip_prefix(&archive).unwrap(),
        Path::new(&format!(
            "test/harvest/{}/{ts}-test-OriginalRecord.v1.avro",
            &ts[..8]
        ))
    );
    let manifest = std::fs::read_to_string(first.join("_MANIFEST")).unwrap();
    let m: Vec<&str> = manifest.lines().collect();
    assert_eq!(m.len(), 5, "{manifest}");
    assert_eq!(m[0], "Activity: Harvest");
    assert_eq!(m[1], "Provider: test");
    assert_eq!(m[2], "Record count: 500");
    assert!(m[3].starts_with("Start date/time: 20"), "{manifest}");
    assert_eq!(
        m[4],
        format!(
            "Input: {} (ResourceSync, by resourcesync-hub harvest)",
            hc.source.url
        )
    );
    let prov: serde_json::Value = serde_json::from_slice(
        &std::fs::read(first.with_file_name(format!("{ts}-test-OriginalRecord.v1-prov.json")))
            .unwrap(),
    )
    .unwrap();
    assert!(prov["version"]
        .as_str()
        .unwrap()
        .starts_with("resourcesync-hub "));
    assert_eq!(
        prov["generator"],
        format!("plan/{ts}/{ts}-OriginalRecord.v1.json").as_str(),
        "the baseline belongs to its plan"
    );
    let plan: serde_json::Value = serde_json::from_slice(
        &std::fs::read(archive.join(format!("test/plan/{ts}/{ts}-OriginalRecord.v1.json")))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        plan["harvest"],
        format!("harvest/{}/{name}", &ts[..8]).as_str()
    );
    let skipped = std::fs::read_to_string(first.join("_LOGS/skipped.csv")).unwrap();
    assert_eq!(
        skipped,
        format!("id,mimetype,reason\n{base}/files/papers/notes.txt,text/plain,\"media type text/plain is not JSON, XML or Turtle\"\n")
    );
    let status = destination::status(&hc).unwrap();
    assert!(
        status.contains("not archived (1;") && status.contains("notes.txt: media type text/plain"),
        "{status}"
    );

    // 40 changes by push, in two batches; T lies between them.
    let batch1: Vec<String> = (0..10)
        .map(|i| xml_line(&root, "created", 1000 + i, 1))
        .chain((0..10).map(|i| xml_line(&root, "updated", i, 2)))
        .collect();
    app.ingest_ok("papers", &batch1.join("\n")).await;
    wait_state(&h, "the first batch", 60, |s| applied(s) >= 20).await;
    // T: after the first batch was applied (and journaled), before the second is ingested.
    let t = resourcesync_hub::model::Timestamp::now();
    let at_t = source_state(&root, &base);
    let mut batch2: Vec<String> = (10..20)
        .map(|i| {
            std::fs::remove_file(root.join(format!("r/{i:04}.xml"))).unwrap();
            format!(
                r#"{{"change":"deleted","location":{{"type":"rel_path","value":"r/{i:04}.xml"}}}}"#
            )
        })
        .collect();
    batch2.extend((20..30).map(|i| xml_line(&root, "updated", i, 2)));
    app.ingest_ok("papers", &batch2.join("\n")).await;
    wait_state(&h, "the second batch", 60, |s| applied(s) >= 40).await;
    // The audit reads the archive (the baseline snapshot + the journal since).
    let (report, ok) = destination::audit(&hc).await.unwrap();
    assert!(
        ok && report.contains("501 listed, 0 missing, 0 different")
            && report.contains("1 not archived")
            && report.contains("archive: 0 records"),
        "{report}"
    );

    let report: serde_json::Value =
        serde_json::from_str(&destination::snapshot(&hc, None).await.unwrap()).unwrap();
    assert_eq!(
        (&report["inserted"], &report["updated"], &report["deleted"]),
        (&10.into(), &20.into(), &10.into()),
        "{report}"
    );
    look(&hc).await;
    let acts = activities(&archive);
    assert_eq!(acts.len(), 2);
    let second = &acts[1];
    let (records, _) = read_activity(second);
    assert_records_equal(&records, &source_state(&root, &base), "second snapshot");
    let ops_file = std::fs::read_dir(second.join("_LOGS/ops"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let ops = std::fs::read_to_string(ops_file).unwrap();
    let mut ops: Vec<&str> = ops.lines().collect();
    assert_eq!(ops.remove(0), "id,operation");
    let mut want: Vec<String> = (0..10)
        .map(|i| format!("{base}/files/papers/r/{:04}.xml,insert", 1000 + i))
        .chain((0..10).map(|i| format!("{base}/files/papers/r/{i:04}.xml,update")))
        .chain((10..20).map(|i| format!("{base}/files/papers/r/{i:04}.xml,delete")))
        .chain((20..30).map(|i| format!("{base}/files/papers/r/{i:04}.xml,update")))
        .collect();
    want.sort();
    ops.sort();
    assert_eq!(ops, want, "exactly the 40 changes");
    let prov: serde_json::Value = serde_json::from_slice(
        &std::fs::read(second.with_file_name(format!(
            "{}-prov.json",
            second
                .file_name()
                .unwrap()
                .to_string_lossy()
                .trim_end_matches(".avro")
        )))
        .unwrap(),
    )
    .unwrap();
    assert_eq!(
        prov["generator"],
        first
            .strip_prefix(archive.join("test"))
            .unwrap()
            .to_str()
            .unwrap()
    );
    h.stop().await;
    // A change the harvester has not seen: the audit says so.
    app.ingest_ok("papers", &xml_line(&root, "updated", 30, 3))
        .await;
    let (report, ok) = destination::audit(&hc).await.unwrap();
    assert!(
        !ok && report.contains(&format!("different: {base}/files/papers/r/0030.xml")),
        "{report}"
    );

    // Recreate the state at T (between the batches) from the first snapshot + the journal.
    let report: serde_json::Value =
        serde_json::from_str(&destination::recreate(&hc, t, None).await.unwrap()).unwrap();
    look(&hc).await;
    let recreated = archive
        .join("test")
        .join(report["activity"].as_str().unwrap());
    let (records, _) = read_activity(&recreated);
    assert_records_equal(&records, &at_t, "recreated at T");
    assert!(recreated.join("_SUCCESS").exists());
    app.stop().await;
    let ts = regex_free_ts(&archive);
    drop(dir);
    ts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn baseline_push_snapshot_and_recreate_match_the_source() {
    let local = end_to_end(None).await;
    let s3 = MotoS3::start("archive");
    let remote = end_to_end(Some(&s3)).await;
    assert_eq!(local, remote, "the same objects on S3 as in a local folder");
}

/// DPLA's `InputHelper.mostRecent` / `scripts/ingest.sh` rule, applied here: the newest folder
/// directly under `<provider>/harvest/` named `\d{8}_\d{6}-<provider>-OriginalRecord\.avro`
/// that holds `_SUCCESS`.
fn dpla_most_recent(archive: &Path, provider: &str) -> Option<std::path::PathBuf> {
    let suffix = format!("-{provider}-OriginalRecord.avro");
    let mut found: Vec<std::path::PathBuf> =
        std::fs::read_dir(archive.join(provider).join("harvest"))
            .ok()?
            .filter_map(Result::ok)
            .filter(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let ts = name.strip_suffix(&suffix).unwrap_or("");
                ts.len() == 15
                    && ts
                        .char_indices()
                        .all(|(i, c)| if i == 8 { c == '_' } else { c.is_ascii_digit() })
                    && e.path().join("_SUCCESS").is_file()
            })
            .map(|e| e.path())
            .collect();
    found.sort();
    found.pop()
}

/// `output.layout = "ingestion3-code"`: DPLA's own rule finds the harvest, an ISO-8859-1
/// record reads back with its characters (as UTF-8, its declaration saying so), and a
/// provider token DPLA's paths cannot hold is refused at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dplas_code_finds_the_ingestion3_code_layout() {
    let (mut c, dir) = hub_config();
    let root = dir.path().join("root");
    add_file_set(&mut c, "papers", &root, None);
    let app = TestApp::start_with(c).await;
    let base = app.config.base_url();
    let mut lines: Vec<String> = (0..3).map(|i| xml_line(&root, "created", i, 1)).collect();
    let mut latin1 = b"<?xml version=\"1.0\" encoding=\"ISO-8859-1\"?>\n<record>".to_vec();
    latin1.extend_from_slice(b"M\xfcnchen, Fran\xe7ois</record>");
    std::fs::write(root.join("latin1.xml"), &latin1).unwrap();
    lines.push(format!(
        r#"{{"change":"created","location":{{"type":"rel_path","value":"latin1.xml"}},"length":{},"md5":"{}","mime":"text/xml"}}"#,
        latin1.len(),
        md5_hex(&latin1)
    ));
    app.ingest_ok("papers", &lines.join("\n")).await;

    let archive = dir.path().join("archive");
    let mut hc = harvest_config(dir.path(), &app.url("/.well-known/resourcesync"));
    hc.output.kind = OutputKind::Ingestion3;
    hc.output.layout = resourcesync_hub::destination::config::Layout::Ingestion3Code;
    hc.output.root = archive.to_string_lossy().into_owned();
    hc.output.snapshot_interval_secs = 0;
    hc.follow.check_interval_secs = 3600;
    hc.output.provider = "my_hub".into();
    let refused = hc.validate().unwrap_err().to_string();
    assert!(
        refused.contains("\"my_hub\"") && refused.contains("lowercase letters and digits"),
        "{refused}"
    );
    hc.output.provider = "test".into();
    hc.validate().unwrap();

    let h = TestHarvester::start(hc.clone()).await;
    wait_state(&h, "the baseline", 120, |s| set_done(s, 4)).await;
    wait_until("the baseline snapshot", || async {
        dpla_most_recent(&archive, "test").is_some()
    })
    .await;
    h.stop().await;
    let found = dpla_most_recent(&archive, "test").unwrap();
    let name = found.file_name().unwrap().to_string_lossy().into_owned();
    let ts = &name[..15];
    let (records, _) = read_activity(&found);
    assert_eq!(records.len(), 4, "{records:?}");
    assert_eq!(
        records[&format!("{base}/files/papers/latin1.xml")]["document"],
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<record>München, François</record>"
    );
    // Beside it as the specification has them, where DPLA's rule never takes them for a
    // harvest: the provenance (naming the plan) and the plan outside harvest/.
    let prov: serde_json::Value = serde_json::from_slice(
        &std::fs::read(found.with_file_name(format!("{ts}-test-OriginalRecord-prov.json")))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        prov["generator"],
        format!("plan/{ts}/{ts}-OriginalRecord.json").as_str()
    );
    let plan: serde_json::Value = serde_json::from_slice(
        &std::fs::read(archive.join(format!("test/plan/{ts}/{ts}-OriginalRecord.json"))).unwrap(),
    )
    .unwrap();
    assert_eq!(plan["harvest"], format!("harvest/{name}").as_str());
    let status = destination::status(&hc).unwrap();
    assert!(!status.contains("not archived"), "{status}");
    app.stop().await;
}

/// Every file under `archive`, relative, with each `yyyymmdd_hhmmss` and `yyyymmdd` folder
/// name replaced, sorted.
fn regex_free_ts(archive: &Path) -> Vec<String> {
    let mut v: Vec<String> = walkdir::WalkDir::new(archive)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file())
        .map(|e| {
            let rel = e
                .path()
                .strip_prefix(archive)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            // Digits runs of 8 (a date) and 8_6 (a timestamp) become TS.
            let mut out = String::new();
            let mut digits = String::new();
            for ch in rel.chars().chain(std::iter::once('/')) {
                if ch.is_ascii_digit() || (ch == '_' && digits.len() == 8) {
                    digits.push(ch);
                    continue;
                }
                if digits.len() == 8 || digits.len() == 15 {
                    out.push_str("TS");
                } else {
                    out.push_str(&digits);
                }
                digits.clear();
                out.push(ch);
            }
            out.pop();
            // Journal segments are cut where exports happened to run (timing, not content).
            if out.starts_with("test/journal/") {
                out = "test/journal/SEGMENT.avro".into();
            }
            out
        })
        .collect();
    v.sort();
    v.dedup();
    v
}

/// Copies every object of the archive into `dest` (for reading it as files).
fn copy_down(out: &resourcesync_hub::destination::config::OutputSection, dest: &Path) {
    let archive = destination::output::ingestion3::Archive::open(out).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    for key in archive.list("").unwrap() {
        let target = dest.join(&key);
        if target.exists() {
            continue;
        }
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        let local = archive.fetch_to(&key, tmp.path()).unwrap();
        std::fs::rename(local, target).unwrap();
    }
}

/// moto's S3 server on 127.0.0.1 (port chosen by the OS), with one bucket; stops when dropped.
pub struct MotoS3 {
    child: std::process::Child,
    pub endpoint: String,
}

impl MotoS3 {
    pub fn start(bucket: &str) -> MotoS3 {
        use std::io::BufRead;
        let mut child = std::process::Command::new(PyEnv::get().python())
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/tools/moto_s3.py"
            ))
            .arg(bucket)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("moto_s3.py printed {line:?}: {e}"));
        // The standard AWS variables: the only credentials the output reads.
        std::env::set_var("AWS_ACCESS_KEY_ID", "test");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "test");
        MotoS3 {
            child,
            endpoint: v["endpoint"].as_str().unwrap().to_string(),
        }
    }
}

impl Drop for MotoS3 {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `harvest audit` on a config file: (report, exit status success).
fn audit_cli(config: &Path) -> (String, bool) {
    let out = std::process::Command::new(ChildServer::BIN)
        .args(["harvest", "audit", "--config"])
        .arg(config)
        .output()
        .unwrap();
    (
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
        out.status.success(),
    )
}

/// The running harvester killed (SIGKILL) while its housekeeping writes the baseline
/// snapshot: the folder it leaves has no `_SUCCESS`; restarted, the harvester finishes that
/// same snapshot, complete, and the audit of the archive says IN SYNC (and NOT IN SYNC once
/// the source changed while the harvester is down).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_harvester_killed_mid_snapshot_finishes_it_when_restarted() {
    let (mut c, dir) = hub_config();
    let root = dir.path().join("root");
    add_file_set(&mut c, "papers", &root, None);
    let app = TestApp::start_with(c).await;
    let base = app.config.base_url();
    // 3,000 records of 2 KB, parts cut at 4 KB: about 1,500 parts to write.
    let n = 3000;
    let lines: Vec<String> = (0..n)
        .map(|i| {
            file_line(
                &root,
                "created",
                &format!("r/{i:04}.xml"),
                &format!("<r n=\"{i}\">{}</r>", "x".repeat(2000)),
            )
        })
        .collect();
    app.ingest_ok("papers", &lines.join("\n")).await;
    let archive = dir.path().join("archive");
    let config = dir.path().join("harvest.toml");
    std::fs::write(
        &config,
        format!(
            "[source]\nurl = \"{}\"\n[state]\ndir = \"{}\"\n[push]\nlisten = \"127.0.0.1:{}\"\n[follow]\ncheck_interval_secs = 3600\n[output]\nkind = \"ingestion3\"\nprovider = \"test\"\nroot = \"{}\"\npart_max_bytes = 4096\nsnapshot_interval_secs = 0\n",
            app.url("/.well-known/resourcesync"),
            dir.path().join("state").display(),
            free_port(),
            archive.display()
        ),
    )
    .unwrap();
    let parts = |a: &Path| {
        walkdir::WalkDir::new(a)
            .into_iter()
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().starts_with("part-"))
            .count()
    };
    let success = || {
        walkdir::WalkDir::new(&archive)
            .into_iter()
            .filter_map(Result::ok)
            .filter(|e| e.file_name() == "_SUCCESS")
            .count()
    };
    let h = ChildHarvester::start(&config);
    wait_until("the baseline snapshot to be writing parts", || async {
        parts(&archive) >= 20
    })
    .await;
    h.kill();
    let left = parts(&archive);
    assert_eq!(success(), 0, "killed after {left} parts: no _SUCCESS");
    assert!(left < n / 2, "killed mid-write ({left} parts)");

    let h = ChildHarvester::start(&config);
    wait_until("the restarted harvester to finish the snapshot", || async {
        success() > 0
    })
    .await;
    let acts = activities(&archive);
    assert_eq!(acts.len(), 1, "the same snapshot, finished");
    assert_eq!(success(), 1);
    let folders = walkdir::WalkDir::new(archive.join("test/harvest"))
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_dir() && e.file_name().to_string_lossy().ends_with(".avro"))
        .count();
    assert_eq!(folders, 1, "no partial folder left beside it");
    let (records, _) = read_activity(&acts[0]);
    assert_eq!(records.len(), n);
    assert_records_equal(&records, &source_state(&root, &base), "finished snapshot");
    let manifest = std::fs::read_to_string(acts[0].join("_MANIFEST")).unwrap();
    assert!(manifest.contains("Record count: 3000"), "{manifest}");

    let (report, ok) = tokio::task::spawn_blocking({
        let config = config.clone();
        move || audit_cli(&config)
    })
    .await
    .unwrap();
    assert!(
        ok && report.contains("3000 listed, 0 missing, 0 different")
            && report.ends_with("IN SYNC\n")
            && !report.contains("NOT IN SYNC"),
        "{report}"
    );
    // Changed at the source while the harvester is down: the audit says so.
    h.kill();
    app.ingest_ok("papers", &xml_line(&root, "updated", 7, 2))
        .await;
    let (report, ok) = tokio::task::spawn_blocking(move || audit_cli(&config))
        .await
        .unwrap();
    assert!(
        !ok && report.contains("1 different")
            && report.contains(&format!("different: {base}/files/papers/r/0007.xml"))
            && report.contains("NOT IN SYNC"),
        "{report}"
    );
    app.stop().await;
}

/// The activity folders of `provider` under the archive, oldest first.
fn activities_of(archive: &Path, provider: &str) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = walkdir::WalkDir::new(archive.join(provider).join("harvest"))
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_name() == "_SUCCESS")
        .map(|e| e.path().parent().unwrap().to_path_buf())
        .collect();
    v.sort();
    v
}

/// Two `[[sources]]` into one Ingestion 3 archive: each archives as its own provider (its
/// name, or its `provider`), with its own journal and snapshots; `harvest snapshot` writes
/// one per provider, `recreate` asks which; two sources with one provider are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sources_archive_as_two_providers() {
    use resourcesync_hub::destination::config::NamedSource;
    let mut apps = Vec::new();
    for n in 0..2 {
        let (mut c, dir) = hub_config();
        let root = dir.path().join("root");
        add_file_set(&mut c, "papers", &root, None);
        let app = TestApp::start_with(c).await;
        let lines: Vec<String> = (0..20)
            .map(|i| xml_line(&root, "created", i, n + 1))
            .collect();
        app.ingest_ok("papers", &lines.join("\n")).await;
        apps.push((app, root, dir));
    }
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("archive");
    let mut hc = harvest_config(dir.path(), "http://unused.invalid/");
    hc.output.kind = OutputKind::Ingestion3;
    hc.output.provider = String::new();
    hc.output.root = archive.to_string_lossy().into_owned();
    hc.output.snapshot_interval_secs = 0;
    hc.follow.check_interval_secs = 3600;
    let named = |name: &str, url: String, provider: &str| NamedSource {
        provider: provider.into(),
        ..crate::aggregate::source(name, url)
    };
    hc.sources = vec![
        named("alpha", apps[0].0.url("/.well-known/resourcesync"), ""),
        named("Beta-2", apps[1].0.url("/.well-known/resourcesync"), ""),
    ];
    let e = hc.validate().unwrap_err().to_string();
    assert!(
        e.contains("source Beta-2: provider \"Beta-2\"") && e.contains("give it a provider"),
        "{e}"
    );
    hc.sources[1].provider = "alpha".into();
    let e = hc.validate().unwrap_err().to_string();
    assert!(
        e.contains("sources alpha and Beta-2 have one provider (alpha)"),
        "{e}"
    );
    hc.sources[1].provider = "beta2".into();
    hc.validate().unwrap();

    let h = TestHarvester::start(hc.clone()).await;
    wait_state(&h, "both baselines", 60, |s| {
        let sets = s.sets().unwrap();
        sets.len() == 2
            && sets
                .iter()
                .all(|r| r.baseline_done && s.count_held(r.id).unwrap() == 20)
    })
    .await;
    wait_until("a baseline snapshot of each provider", || async {
        !activities_of(&archive, "alpha").is_empty() && !activities_of(&archive, "beta2").is_empty()
    })
    .await;
    for ((app, root, _), provider) in apps.iter().zip(["alpha", "beta2"]) {
        let (records, _) = read_activity(&activities_of(&archive, provider)[0]);
        let want = source_state(root, &app.config.base_url());
        assert_eq!(
            records.keys().collect::<Vec<_>>(),
            want.keys().collect::<Vec<_>>(),
            "{provider}: its own source's records, no other's"
        );
        for (id, doc) in &want {
            assert_eq!(records[id]["document"].as_str(), Some(doc.as_str()));
            assert_eq!(records[id]["provider"], provider);
        }
    }
    h.stop().await;
    // Each its own journal; the manual commands per provider.
    assert!(dir.path().join("state/ingestion3-alpha.sqlite").exists());
    assert!(dir.path().join("state/ingestion3-beta2.sqlite").exists());
    let report = destination::snapshot(&hc, None).await.unwrap();
    assert_eq!(report.lines().count(), 2, "{report}");
    assert_eq!(activities_of(&archive, "alpha").len(), 2);
    let only = destination::snapshot(&hc, Some("Beta-2")).await.unwrap();
    assert_eq!(only.lines().count(), 1, "{only}");
    assert_eq!(activities_of(&archive, "beta2").len(), 3);
    let e = destination::recreate(&hc, resourcesync_hub::model::Timestamp::now(), None)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("--source (alpha, Beta-2)"), "{e}");
    let (report, in_sync) = destination::audit(&hc).await.unwrap();
    assert!(in_sync, "{report}");
}
