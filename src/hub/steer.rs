//! Holding a subscription's deliveries: an admin's pause and resume, and the disable that
//! follows `hub.disable_after_secs` of failures only (with an event to `hub.operator_webhook`).
//! A held lane sends nothing; its messages stay in the log (the pruner keeps what a
//! subscriber has not had), and resuming delivers them in order from its cursor.

use std::sync::Arc;
use std::time::Duration;

use reqwest::header::CONTENT_TYPE;
use tokio_util::task::TaskTracker;

use super::Hub;
use crate::config::Config;
use crate::model::websub::{
    standard_signature, Hold, HoldReason, Subscription, SubscriptionChange, SubscriptionId,
};
use crate::model::Timestamp;
use crate::store::StoreError;

/// Where disable events go (`hub.operator_webhook`), signed with its secret when one is set.
pub(super) struct Operator {
    url: url::Url,
    secret: Option<String>,
    client: reqwest::Client,
}

/// How subscriptions are steered beyond an admin's word: when one failing is disabled
/// (`hub.disable_after_secs`) and whom that is told (`hub.operator_webhook`).
pub(super) struct Steering {
    disable_after: Option<Duration>,
    operator: Option<Arc<Operator>>,
}

impl Steering {
    pub(super) fn from_config(
        c: &Config,
        disable_after: Option<Duration>,
    ) -> anyhow::Result<Steering> {
        Ok(Steering {
            disable_after,
            operator: Operator::from_config(c)?.map(Arc::new),
        })
    }

    /// Whether a lane's subscription has failed long enough to be disabled.
    pub(super) fn due_for_disable(&self, sub: &Subscription, now: Timestamp) -> bool {
        match (self.disable_after, sub.failing_since, sub.held) {
            (Some(after), Some(since), None) => {
                now.micros() - since.micros() >= after.as_micros() as i64
            }
            _ => false,
        }
    }

    /// Says that `sub` was disabled by `hold` after failing since `since`: logged, and sent to
    /// the operator webhook (on `tasks`, tried again a few times) when there is one.
    fn disabled(&self, tasks: &TaskTracker, sub: &Subscription, hold: Hold, last_error: &str) {
        let since = sub.failing_since.unwrap_or(hold.since);
        tracing::warn!(
            subscription = sub.id,
            callback = %sub.callback,
            failing_since = %since,
            error = last_error,
            "every delivery failed for hub.disable_after_secs: subscription disabled (resume it to deliver what it missed)"
        );
        let Some(op) = self.operator.clone() else {
            return;
        };
        let data = serde_json::json!({
            "subscription_id": sub.id.to_string(),
            "topic": sub.topic.to_string(),
            "callback": sub.callback.to_string(),
            "failing_since": since.to_string(),
            "disabled_at": hold.since.to_string(),
            "last_error": last_error,
        });
        let id = format!("evt_disabled_{}_{}", sub.id, hold.since.0);
        tasks.spawn(async move { op.send("subscription.disabled", id, data).await });
    }
}

/// Attempts at an operator event (1, 2, 4, 8 s apart); then it is given up (and logged).
const OPERATOR_ATTEMPTS: u32 = 5;

