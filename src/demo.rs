//! `serve --demo`: a small `demo` set of real files under the data directory, imported before
//! the server starts, so a newcomer sees every document and can fetch the resources at once.

use anyhow::Context as _;
use std::path::PathBuf;

use crate::config::{Config, SetOverrides};

pub const DEMO_SET: &str = "demo";

/// Writes the demo files (once) and configures the `demo` set to serve them; returns the folder.
pub fn prepare(config: &mut Config) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(&config.server.data_dir)?;
    let dir = std::fs::canonicalize(&config.server.data_dir)?.join("demo-files");
    if !dir.exists() {
        std::fs::create_dir_all(dir.join("papers"))?;
        std::fs::create_dir_all(dir.join("metadata"))?;
        for i in 1..=12 {
            std::fs::write(
                dir.join(format!("papers/paper-{i:03}.txt")),
                format!("Paper {i}\n\nA demonstration full text, number {i} of 12.\n"),
            )?;
            std::fs::write(
                dir.join(format!("metadata/paper-{i:03}.json")),
                format!("{{\"title\": \"Paper {i}\", \"year\": {}}}\n", 2000 + i),
            )?;
        }
    }
    config
        .sets
        .entry(DEMO_SET.to_string())
        .or_insert_with(|| SetOverrides {
            resource_root_dir: Some(dir.clone()),
            ..SetOverrides::default()
        });
    // Something to look at: the set's Resource Dump and, once a Change List closes, its
    // Change Dumps.
    config.dumps.enabled = true;
    // A harvester on this machine gets pushes: the hub calls back loopback addresses (it
    // refuses them by default).
    for net in ["127.0.0.0/8", "::1/128"] {
        let net: ipnet::IpNet = net.parse().expect("a network");
        if !config.hub.allow_networks.iter().any(|n| n.contains(&net)) {
            config.hub.allow_networks.push(net);
        }
    }
    tracing::info!(
        "demo: the hub calls back loopback addresses (hub.allow_networks gains 127.0.0.0/8 and ::1/128), so a harvester on this machine gets pushes"
    );
    // The admin API to look at too: a token for this run unless one is configured.
    if config.admin.token.is_empty() {
        config.admin.token = crate::digest::random_hex()
            .context("no randomness for a token")?
            .into();
    }
    config.validate()?;
    Ok(dir)
}
