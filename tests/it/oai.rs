//! The OAI-PMH repository at `/oai` against harvesters nobody here wrote: PyPI `oaipmh`
//! (pyoai's client) and `oaipmh-scythe`, plus every answer checked against OAI-PMH.xsd. The
//! set is fed by the collector from an upstream repository, so a change made upstream is seen
//! downstream too.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use crate::collect::{
    collect_config, no_error, now_datestamp, repository, rewrite, Collecting, OaiServer,
};
use crate::support::{PyEnv, TestApp};

fn tool(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/tools")
        .join(name)
}

fn py_json(args: &[&std::ffi::OsStr]) -> serde_json::Value {
    let out = Command::new(PyEnv::get().python())
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// identifier (the resource's URL) -> its file, for every live resource of `papers`.
async fn expected(c: &Collecting) -> BTreeMap<String, String> {
    let root = c.app.config.collected_dir("papers");
    let prefix = c.app.config.set_config("papers").url_prefix;
    c.resources()
        .await
        .into_keys()
        .map(|url| {
            let rel = percent_encoding::percent_decode_str(url.strip_prefix(&prefix).unwrap())
                .decode_utf8_lossy()
                .to_string();
            (url, root.join(rel).display().to_string())
        })
        .collect()
}

async fn harvest(
    c: &Collecting,
    client: &str,
    state: &Path,
    from: Option<&str>,
) -> serde_json::Value {
    let expect = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        expect.path(),
        serde_json::to_string(&expected(c).await).unwrap(),
    )
    .unwrap();
    let (base, state, client) = (c.app.url("/oai"), state.to_path_buf(), client.to_string());
    let from = from.map(str::to_string);
    tokio::task::spawn_blocking(move || {
        let mut args: Vec<std::ffi::OsString> = vec![
            tool("oai_harvest.py").into(),
            client.into(),
            base.into(),
            state.into(),
            expect.path().into(),
        ];
        if let Some(f) = from {
            args.push("--from".into());
            args.push(f.into());
        }
        py_json(&args.iter().map(|a| a.as_os_str()).collect::<Vec<_>>())
    })
    .await
    .unwrap()
}

fn clean(v: &serde_json::Value) -> bool {
    ["differ", "missing", "extra"]
        .iter()
        .all(|k| v[k].as_array().unwrap().is_empty())
}

/// Both harvesters take the 9,500 live records in full, then with `from` the 300 created,
/// 200 updated and 100 deleted ones, and end with exactly the set's records (equal to its
/// files as canonical XML) and its deletions; every answer is valid against OAI-PMH.xsd and
/// every error case answers the protocol's code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn independent_harvesters_get_exactly_the_sets_records_in_full_and_incrementally() {
    let mut fx = repository(10_000);
    let repo = OaiServer::start(&fx, 500);
    let (cfg, dir) = collect_config(&repo.base);
    let app = TestApp::start_with(cfg).await;
    let c = Collecting { repo, app };
    no_error(&c.wait_ended(None).await);

    let states: Vec<_> = ["pyoai", "scythe"]
        .iter()
        .map(|k| (k.to_string(), dir.path().join(format!("{k}.json"))))
        .collect();
    for (client, state) in &states {
        let v = harvest(&c, client, state, None).await;
        assert!(
            clean(&v) && v["equal"] == 9_500 && v["deleted"] == 0,
            "{client}: {v}"
        );
    }
    let (base, xsd) = (
        c.app.url("/oai"),
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/schemas/OAI-PMH.xsd"),
    );
    let v = tokio::task::spawn_blocking(move || {
        py_json(&[
            tool("oai_validate.py").as_os_str(),
            base.as_ref(),
            xsd.as_os_str(),
        ])
    })
    .await
    .unwrap();
    assert_eq!(v["invalid"], serde_json::json!([]), "{v}");
    assert_eq!(
        (&v["records"], &v["identifiers"]),
        (&9_500.into(), &9_500.into()),
        "{v}"
    );
    let codes = &v["errors"];
    for (case, code) in [
        ("badVerb", "badVerb"),
        ("noVerb", "badVerb"),
        ("badArgument", "badArgument"),
        ("badFrom", "badArgument"),
        ("mixedGranularity", "badArgument"),
        ("missingPrefix", "badArgument"),
        ("exclusiveToken", "badArgument"),
        ("badResumptionToken", "badResumptionToken"),
        ("cannotDisseminateFormat", "cannotDisseminateFormat"),
        ("idDoesNotExist", "idDoesNotExist"),
        ("idDoesNotExistFormats", "idDoesNotExist"),
        ("noRecordsMatch", "noRecordsMatch"),
        ("noRecordsMatchSet", "noRecordsMatch"),
        ("listSetsToken", "badResumptionToken"),
        ("identifyArgument", "badArgument"),
    ] {
        assert_eq!(codes[case], code, "{case}: {v}");
    }

    // Upstream changes, collected; the harvesters come back with `from`.
    let since = now_datestamp();
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let now = now_datestamp();
    let recs = fx["records"].as_array_mut().unwrap();
    let live: Vec<usize> = (0..10_000).filter(|k| k % 20 != 19).collect();
    for &k in &live[..200] {
        recs[k]["dc"]["title"] = serde_json::json!([format!("Record {k}, second version")]);
        recs[k]["datestamp"] = now.clone().into();
    }
    for &k in &live[1000..1100] {
        recs[k]["deleted"] = true.into();
        recs[k]["datestamp"] = now.clone().into();
    }
    for k in 10_000..10_300 {
        recs.push(serde_json::json!({"id": format!("oai:big:{k}"), "datestamp": now, "sets": ["s1"], "dc": {"title": [format!("New {k}")]}}));
    }
    rewrite(&c.repo, &fx);
    no_error(&c.run_now().await);
    for (client, state) in &states {
        let v = harvest(&c, client, state, Some(&since)).await;
        assert_eq!(
            v["seen"], 600,
            "{client}: only the changed records are listed: {v}"
        );
        assert!(
            clean(&v) && v["equal"] == 9_700 && v["deleted"] == 100,
            "{client}: {v}"
        );
    }
    c.app.stop().await;
}
