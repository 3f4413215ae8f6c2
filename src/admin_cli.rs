//! `resourcesync-hub admin …`: the admin API of a running server, as readable tables.

use clap::{Args, Subcommand};
use serde_json::Value;

#[derive(Args)]
pub struct AdminArgs {
    /// Base URL of the running server.
    #[arg(
        long,
        env = "RSHUB_ADMIN_URL",
        default_value = "http://127.0.0.1:8080",
        global = true
    )]
    pub url: String,
    /// The server's admin.token (required; anywhere on the command line).
    #[arg(long, env = "RSHUB_ADMIN_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
    #[command(subcommand)]
    pub command: AdminCommand,
}

#[derive(Subcommand)]
pub enum AdminCommand {
    /// Subscriptions: list, show, delete.
    #[command(subcommand)]
    Subscriptions(SubscriptionsCommand),
    /// Topics with subscriber counts and last publish time.
    Topics,
    /// Totals, queue depth, and the poller's position per set.
    Stats,
    /// The collectors (OAI-PMH, ResourceSync, activity streams, sitemaps): list them, show one
    /// (what it reads and why, its quarantined records), or act.
    Collect {
        /// One collector (its `[collect.NAME]`); without it, every one as a table.
        name: Option<String>,
        /// run (an incremental run now), reconcile (a reconcile pass now), pause or resume.
        action: Option<String>,
    },
}

#[derive(Subcommand)]
pub enum SubscriptionsCommand {
    /// List subscriptions, newest first, with their state and delivery counts.
    List {
        /// Only subscriptions to this topic (exactly as subscribed).
        #[arg(long)]
        topic: Option<String>,
        /// Part of the callback URL.
        #[arg(long)]
        callback: Option<String>,
        /// pending_verification, active, failing, paused, disabled or expired.
        #[arg(long)]
        state: Option<String>,
        /// At most this many rows.
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Show one subscription: lease, secret (whether set, never its value), deliveries, last
    /// success and failure.
    Show {
        /// The subscription's id (from `list`).
        id: String,
    },
    /// Remove a subscription; with --deny, tell the subscriber why.
    Delete {
        /// The subscription's id (from `list`).
        id: String,
        /// Tell the subscriber with a hub.mode=denied request, giving this reason.
        #[arg(long, value_name = "REASON")]
        deny: Option<String>,
    },
    /// Deliver a window of a subscription's messages again (next, in order, with their
    /// Webhook-Id): those published since T (RFC 3339) that it was sent already.
    Redeliver {
        /// The subscription's id (from `list`).
        id: String,
        /// Start of the window, RFC 3339 with a zone (e.g. 2026-11-24T09:00:00Z); no earlier
        /// than the hub keeps messages (hub.retention_hours).
        #[arg(long, value_name = "T")]
        since: String,
        /// End of the window (default: now).
        #[arg(long, value_name = "T")]
        until: Option<String>,
    },
    /// Pause a subscription's deliveries; its messages keep accumulating until `resume`.
    Pause {
        /// The subscription's id (from `list`).
        id: String,
    },
    /// Resume a paused or disabled subscription: what it missed is delivered in order.
    Resume {
        /// The subscription's id (from `list`).
        id: String,
    },
    /// Limit a subscription's deliveries a second (messages beyond wait in order).
    Limit {
        /// The subscription's id (from `list`).
        id: String,
        /// Deliveries a second at most; 0 for no limit, "default" for the hub's
        /// hub.max_per_sec_per_subscriber.
        per_sec: String,
    },
}

struct Api {
    client: reqwest::Client,
    base: String,
    token: String,
}

impl Api {
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        query: &[(&str, String)],
    ) -> anyhow::Result<Option<Value>> {
        self.send(method, path, query, None).await
    }

    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<Value>,
    ) -> anyhow::Result<Option<Value>> {
        let mut req = self
            .client
            .request(method, format!("{}{path}", self.base))
            .query(query)
            .bearer_auth(&self.token);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let r = req.send().await.map_err(|e| {
            anyhow::Error::new(e.without_url()).context(format!("cannot reach {}", self.base))
        })?;
        let status = r.status();
        let text = r.text().await?;
        if !status.is_success() {
            let msg = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| v["error"].as_str().map(str::to_string))
                .unwrap_or(text);
            anyhow::bail!("{status}: {}", msg.trim());
        }
        Ok(if text.is_empty() {
            None
        } else {
            Some(serde_json::from_str(&text)?)
        })
    }

    async fn get(&self, path: &str, query: &[(&str, String)]) -> anyhow::Result<Value> {
        Ok(self
            .call(reqwest::Method::GET, path, query)
            .await?
            .unwrap_or(Value::Null))
    }
}

