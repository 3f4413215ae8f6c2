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

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};

/// A listener for `axum::serve`: TCP_NODELAY on every connection, and the idle limit above.
pub struct Listener {
    inner: TcpListener,
    idle: Duration,
}

impl Listener {
    pub fn new(inner: TcpListener, idle: Duration) -> Listener {
        Listener { inner, idle }
    }
}

impl axum::serve::Listener for Listener {
    type Io = Conn;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Conn, SocketAddr) {
        let (io, addr) = axum::serve::Listener::accept(&mut self.inner).await;
        // A response's headers and body go out as two writes; with Nagle the body waits for
        // the client's delayed ACK (40 ms a request on keep-alive connections).
        let _ = io.set_nodelay(true);
        (
            Conn {
                io,
                idle: self.idle,
                deadline: Box::pin(tokio::time::sleep(self.idle)),
                armed: false,
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

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, Listener>> for Remote {
    fn connect_info(stream: axum::serve::IncomingStream<'_, Listener>) -> Remote {
        Remote(*stream.remote_addr())
    }
}

/// A connection that fails its next read or write once nothing has moved on it for `idle`.
pub struct Conn {
    io: TcpStream,
    idle: Duration,
    /// When the connection counts as stalled, if nothing moves before; armed by the first
    /// read or write that has to wait after bytes last moved.
    deadline: Pin<Box<Sleep>>,
    armed: bool,
}

impl Conn {
    /// Bytes moved: the wait starts again from the next read or write that has to wait.
    fn moved(&mut self) {
        self.armed = false;
    }

    /// A read or write has to wait: whether the connection has waited too long already (the
    /// deadline's timer wakes the connection when it passes).
    fn stalled(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.armed {
            self.deadline.as_mut().reset(Instant::now() + self.idle);
            self.armed = true;
        }
        self.deadline.as_mut().poll(cx).is_ready()
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
                if moved {
                    self.moved();
                }
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
