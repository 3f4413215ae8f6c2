//! Keeps the server's resident memory near what it uses. Page builds, large responses and
//! catching-up lanes run on many threads; glibc's allocator gives each its own arena and keeps
//! what they freed, so after a burst the process stayed hundreds of MB above its working set.
//! Two arenas are enough for a 2-core server, and freed memory is handed back every few
//! seconds (`malloc_trim`). Other platforms' allocators are left alone.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod glibc {
    use std::ffi::c_int;

    extern "C" {
        fn mallopt(param: c_int, value: c_int) -> c_int;
        fn malloc_trim(pad: usize) -> c_int;
    }

    /// `M_ARENA_MAX` in glibc's malloc.h.
    const M_ARENA_MAX: c_int = -8;

    pub fn limit_arenas(n: c_int) {
        // SAFETY: mallopt only changes allocator tuning; any thread may call it at any time.
        unsafe {
            mallopt(M_ARENA_MAX, n);
        }
    }

    pub fn trim() {
        // SAFETY: malloc_trim only returns free memory to the kernel.
        unsafe {
            malloc_trim(0);
        }
    }
}

/// Caps the allocator's arenas (call once, early), unless the environment sets glibc's own
/// `MALLOC_ARENA_MAX`, which an operator who set it expects to hold.
pub fn configure() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        glibc::limit_arenas(2);
    }
}

/// Hands freed memory back to the system every `every`, until cancelled.
pub async fn run(every: Duration, cancel: CancellationToken) {
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        let _ = tokio::task::spawn_blocking(glibc::trim).await;
    }
}
