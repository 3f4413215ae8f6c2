//! Accepted connections (the server's, and the destination's callback server's), and when
//! they are let go.
//!
//! A peer that stops reading a response (its receive window closed) or goes quiet halfway
//! through a request would otherwise keep its connection and the response chunks queued for
//! it (up to two 256 KB chunks of a page or dump file) for as long as it likes: a few hundred
//! such peers are a few hundred MB. So a connection on which nothing has been received and
//! nothing more could be sent for a while (`server.idle_timeout_secs`) is closed, as nginx's
//! `send_timeout` and `keepalive_timeout` do. "Could be sent" is the kernel's word: it takes
//! more of a response once about half its send buffer (up to 4 MB) has drained, so a reader
//! that keeps reading is cut off only if it reads that much slower than the limit allows.
//!
//! A listener may also cap how many connections are open at once (`server.max_connections`):
//! past the cap it stops accepting, so further clients wait in the kernel's accept queue, as
//! nginx's `worker_connections` does, instead of the process running out of descriptors.
//!
//! [`raise_open_files`] lifts the soft limit of open descriptors to the hard one, as servers
//! that hold many connections do at start (nginx's `worker_rlimit_nofile`).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// A listener for `axum::serve`: TCP_NODELAY on every connection, the idle limit above, and
/// optionally a cap on open connections.
pub struct Listener {
    inner: TcpListener,
    idle: Duration,
    limit: Option<(std::sync::Arc<Semaphore>, Gauge)>,
}

impl Listener {
    pub fn new(inner: TcpListener, idle: Duration) -> Listener {
        Listener {
            inner,
            idle,
            limit: None,
        }
    }

    /// At most `max` connections open at once; `open` follows how many are.
    pub fn with_limit(mut self, max: u32, open: Gauge) -> Listener {
        self.limit = Some((std::sync::Arc::new(Semaphore::new(max as usize)), open));
        self
    }
}

/// A connection's place under the cap: given back (and counted out) when the connection is
/// dropped.
struct Slot {
    _permit: OwnedSemaphorePermit,
    open: Gauge,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.open.dec();
    }
}

