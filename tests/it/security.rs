//! Hostile peers against the server's trust boundary, as an attacker would try it: bytes a
//! repository or a publisher sends must never run in an admin's browser as this origin.

use crate::collect::{identify_xml, ADMIN};
use crate::hostile::Hostile;
use crate::hub::{hub_config, subscribed, TOKEN as PUBLISHER};
use crate::subscriber::TestSubscriber;
use crate::support::*;

/// The page an attacker hopes an admin opens: its script, run as the server's origin, would
/// read the console's CSRF token and delete every subscription with the admin's session.
const ATTACK: &str = r#"<html xmlns="http://www.w3.org/1999/xhtml"><head><title>a record</title></head><body><p>Metadata</p><script>//<![CDATA[
window.__ran = true; document.title = "RAN";
fetch("/console/subscriptions").then(function (r) { return r.text(); }).then(function (t) {
  var ids = t.match(/\/console\/subscriptions\/[0-9]+/g) || [];
  var csrf = (t.match(/name="csrf" value="([^"]+)"/) || [])[1];
  ids.forEach(function (id) {
    fetch(id + "/delete", {method: "POST", headers: {"content-type": "application/x-www-form-urlencoded"}, body: "csrf=" + csrf + "&confirm=yes"});
  });
});
//]]></script></body></html>"#;

/// The first `<loc>` of a document that ends with `suffix`.
fn loc_ending(doc: &str, suffix: &str) -> String {
    doc.split("<loc>")
        .skip(1)
        .filter_map(|l| l.split("</loc>").next())
        .find(|l| l.ends_with(suffix))
        .unwrap_or_else(|| panic!("a <loc> ending in {suffix} in {doc}"))
        .to_string()
}

/// A signed-in admin opens a collected record that is an XHTML page with a script, the same
/// page as a topic's HTML payload, and a dump package holding the record: every such answer
/// is sandboxed and unsniffed, no script runs (in Chromium), and the console is as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outsiders_bytes_never_run_as_the_consoles_origin() {
    crate::console::browser_present();
    let repo = Hostile::start().await;
    repo.xml("/oai?verb=Identify", identify_xml());
    repo.xml(
        "/oai?verb=ListRecords&metadataPrefix=oai_dc",
        format!(
            r#"<?xml version="1.0" encoding="UTF-8"?>
<OAI-PMH xmlns="http://www.openarchives.org/OAI/2.0/"><responseDate>2026-11-26T10:00:00Z</responseDate><request verb="ListRecords">http://x/oai</request><ListRecords><record><header><identifier>oai:evil:1</identifier><datestamp>2026-11-01T00:00:00Z</datestamp></header><metadata>{ATTACK}</metadata></record></ListRecords></OAI-PMH>"#
        ),
    );
    let (mut c, _dir) = hub_config();
    c.admin.token = ADMIN.into();
    c.dumps.enabled = true;
    c.dumps.check_interval_secs = 1;
    let mut cc = resourcesync_hub::config::CollectConfig::new(&repo.url("/oai"));
    cc.retry_base_ms = 20;
    cc.attempts = 1;
    c.collect.insert("papers".into(), cc);
    let app = TestApp::start_with(c).await;
    let sub = TestSubscriber::start().await;
    let topic = format!("{}/news", app.config.topic_base());
    subscribed(&app, &sub, &topic, "/cb", &[]).await;
    // The same page as a publisher's payload, kept as the topic's latest.
    let r = app
        .client
        .post(app.url("/hub"))
        .header("content-type", "text/html")
        .header("authorization", format!("Bearer {PUBLISHER}"))
        .header(
            "link",
            format!(
                "<{topic}>; rel=\"self\", <{}>; rel=\"hub\"",
                app.config.hub_url()
            ),
        )
        .body(ATTACK)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());

    // The record, once collected, and the Resource Dump's package holding it.
    let raw = reqwest::Client::builder().no_proxy().build().unwrap();
    let get = |path: String| {
        let raw = raw.clone();
        let url = app.url(&path);
        async move { raw.get(url).send().await.unwrap() }
    };
    wait_until("the record collected", || async {
        let r = get("/sets/papers/resourcelist.xml".into()).await;
        r.status() == 200 && r.text().await.unwrap().contains("<loc>")
    })
    .await;
    let record = loc_ending(
        &get("/sets/papers/resourcelist.xml".into())
            .await
            .text()
            .await
            .unwrap(),
        ".xml",
    );
    wait_until("the Resource Dump", || async {
        get("/sets/papers/resourcedump.xml".into()).await.status() == 200
    })
    .await;
    let package = loc_ending(
        &get("/sets/papers/resourcedump.xml".into())
            .await
            .text()
            .await
            .unwrap(),
        ".zip",
    );
    let opened = [record, topic.clone(), package];

    // Every one of them, and the documents and answers around them, is inert.
    for url in opened.iter().cloned().chain(
        [
            "/",
            "/sets/papers/resourcelist.xml",
            "/oai?verb=ListRecords&metadataPrefix=oai_dc",
            "/no/such/page",
        ]
        .map(|p| app.url(p)),
    ) {
        let r = raw.get(&url).send().await.unwrap();
        let h = |n: &str| r.headers().get(n).map(|v| v.to_str().unwrap().to_string());
        assert!(
            h("content-security-policy")
                .is_some_and(|c| c.starts_with("sandbox") && c.contains("default-src 'none'"))
                && h("x-content-type-options").as_deref() == Some("nosniff"),
            "{url} ({}) is not inert: {:?}",
            r.status(),
            r.headers()
        );
    }
    // The console keeps its own policy (its script runs; nothing else does).
    let r = raw.get(app.url("/console/login")).send().await.unwrap();
    let csp = r.headers()["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("script-src 'self'"), "{csp}");

    let out = tokio::task::spawn_blocking({
        let (base, urls) = (app.url(""), opened.to_vec());
        move || {
            std::process::Command::new(PyEnv::get().python())
                .arg(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/tests/tools/inert_browser.py"
                ))
                .arg(base.trim_end_matches('/'))
                .arg(ADMIN)
                .args(urls)
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "the browser script failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let f: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for o in f["opened"].as_array().unwrap() {
        assert!(
            o["ran"] == false && o["title"] != "RAN",
            "a script ran as the server's origin: {o}"
        );
    }
    assert!(
        f["console_after"].as_str().unwrap().contains("/cb"),
        "the console lost its subscription: {f}"
    );
    let (s, v) = admin_call(
        &app,
        ADMIN,
        reqwest::Method::GET,
        "/admin/v1/subscriptions",
        None,
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["items"].as_array().map(Vec::len), Some(1), "{v}");
}
