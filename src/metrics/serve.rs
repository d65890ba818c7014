//! The HTTP endpoint: `GET /metrics` (the text exposition), `/healthz`, `/readyz` and
//! `/streamingz` (each 200 or 503 with a one-line reason), 404 for anything else. Apart
//! because it is the metrics module's only network I/O (the registry and the rendering
//! work on values); a request is read once, with a timeout, and answered with
//! `connection: close`.

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::{unix_ms_now, Metrics};

/// Serve `GET /metrics`, `GET /healthz` and `GET /readyz` on `listener` until the task
/// is dropped. Anything else gets 404.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            // Out of file descriptors or similar: do not spin.
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            continue;
        };
        let metrics = Arc::clone(&metrics);
        tokio::spawn(async move {
            let mut request = [0u8; 1024];
            let n = match tokio::time::timeout(
                std::time::Duration::from_secs(5),
                stream.read(&mut request),
            )
            .await
            {
                Ok(Ok(n)) => n,
                _ => return,
            };
            let head = String::from_utf8_lossy(&request[..n]);
            let path = head
                .strip_prefix("GET ")
                .and_then(|rest| rest.split([' ', '\r']).next())
                .unwrap_or("");
            let health = || metrics.health_at(unix_ms_now());
            let response = match path {
                "/metrics" => {
                    let body = metrics.render();
                    format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    )
                }
                "/healthz" => status_response(
                    health().alive,
                    "alive\n",
                    "the relay's loop stopped turning\n",
                ),
                "/readyz" => {
                    let health = health();
                    let role = if health.streaming {
                        "streaming\n"
                    } else {
                        "standby\n"
                    };
                    status_response(health.ready, role, NOT_READY)
                }
                "/streamingz" => {
                    let health = health();
                    status_response(
                        health.ready && health.streaming,
                        "streaming\n",
                        if health.ready {
                            "standby: another relay streams from the slot\n"
                        } else {
                            NOT_READY
                        },
                    )
                }
                _ => "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                    .to_owned(),
            };
            let _ = stream.write_all(response.as_bytes()).await;
            let _ = stream.shutdown().await;
        });
    }
}

/// 200 with `ok`, or 503 with `not_ok`.
/// Why `/readyz` answers 503.
const NOT_READY: &str = "not ready: PostgreSQL unreachable (or the slot not yet tried), the loop stopped turning, or the sink has not confirmed deliveries for too long\n";

fn status_response(good: bool, ok: &str, not_ok: &str) -> String {
    let (status, body) = if good {
        ("200 OK", ok)
    } else {
        ("503 Service Unavailable", not_ok)
    };
    format!(
        "HTTP/1.1 {status}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::EVENTS_TOTAL;

    #[tokio::test]
    async fn serves_metrics_over_http_and_404_otherwise() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let metrics = Metrics::new();
        Metrics::add(&metrics.events, 7);
        let server = tokio::spawn(serve(listener, metrics));
        let get = |path: &'static str| async move {
            let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
            stream
                .write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
                .await
                .unwrap();
            let mut response = String::new();
            stream.read_to_string(&mut response).await.unwrap();
            response
        };
        let ok = get("/metrics").await;
        assert!(ok.starts_with("HTTP/1.1 200 OK"), "{ok}");
        assert!(ok.contains(&format!("{EVENTS_TOTAL} 7")), "{ok}");
        assert!(get("/other").await.starts_with("HTTP/1.1 404"));
        assert!(get("/healthz").await.starts_with("HTTP/1.1 200"));
        let not_ready = get("/readyz").await;
        assert!(not_ready.starts_with("HTTP/1.1 503"), "{not_ready}");
        server.abort();
    }
}