impl axum::serve::Listener for Listener {
    type Io = Conn;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Conn, SocketAddr) {
        // Not accepting past the cap leaves further clients in the kernel's queue.
        let slot = match &self.limit {
            Some((sem, open)) => {
                let permit = sem.clone().acquire_owned().await.expect("never closed");
                open.inc();
                Some(Slot {
                    _permit: permit,
                    open: open.clone(),
                })
            }
            None => None,
        };
        let (io, addr) = axum::serve::Listener::accept(&mut self.inner).await;
        // A response's headers and body go out as two writes; with Nagle the body waits for
        // the client's delayed ACK (40 ms a request on keep-alive connections).
        let _ = io.set_nodelay(true);
        (
            Conn {
                io,
                idle: self.idle,
                tick: Box::pin(tokio::time::sleep(self.idle / QUARTERS)),
                moved: false,
                quiet: 0,
                _slot: slot,
            },
            addr,
        )
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// Who is at the other end of a connection (for `ConnectInfo`).
#[derive(Clone, Copy, Debug)]
pub struct Remote(pub SocketAddr);

impl Remote {
    pub fn ip(&self) -> std::net::IpAddr {
        self.0.ip()
    }
}

/// The client's address of a request, when its server was started with it (`ConnectInfo`).
pub fn client_ip(ext: &axum::http::Extensions) -> Option<std::net::IpAddr> {
    ext.get::<axum::extract::ConnectInfo<Remote>>()
        .map(|c| c.0.ip())
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, Listener>> for Remote {
    fn connect_info(stream: axum::serve::IncomingStream<'_, Listener>) -> Remote {
        Remote(*stream.remote_addr())
    }
}

/// The idle limit is watched in quarters of it: a connection is let go after `QUARTERS`
/// quarters in a row in which nothing moved, so between `idle` and 1¼ `idle` after the last
/// byte. (A timer reset whenever bytes move would cost a timer update per request.)
const QUARTERS: u32 = 4;

/// A connection that fails its next read or write once nothing has moved on it for `idle`.
pub struct Conn {
    io: TcpStream,
    idle: Duration,
    /// The end of the current quarter of `idle`.
    tick: Pin<Box<Sleep>>,
    /// Whether bytes moved in the current quarter.
    moved: bool,
    /// Quarters ended in a row with nothing moved.
    quiet: u32,
    _slot: Option<Slot>,
}

impl Conn {
    /// A read or write has to wait: whether nothing has moved for `idle` (the quarters'
    /// timer wakes the connection, so a connection nobody polls is looked at too).
    fn stalled(&mut self, cx: &mut Context<'_>) -> bool {
        while self.tick.as_mut().poll(cx).is_ready() {
            self.quiet = if std::mem::take(&mut self.moved) {
                0
            } else {
                self.quiet + 1
            };
            if self.quiet >= QUARTERS {
                return true;
            }
            self.tick
                .as_mut()
                .reset(Instant::now() + self.idle / QUARTERS);
        }
        false
    }

    fn timed_out(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "no byte moved on the connection for {} s",
                self.idle.as_secs()
            ),
        )
    }

    fn outcome<T>(
        &mut self,
        cx: &mut Context<'_>,
        r: Poll<io::Result<T>>,
        moved: bool,
    ) -> Poll<io::Result<T>> {
        match r {
            Poll::Pending if self.stalled(cx) => Poll::Ready(Err(self.timed_out())),
            Poll::Pending => Poll::Pending,
            Poll::Ready(r) => {
                self.moved |= moved;
                Poll::Ready(r)
            }
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.io).poll_read(cx, buf);
        let moved = buf.filled().len() > before;
        this.outcome(cx, r, moved)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write(cx, buf);
        let moved = matches!(r, Poll::Ready(Ok(n)) if n > 0);
        this.outcome(cx, r, moved)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        let moved = matches!(r, Poll::Ready(Ok(n)) if n > 0);
        this.outcome(cx, r, moved)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_flush(cx);
        this.outcome(cx, r, false)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// Raises the soft limit of open descriptors (`RLIMIT_NOFILE`) to the hard limit; returns the
/// soft limit before and after. The common default soft limit (1,024) is far below what a
/// harvester of hundreds of sources holds.
#[cfg(unix)]
#[allow(clippy::unnecessary_cast)] // rlim_t is u64 here, not on every unix
pub fn raise_open_files() -> io::Result<(u64, u64)> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed, which lives here.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let before = r.rlim_cur as u64;
    let most = most_open_files(r.rlim_max as u64);
    if (r.rlim_cur as u64) < most {
        r.rlim_cur = most as libc::rlim_t;
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok((before, r.rlim_cur as u64))
}

/// The most a soft limit can be raised to under the hard limit `hard`: the hard limit, or
/// when it is unlimited, the kernel's ceiling (Linux refuses an unlimited soft limit of open
/// files; `fs.nr_open`, 1,048,576 by default).
#[cfg(unix)]
#[allow(clippy::unnecessary_cast)]
fn most_open_files(hard: u64) -> u64 {
    if hard != libc::RLIM_INFINITY as u64 {
        return hard;
    }
    std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1 << 20)
}

/// The limit of open descriptors this process can raise itself to (what
/// [`raise_open_files`] gives), for a report.
#[cfg(unix)]
#[allow(clippy::unnecessary_cast)]
pub fn open_files_ceiling() -> io::Result<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct passed, which lives here.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(most_open_files(r.rlim_max as u64))
}

/// Elsewhere the limit is left as it is.
#[cfg(not(unix))]
pub fn raise_open_files() -> io::Result<(u64, u64)> {
    Ok((0, 0))
}

/// Elsewhere no limit is known.
#[cfg(not(unix))]
pub fn open_files_ceiling() -> io::Result<u64> {
    Err(io::Error::other("no limit of open files known here"))
}

#[cfg(all(test, unix))]
mod open_files {
    /// After the raise, the soft limit is the hard one (a second raise changes nothing).
    #[test]
    #[allow(clippy::unnecessary_cast)] // rlim_t is u64 here, not on every unix
    fn the_soft_limit_is_raised_to_the_hard_one() {
        let (_, after) = super::raise_open_files().unwrap();
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: reads into the struct above.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) }, 0);
        assert_eq!((after, r.rlim_cur), (r.rlim_max as u64, r.rlim_max));
        assert_eq!(super::raise_open_files().unwrap(), (after, after));
    }
}