/// A value as a table cell.
/// A collector's state as a person reads it: "waiting until T" while a `Retry-After` is
/// waited out.
fn collector_state(c: &serde_json::Value) -> String {
    match c["waiting_until"].as_str() {
        Some(t) => format!("waiting until {t}"),
        None => cell(&c["state"]),
    }
}

fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Left-aligned columns, two spaces apart.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  "));
            }
        }
        s.trim_end().to_string() + "\n"
    };
    let mut out = line(headers.to_vec());
    for r in rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
    }
    out
}

pub async fn run(args: AdminArgs) -> anyhow::Result<()> {
    let api = Api {
        client: reqwest::Client::builder().no_proxy().build()?,
        base: args.url.trim_end_matches('/').to_string(),
        token: args.token.filter(|t| !t.is_empty()).ok_or_else(|| {
            anyhow::anyhow!(
                "the admin API needs the server's admin.token: give --token TOKEN (or RSHUB_ADMIN_TOKEN)"
            )
        })?,
    };
    match args.command {
        AdminCommand::Subscriptions(SubscriptionsCommand::List {
            topic,
            callback,
            state,
            limit,
        }) => subscriptions_list(&api, topic, callback, state, limit).await?,
        AdminCommand::Subscriptions(SubscriptionsCommand::Show { id }) => {
            subscription_show(&api, id).await?
        }
        AdminCommand::Subscriptions(SubscriptionsCommand::Delete { id, deny }) => {
            subscription_delete(&api, id, deny).await?
        }
        AdminCommand::Subscriptions(SubscriptionsCommand::Redeliver { id, since, until }) => {
            subscription_redeliver(&api, id, since, until).await?
        }
        AdminCommand::Subscriptions(SubscriptionsCommand::Pause { id }) => {
            subscription_hold(&api, id, "pause").await?
        }
        AdminCommand::Subscriptions(SubscriptionsCommand::Resume { id }) => {
            subscription_hold(&api, id, "resume").await?
        }
        AdminCommand::Subscriptions(SubscriptionsCommand::Limit { id, per_sec }) => {
            subscription_limit(&api, id, per_sec).await?
        }
        AdminCommand::Collect { name: None, .. } => collectors_list(&api).await?,
        AdminCommand::Collect {
            name: Some(name),
            action: None,
        } => collector_show(&api, name).await?,
        AdminCommand::Collect {
            name: Some(name),
            action: Some(action),
        } => collector_act(&api, name, action).await?,
        AdminCommand::Topics => topics(&api).await?,
        AdminCommand::Stats => stats(&api).await?,
    }
    Ok(())
}

/// The subscriptions, filtered, as a table.
async fn subscriptions_list(
    api: &Api,
    topic: Option<String>,
    callback: Option<String>,
    state: Option<String>,
    limit: u32,
) -> anyhow::Result<()> {
    let mut q = vec![("limit", limit.to_string())];
    q.extend(topic.map(|t| ("topic", t)));
    q.extend(callback.map(|c| ("callback", c)));
    q.extend(state.map(|s| ("state", s)));
    let page = api.get("/admin/v1/subscriptions", &q).await?;
    let rows: Vec<Vec<String>> = page["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            [
                "id",
                "state",
                "topic",
                "callback",
                "lease_expires",
                "delivered",
                "given_up",
                "pending",
            ]
            .iter()
            .map(|k| cell(&s[*k]))
            .collect()
        })
        .collect();
    print!(
        "{}",
        table(
            &[
                "ID",
                "STATE",
                "TOPIC",
                "CALLBACK",
                "EXPIRES",
                "DELIVERED",
                "GIVEN UP",
                "PENDING"
            ],
            &rows
        )
    );
    if let Some(next) = page["next_cursor"].as_str() {
        println!("(more: the API's cursor is {next})");
    }
    Ok(())
}

/// One subscription, field by field.
async fn subscription_show(api: &Api, id: String) -> anyhow::Result<()> {
    let s = api
        .get(&format!("/admin/v1/subscriptions/{id}"), &[])
        .await?;
    let mut rows = Vec::new();
    for k in [
        "id",
        "state",
        "topic",
        "callback",
        "lease_seconds",
        "lease_start",
        "lease_expires",
        "verified_at",
        "created_at",
        "secret_set",
        "signature_algorithm",
        "delivered",
        "given_up",
        "pending",
        "retry_attempts",
        "next_attempt_at",
        "failing_since",
        "held_since",
    ] {
        rows.push(vec![k.to_string(), cell(&s[k])]);
    }
    rows.push(vec![
        "last_success".into(),
        format!(
            "{} {}",
            cell(&s["last_success"]["at"]),
            cell(&s["last_success"]["status"])
        ),
    ]);
    rows.push(vec![
        "last_failure".into(),
        format!(
            "{} {} {}",
            cell(&s["last_failure"]["at"]),
            cell(&s["last_failure"]["status"]),
            cell(&s["last_failure"]["error"])
        ),
    ]);
    print!("{}", table(&["FIELD", "VALUE"], &rows));
    Ok(())
}

