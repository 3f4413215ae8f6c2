//! Adopts external writers' documents (Elasticsearch backend) when the notifier, which
//! otherwise does it before each sweep, is disabled. Only the process holding the delivery
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
                Ok(n) if n > 0 => tracing::debug!(changes = n, "external documents adopted"),
                Ok(_) => {}
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
