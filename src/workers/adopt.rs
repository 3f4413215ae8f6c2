//! Adopts external writers' documents on a shared store (Elasticsearch: the only one with
//! external writers). Only the process holding the leader lease adopts, every
//! `notify.poll_interval_ms`; what it adopted is handed to the notifier at once (`adopted`).

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::context::Context;
use crate::hub::Hub;

pub async fn run(
    ctx: Arc<Context>,
    hub: Arc<Hub>,
    adopted: impl Fn(usize) + Send + 'static,
    cancel: CancellationToken,
) {
    let every = Duration::from_millis(ctx.config().notify.poll_interval_ms.max(1));
    loop {
        if hub.is_delivering() {
            match ctx.store().adopt_external(ctx.as_ref()).await {
                Ok(a) => {
                    if a.adopted > 0 {
                        tracing::debug!(changes = a.adopted, "external documents adopted");
                        adopted(a.adopted);
                    }
                    hub.metrics()
                        .adoption_lag_seconds
                        .set(a.lag.map_or(0.0, |l| l.as_secs_f64()));
                }
                Err(e) => {
                    hub.metrics().store_errors.inc();
                    tracing::warn!(error = %e, "adopting external documents failed; will retry")
                }
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}
