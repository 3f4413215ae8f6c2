//! Closes open Change Lists whose period is over, for sets that receive no changes (sets that
//! do are rolled over inside the apply itself).

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::model::Timestamp;
use crate::source::Source;

pub async fn run(source: Arc<Source>, cancel: CancellationToken) {
    let every = Duration::from_secs(source.config().source.rollover_check_secs.max(1));
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        if let Err(e) = tick(&source).await {
            tracing::warn!(error = %e, "change list rollover check failed; will retry");
        }
    }
}

/// One pass over every set; returns how many lists were closed.
pub async fn tick(source: &Source) -> Result<usize, crate::store::StoreError> {
    let mut closed = 0;
    for set in source.store().sets().await? {
        let policy = source.list_policy(&set.name);
        if let Some(no) = source
            .store()
            .rollover_if_due(&set.name, policy, Timestamp::now())
            .await?
        {
            tracing::info!(set = %set.name, list = no, "change list closed (period over)");
            closed += 1;
        }
    }
    Ok(closed)
}
