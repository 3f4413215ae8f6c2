//! Long-running loops, each `async fn run(ctx, cancel)`, racing every sleep against shutdown.

pub mod adopt;
pub mod memory;
pub mod rollover;

use tokio_util::sync::CancellationToken;

/// Runs the worker `make` builds until it ends (at shutdown). One that ends unexpectedly (a
/// panic: a defect) is logged with its words, counted (`rshub_workers_restarted_total`) and
/// built again after a pause that doubles up to a minute, so that no loop of the server stops
/// silently while the process lives on.
pub async fn supervise<F, Fut>(
    name: &'static str,
    restarted: prometheus_client::metrics::counter::Counter,
    cancel: CancellationToken,
    mut make: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut restarts = 0u32;
    loop {
        let Err(reason) = crate::cause::caught(make()).await else {
            return;
        };
        restarts += 1;
        restarted.inc();
        tracing::error!(worker = name, reason = %reason, restarts, "a worker ended unexpectedly: starting it again");
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(restart_pause(restarts)) => {}
        }
    }
}

/// The pause before a worker's `restarts`th start again: 2 s, doubled each time, at most 64 s.
fn restart_pause(restarts: u32) -> std::time::Duration {
    use std::time::Duration;
    crate::backoff::Backoff::nth(Duration::from_secs(2), Duration::from_secs(64), restarts)
}

#[cfg(test)]
mod tests {
    #[tokio::test(start_paused = true)]
    async fn a_worker_that_panics_is_started_again_and_counted() {
        let restarted = prometheus_client::metrics::counter::Counter::default();
        let runs = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let r = runs.clone();
        super::supervise("test", restarted.clone(), Default::default(), move || {
            let r = r.clone();
            async move {
                if r.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < 2 {
                    panic!("a defect");
                }
            }
        })
        .await;
        assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 3);
        assert_eq!(restarted.get(), 2);
    }
}
