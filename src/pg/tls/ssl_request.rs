//! The SSLRequest exchange that comes before TLS: the request, the one-byte answer,
//! and the decision on it ([`parse_ssl_response`], pure), which refuses any byte after
//! the answer (CVE-2021-23222). Apart from the TLS configuration and the handshake
//! because it happens in plaintext, before either, and is where a server that is not
//! PostgreSQL shows itself.

use std::io;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::TlsError;

/// The server's answer to SSLRequest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslResponse {
    /// 'S': go on with the TLS handshake.
    Accepted,
    /// 'N': the server does not do TLS; the session goes on in plaintext.
    Refused,
    /// 'E': an ErrorResponse (e.g. the server could not start a session); the bytes
    /// are its start, to be read as the session's error as libpq does.
    Error,
}

/// Decides on everything the server sent in reply to SSLRequest (pure). Anything after
/// the one response byte is refused: after 'S' it would be taken as if it came over
/// TLS (CVE-2021-23222); after 'N' the server must wait for our startup message.
pub fn parse_ssl_response(received: &[u8]) -> Result<SslResponse, TlsError> {
    match received {
        [b'S'] => Ok(SslResponse::Accepted),
        [b'S', ..] => Err(TlsError::UnencryptedDataAfterResponse),
        [b'N'] => Ok(SslResponse::Refused),
        [b'N', ..] => Err(TlsError::BadSslResponse {
            detail: format!(
                "{} more bytes after 'N', before our startup message",
                received.len() - 1
            ),
        }),
        [b'E', ..] => Ok(SslResponse::Error),
        [byte, ..] => Err(TlsError::BadSslResponse {
            detail: format!("byte 0x{byte:02x}, expected 'S' or 'N'"),
        }),
        [] => Err(TlsError::BadSslResponse {
            detail: "no response".into(),
        }),
    }
}

/// Sends SSLRequest and reads the answer. `Ok(None)` when the server closed the
/// connection instead of answering.
pub async fn request_ssl(tcp: &mut TcpStream) -> io::Result<Option<Vec<u8>>> {
    let mut request = bytes::BytesMut::with_capacity(8);
    postgres_protocol::message::frontend::ssl_request(&mut request);
    tcp.write_all(&request).await?;
    // One read: a well-behaved server sends exactly one byte and then waits for us. More
    // bytes in the same read are what CVE-2021-23222 is about.
    let mut answer = [0u8; 64];
    let n = tcp.read(&mut answer).await?;
    Ok((n > 0).then(|| answer.get(..n).unwrap_or_default().to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ssl_response_is_one_byte_and_nothing_after_it() {
        assert_eq!(parse_ssl_response(b"S").unwrap(), SslResponse::Accepted);
        assert_eq!(parse_ssl_response(b"N").unwrap(), SslResponse::Refused);
        assert_eq!(
            parse_ssl_response(b"E\0\0\0\x10SFATAL").unwrap(),
            SslResponse::Error
        );
        for injected in [&b"SR\0\0\0\x08\0\0\0\0"[..], b"SS"] {
            let err = parse_ssl_response(injected).unwrap_err().to_string();
            assert!(err.contains("CVE-2021-23222"), "{err}");
        }
        let err = parse_ssl_response(b"NZ").unwrap_err().to_string();
        assert!(err.contains("1 more bytes after 'N'"), "{err}");
        let err = parse_ssl_response(b"HTTP/1.1").unwrap_err().to_string();
        assert!(err.contains("0x48"), "{err}");
    }
}