/// Deletes a subscription, telling the subscriber when `deny` says why.
async fn subscription_delete(api: &Api, id: String, deny: Option<String>) -> anyhow::Result<()> {
    let mut q = Vec::new();
    if let Some(reason) = &deny {
        q.push(("deny", "true".to_string()));
        q.push(("reason", reason.clone()));
    }
    api.call(
        reqwest::Method::DELETE,
        &format!("/admin/v1/subscriptions/{id}"),
        &q,
    )
    .await?;
    println!(
        "subscription {id} deleted{}",
        if deny.is_some() {
            "; the subscriber was told"
        } else {
            ""
        }
    );
    Ok(())
}

/// Delivers a window of a subscription's messages again.
async fn subscription_redeliver(
    api: &Api,
    id: String,
    since: String,
    until: Option<String>,
) -> anyhow::Result<()> {
    let mut body = serde_json::json!({ "since": since });
    if let Some(u) = &until {
        body["until"] = Value::String(u.clone());
    }
    let r = api
        .send(
            reqwest::Method::POST,
            &format!("/admin/v1/subscriptions/{id}/redeliver"),
            &[],
            Some(body),
        )
        .await?
        .unwrap_or(Value::Null);
    println!(
        "subscription {id}: {} messages queued for delivery again",
        cell(&r["queued"])
    );
    Ok(())
}

/// Pauses or resumes a subscription (`verb`: `pause` or `resume`).
async fn subscription_hold(api: &Api, id: String, verb: &str) -> anyhow::Result<()> {
    let r = api
        .send(
            reqwest::Method::POST,
            &format!("/admin/v1/subscriptions/{id}/{verb}"),
            &[],
            None,
        )
        .await?
        .unwrap_or(Value::Null);
    println!(
        "subscription {id}: {} ({} messages waiting)",
        cell(&r["state"]),
        cell(&r["pending"])
    );
    Ok(())
}

/// Sets a subscription's own rate limit.
async fn subscription_limit(api: &Api, id: String, per_sec: String) -> anyhow::Result<()> {
    let limit = match per_sec.as_str() {
        "default" => Value::Null,
        n => match n.parse::<f64>() {
            Ok(n) if n.is_finite() => serde_json::json!(n),
            _ => {
                anyhow::bail!("{per_sec:?} is not a number of deliveries a second (or \"default\")")
            }
        },
    };
    let r = api
        .send(
            reqwest::Method::PATCH,
            &format!("/admin/v1/subscriptions/{id}"),
            &[],
            Some(serde_json::json!({ "max_per_sec": limit })),
        )
        .await?
        .unwrap_or(Value::Null);
    println!(
        "subscription {id}: at most {} deliveries a second",
        match &r["max_per_sec"] {
            Value::Null => "the hub's default number of".to_string(),
            v if v.as_f64() == Some(0.0) => "any number of".to_string(),
            v => cell(v),
        }
    );
    Ok(())
}

/// Every collector, as a table.
async fn collectors_list(api: &Api) -> anyhow::Result<()> {
    let v = api.get("/admin/v1/collect", &[]).await?;
    let rows: Vec<Vec<String>> = v["collectors"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            vec![
                cell(&c["name"]),
                collector_state(c),
                cell(&c["last_ended"]),
                cell(&c["live"]["next_run"]),
                cell(&c["totals"]["seen"]),
                cell(&c["quarantined"]),
                cell(&c["last_error"]),
            ]
        })
        .collect();
    print!(
        "{}",
        table(
            &[
                "COLLECTOR",
                "STATE",
                "LAST RUN ENDED",
                "NEXT RUN",
                "RECORDS",
                "QUARANTINED",
                "LAST ERROR"
            ],
            &rows
        )
    );
    Ok(())
}

