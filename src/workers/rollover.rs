//! Closes open Change Lists whose period is over, for sets that receive no changes (sets that
//! do are rolled over inside the apply itself).

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::context::Context;
use crate::model::Timestamp;

pub async fn run(ctx: Arc<Context>, cancel: CancellationToken) {
    let every = Duration::from_secs(ctx.config().source.rollover_check_secs.max(1));
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        if let Err(e) = tick(&ctx).await {
            tracing::warn!(error = %e, "change list rollover check failed; will retry");
        }
    }
}

/// One pass over every set; returns how many lists were closed.
pub async fn tick(ctx: &Context) -> Result<usize, crate::store::StoreError> {
    let mut closed = 0;
    for set in ctx.store().sets().await? {
        let policy = ctx.list_policy(&set.name);
        if let Some(no) = ctx
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