impl Operator {
    /// The operator webhook configured, if any. It is the admin's own address (not a
    /// subscriber's), so the callback address policy does not apply; redirects are not followed.
    fn from_config(c: &Config) -> anyhow::Result<Option<Operator>> {
        let h = &c.hub;
        if h.operator_webhook.is_empty() {
            return Ok(None);
        }
        let client = reqwest::Client::builder()
            .user_agent(concat!(
                "resourcesync-hub/",
                env!("CARGO_PKG_VERSION"),
                " (operator events)"
            ))
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(h.request_timeout_secs))
            .build()?;
        Ok(Some(Operator {
            url: url::Url::parse(&h.operator_webhook)?,
            secret: (!h.operator_webhook_secret.is_empty())
                .then(|| h.operator_webhook_secret.expose().to_string()),
            client,
        }))
    }

    /// Sends one event, trying again a few times; never fails the caller.
    async fn send(&self, kind: &str, id: String, data: serde_json::Value) {
        let now = Timestamp::now();
        let body = serde_json::json!({"type": kind, "timestamp": now.to_string(), "data": data})
            .to_string();
        let mut backoff =
            crate::backoff::Backoff::new(Duration::from_secs(1), Duration::from_secs(8));
        for attempt in 1..=OPERATOR_ATTEMPTS {
            let at = Timestamp::now().0.div_euclid(1_000_000);
            let mut req = self
                .client
                .post(self.url.clone())
                .header(CONTENT_TYPE, "application/json")
                .header("webhook-id", &id)
                .header("webhook-timestamp", at)
                .body(body.clone());
            if let Some(s) = &self.secret {
                req = req.header(
                    "webhook-signature",
                    standard_signature(s.as_bytes(), &id, at, body.as_bytes()),
                );
            }
            let error = match req.send().await {
                Ok(r) if r.status().is_success() => {
                    tracing::info!(event = kind, %id, "operator webhook told");
                    return;
                }
                Ok(r) => format!("it answered {}", r.status()),
                Err(e) => crate::cause::chain(&e),
            };
            tracing::warn!(event = kind, %id, attempt, %error, "operator webhook not reached");
            if attempt < OPERATOR_ATTEMPTS {
                tokio::time::sleep(backoff.pause()).await;
            }
        }
        tracing::error!(event = kind, %id, "operator webhook given up");
    }
}

impl Hub {
    /// Pauses (`Some(Paused)`) or resumes (`None`) a subscription's deliveries: at once here,
    /// within a sync on the process that delivers it on a shared store. `None` when there is
    /// no such subscription. Resuming also ends a disable.
    pub async fn hold(
        &self,
        id: SubscriptionId,
        reason: Option<HoldReason>,
    ) -> Result<Option<Subscription>, StoreError> {
        let hold = reason.map(|reason| Hold {
            reason,
            since: Timestamp::now(),
        });
        let Some(sub) = self.store.hub_hold(id, hold, false).await? else {
            return Ok(None);
        };
        match reason {
            Some(r) => {
                tracing::info!(subscription = id, callback = %sub.callback, "deliveries {}", r.as_str())
            }
            None => {
                tracing::info!(subscription = id, callback = %sub.callback, "deliveries resumed")
            }
        }
        self.update_lane(&sub);
        Ok(Some(sub))
    }

    /// Changes an admin's settings of a subscription: its own delivery rate limit
    /// (`Some(0.0)`: none, whatever the hub's default; `None`: the hub's default), its delivery
    /// auth. `None` when there is no such subscription.
    pub async fn change(
        &self,
        id: SubscriptionId,
        change: SubscriptionChange,
    ) -> Result<Option<Subscription>, StoreError> {
        let what = format!("{change:?}");
        let Some(sub) = self.store.hub_change(id, change).await? else {
            return Ok(None);
        };
        tracing::info!(subscription = id, change = %what, "subscription settings changed");
        self.update_lane(&sub);
        Ok(Some(sub))
    }

    /// Hands a changed subscription to its lane, if this process delivers it.
    fn update_lane(&self, sub: &Subscription) {
        if let Some(lane) = self.lanes().get_mut(&sub.id) {
            lane.update(sub.clone());
        }
    }

    /// Disables a subscription that has failed for `hub.disable_after_secs` (unless an admin
    /// held it meanwhile): logged, counted, and told to the operator webhook. Returns the
    /// subscription as it now stands.
    pub(super) async fn disable(
        &self,
        sub: &Subscription,
        last_error: &str,
    ) -> Result<Option<Subscription>, StoreError> {
        let hold = Hold {
            reason: HoldReason::Disabled,
            since: Timestamp::now(),
        };
        let Some(now) = self.store.hub_hold(sub.id, Some(hold), true).await? else {
            return Ok(None);
        };
        if now.held != Some(hold) {
            // Paused by an admin in between: that stands.
            return Ok(Some(now));
        }
        self.steering.disabled(&self.tasks, sub, hold, last_error);
        Ok(Some(now))
    }
}
