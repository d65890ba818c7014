//! The byte stream of a PostgreSQL session: plain TCP, or TLS over it.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// The byte stream of a session: plain TCP, or TLS over it.
pub enum PgStream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl PgStream {
    pub fn is_tls(&self) -> bool {
        matches!(self, PgStream::Tls(_))
    }
}

impl AsyncRead for PgStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            PgStream::Plain(tcp) => Pin::new(tcp).poll_read(cx, buf),
            PgStream::Tls(tls) => Pin::new(tls.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for PgStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            PgStream::Plain(tcp) => Pin::new(tcp).poll_write(cx, buf),
            PgStream::Tls(tls) => Pin::new(tls.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            PgStream::Plain(tcp) => Pin::new(tcp).poll_flush(cx),
            PgStream::Tls(tls) => Pin::new(tls.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            PgStream::Plain(tcp) => Pin::new(tcp).poll_shutdown(cx),
            PgStream::Tls(tls) => Pin::new(tls.as_mut()).poll_shutdown(cx),
        }
    }
}
