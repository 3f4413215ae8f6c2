//! Adopts external writers' documents (Elasticsearch backend) when the notifier, which
//! otherwise does it before each sweep, is disabled. Only the process holding the leader
//! lease adopts, every `notify.poll_interval_ms`.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::hub::Hub;
use crate::source::Source;

pub async fn run(source: Arc<Source>, hub: Arc<Hub>, cancel: CancellationToken) {
    let every = Duration::from_millis(source.config().notify.poll_interval_ms.max(1));
    loop {
        if hub.is_delivering() {
            match source.store().adopt_external(source.as_ref()).await {
                Ok(a) => {
                    if a.adopted > 0 {
                        tracing::debug!(changes = a.adopted, "external documents adopted");
                    }
                    hub.metrics()
                        .adoption_lag_seconds
                        .set(a.lag.map_or(0.0, |l| l.as_secs_f64()));
                }
                Err(e) => {
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