/// One collector, with its quarantined records.
async fn collector_show(api: &Api, name: String) -> anyhow::Result<()> {
    let c = api.get(&format!("/admin/v1/collect/{name}"), &[]).await?;
    let mut rows = Vec::new();
    for (k, v) in [
        ("source", &c["url"]),
        ("kind", &c["kind"]),
        ("reads", &c["discovered"]["url"]),
        ("metadata prefix", &c["metadata_prefix"]),
        ("OAI set", &c["oai_set"]),
        ("state", &serde_json::Value::String(collector_state(&c))),
        ("window from", &c["window_from"]),
        ("last run started", &c["last_started"]),
        ("last run ended", &c["last_ended"]),
        ("last outcome", &c["last_outcome"]),
        ("last error", &c["last_error"]),
        ("next run", &c["live"]["next_run"]),
        ("last reconcile", &c["last_reconcile"]),
        ("marked deleted by it", &c["last_reconcile_deleted"]),
    ] {
        rows.push(vec![k.to_string(), cell(v)]);
    }
    if !c["run"].is_null() {
        rows.push(vec![
            "run under way: pages".into(),
            cell(&c["run"]["pages"]),
        ]);
    }
    for k in [
        "seen",
        "created",
        "updated",
        "deleted",
        "unchanged",
        "quarantined",
    ] {
        rows.push(vec![
            format!("{k} (last run / all)"),
            format!("{} / {}", cell(&c["last"][k]), cell(&c["totals"][k])),
        ]);
    }
    print!("{}", table(&["WHAT", "VALUE"], &rows));
    if !c["discovered"].is_null() {
        println!(
            "\ndiscovered {}: {}",
            cell(&c["discovered"]["at"]),
            cell(&c["discovered"]["why"])
        );
        for l in c["discovered"]["looked"].as_array().into_iter().flatten() {
            println!("  looked at {}", cell(l));
        }
    }
    if let Some(f) = c["following"].as_str() {
        println!("\n{f}");
    }
    let q: Vec<Vec<String>> = c["quarantine"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| vec![cell(&e["at"]), cell(&e["identifier"]), cell(&e["reason"])])
        .collect();
    if !q.is_empty() {
        println!();
        print!("{}", table(&["QUARANTINED AT", "IDENTIFIER", "REASON"], &q));
    }
    Ok(())
}

/// Asks a collector to run, reconcile, pause or resume.
async fn collector_act(api: &Api, name: String, action: String) -> anyhow::Result<()> {
    let r = api
        .call(
            reqwest::Method::POST,
            &format!("/admin/v1/collect/{name}/{action}"),
            &[],
        )
        .await?
        .unwrap_or(Value::Null);
    println!("collector {name}: {}", cell(&r["message"]));
    Ok(())
}

/// The hub's topics, as a table.
async fn topics(api: &Api) -> anyhow::Result<()> {
    let topics = api.get("/admin/v1/topics", &[]).await?;
    let rows: Vec<Vec<String>> = topics
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            vec![
                cell(&t["topic"]),
                cell(&t["subscribers"]),
                cell(&t["last_publish"]),
            ]
        })
        .collect();
    print!(
        "{}",
        table(&["TOPIC", "SUBSCRIBERS", "LAST PUBLISH"], &rows)
    );
    Ok(())
}

/// The hub's counts and each set's notifier.
async fn stats(api: &Api) -> anyhow::Result<()> {
    let s = api.get("/admin/v1/stats", &[]).await?;
    let subs = &s["subscriptions"];
    let mut rows: Vec<Vec<String>> = [
        "active",
        "failing",
        "paused",
        "disabled",
        "expired",
        "pending_verification",
    ]
    .iter()
    .map(|k| vec![format!("subscriptions {k}"), cell(&subs[*k])])
    .collect();
    for k in ["delivered", "given_up", "queue_depth"] {
        rows.push(vec![k.to_string(), cell(&s[k])]);
    }
    if let Some(m) = s["attempts_by_outcome"].as_object() {
        for (k, v) in m {
            rows.push(vec![format!("attempts {k} (since start)"), cell(v)]);
        }
    }
    print!("{}", table(&["WHAT", "COUNT"], &rows));
    let pollers: Vec<Vec<String>> = s["pollers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            vec![
                cell(&p["set"]),
                cell(&p["watermark"]),
                cell(&p["oldest_pending"]),
                format!("{:.1}", p["lag_seconds"].as_f64().unwrap_or(0.0)),
            ]
        })
        .collect();
    if !pollers.is_empty() {
        println!();
        print!(
            "{}",
            table(
                &["SET", "NOTIFIED UP TO", "OLDEST PENDING", "LAG S"],
                &pollers
            )
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn tables_align_columns() {
        let t = super::table(
            &["A", "BB"],
            &[
                vec!["long".into(), "x".into()],
                vec!["s".into(), "yy".into()],
            ],
        );
        assert_eq!(t, "A     BB\nlong  x\ns     yy\n");
    }
}
