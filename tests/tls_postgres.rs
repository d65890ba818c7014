//! TLS to PostgreSQL against real clusters with `ssl=on`, certificates made by the
//! test (harness `TestPki`: a CA, server certificates for chosen names, client
//! certificates, and an unrelated CA), and `hostssl`-only pg_hba.conf lines.
//!
//! Connections are the relay's own ([`PgConnection`]), opened in process with the
//! URL a user would write; whether a session is encrypted is asked of the server
//! (`pg_stat_ssl`), not assumed. The last test runs the relay binary over
//! `sslmode=verify-full` end to end.

use outbox_relay_harness as support;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::time::Duration;

use outbox_relay::pg::conn::{PgConnection, PgError, SessionKind};
use outbox_relay::pg::url::ConnectParams;
use support::outbox::{cluster_with_outbox, event_ids, insert_events, SLOT, WAIT};
use support::tls::TestPki;
use support::{PgCluster, PgOptions, RelayProcess};

/// Users of the hostssl-only clusters and how pg_hba.conf lets them in.
const CERT_USER: &str = "certuser";
const SCRAM_USER: &str = "alice";
const SCRAM_PASSWORD: &str = "s3cret-over-tls";

/// A cluster with `ssl=on`, the server certificate the CA issued for `names`, and only
/// `hostssl` lines for TCP: the superuser by trust, [`SCRAM_USER`] by scram-sha-256,
/// [`CERT_USER`] by client certificate.
fn tls_cluster(pki: &TestPki, label: &str, names: &[&str]) -> PgCluster {
    let server = pki.server_cert(label, names);
    let pg = PgCluster::start_with(PgOptions {
        tls: Some(pki.server_tls(&server)),
        hostssl_only: true,
        hba: vec![
            "hostssl all postgres 127.0.0.1/32 trust".into(),
            format!("hostssl all {SCRAM_USER} 127.0.0.1/32 scram-sha-256"),
            format!("hostssl all {CERT_USER} 127.0.0.1/32 cert"),
        ],
        ..PgOptions::default()
    });
    pg.batch_execute(&format!(
        "SET password_encryption = 'scram-sha-256';
         CREATE ROLE {SCRAM_USER} LOGIN PASSWORD '{SCRAM_PASSWORD}';
         CREATE ROLE {CERT_USER} LOGIN;"
    ));
    pg
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Opens one of the relay's SQL sessions with `url` and says whether it is encrypted
/// (the server's `pg_stat_ssl.ssl`), or returns the connection error as text.
fn connect(url: &str) -> Result<bool, String> {
    let params = ConnectParams::from_url(url).unwrap_or_else(|e| panic!("{url}: {e}"));
    runtime().block_on(async {
        let mut conn = PgConnection::connect(&params, SessionKind::Sql)
            .await
            .map_err(|e: PgError| e.to_string())?;
        let result = conn
            .simple_query("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .await
            .map_err(|e| e.to_string())?;
        conn.close(Duration::from_secs(1)).await;
        Ok(result.get(0, "ssl") == Some("t"))
    })
}

/// `postgres://user@host:port/postgres?query`.
fn url(user: &str, host: &str, port: u16, query: &str) -> String {
    format!("postgres://{user}@{host}:{port}/postgres?{query}")
}

fn path(path: &Path) -> String {
    path.to_str().expect("UTF-8 path").to_owned()
}

#[track_caller]
fn assert_encrypted(url: &str) {
    match connect(url) {
        Ok(true) => {}
        Ok(false) => panic!("{url}: connected, but without TLS"),
        Err(error) => panic!("{url}: {error}"),
    }
}

/// Fails, with an error that mentions every one of `needles`.
#[track_caller]
fn assert_refused(url: &str, needles: &[&str]) -> String {
    match connect(url) {
        Ok(tls) => panic!("{url}: connected (tls: {tls}), expected a failure"),
        Err(error) => {
            for needle in needles {
                assert!(
                    error.contains(needle),
                    "{url}: the error does not mention {needle:?}:\n{error}"
                );
            }
            error
        }
    }
}

/// Every sslmode against a hostssl-only server whose certificate is for 127.0.0.1 and
/// localhost: modes that try TLS get in (allow after its plaintext attempt is
/// refused), disable gets pg_hba.conf's refusal; verification passes with the CA that
/// signed the certificate and fails with another one.
#[test]
fn each_sslmode_against_a_hostssl_only_server() {
    let pki = TestPki::new();
    let pg = tls_cluster(&pki, "local", &["localhost", "127.0.0.1"]);
    let port = pg.port();
    let ca = path(pki.ca_file());
    let other_ca = path(pki.other_ca_file());
    let on = |host: &str, query: &str| url("postgres", host, port, query);

    // disable: no TLS, so no pg_hba.conf line matches (the server says "no encryption",
    // before PostgreSQL 14 "SSL off").
    let error = assert_refused(
        &on("127.0.0.1", "sslmode=disable"),
        &["no pg_hba.conf entry", "pg_hba.conf"],
    );
    assert!(
        error.contains("no encryption") || error.contains("SSL off"),
        "{error}"
    );
    // allow: plaintext first, refused, then TLS.
    assert_encrypted(&on("127.0.0.1", "sslmode=allow"));
    // prefer (also the default): TLS.
    assert_encrypted(&on("127.0.0.1", "sslmode=prefer"));
    assert_encrypted(&on("127.0.0.1", ""));
    // require: TLS without verification, so a CA we do not trust is fine...
    assert_encrypted(&on("127.0.0.1", "sslmode=require"));
    // ...but with sslrootcert it verifies the chain as verify-ca does (libpq).
    assert_encrypted(&on(
        "127.0.0.1",
        &format!("sslmode=require&sslrootcert={ca}"),
    ));
    assert_refused(
        &on(
            "127.0.0.1",
            &format!("sslmode=require&sslrootcert={other_ca}"),
        ),
        &["not trusted", &other_ca, "set sslrootcert"],
    );
    // verify-ca: the right CA passes, another one does not.
    assert_encrypted(&on(
        "127.0.0.1",
        &format!("sslmode=verify-ca&sslrootcert={ca}"),
    ));
    let error = assert_refused(
        &on(
            "127.0.0.1",
            &format!("sslmode=verify-ca&sslrootcert={other_ca}"),
        ),
        &["not trusted", &other_ca, &format!("127.0.0.1:{port}")],
    );
    assert!(
        error.contains("not signed by a CA in sslrootcert"),
        "{error}"
    );
    // verify-full: the chain and each of the certificate's names.
    assert_encrypted(&on(
        "127.0.0.1",
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    ));
    assert_encrypted(&on(
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    ));
    assert_refused(
        &on(
            "localhost",
            &format!("sslmode=verify-full&sslrootcert={other_ca}"),
        ),
        &["not trusted", &other_ca],
    );
    // The operating system's store does not hold the test CA.
    assert_refused(
        &on("localhost", "sslmode=verify-full&sslrootcert=system"),
        &["trust store"],
    );
    // A file that is not there is an error in every mode, never "no verification".
    for mode in ["require", "verify-ca", "verify-full"] {
        assert_refused(
            &on(
                "127.0.0.1",
                &format!("sslmode={mode}&sslrootcert=/nonexistent/ca.pem"),
            ),
            &["cannot read sslrootcert file /nonexistent/ca.pem"],
        );
    }
    // Verification without any root certificate: says which parameter to set (unless
    // this machine has libpq's default file, which would then be used).
    let default_root = std::env::var_os("HOME")
        .map(|home| Path::new(&home).join(".postgresql/root.crt"))
        .filter(|file| file.exists());
    if default_root.is_none() {
        for mode in ["verify-ca", "verify-full"] {
            assert_refused(
                &on("127.0.0.1", &format!("sslmode={mode}")),
                &["no root certificate", "sslrootcert="],
            );
        }
    }
}

/// verify-full checks the name of the host the URL names, per host: a certificate
/// issued for another name fails, with both names in the message; verify-ca (same CA)
/// passes; in a multi-host URL, the server with the wrong name is skipped and the next
/// one, whose certificate names it, is used.
#[test]
fn verify_full_checks_each_hosts_name() {
    let pki = TestPki::new();
    let elsewhere = tls_cluster(&pki, "elsewhere", &["db.example.com"]);
    let local = tls_cluster(&pki, "local", &["localhost", "127.0.0.1"]);
    let ca = path(pki.ca_file());

    let error = assert_refused(
        &url(
            "postgres",
            "127.0.0.1",
            elsewhere.port(),
            &format!("sslmode=verify-full&sslrootcert={ca}"),
        ),
        &["is for db.example.com, not for \"127.0.0.1\"", "verify-ca"],
    );
    assert!(
        error.contains(&format!("127.0.0.1:{}", elsewhere.port())),
        "{error}"
    );
    assert_refused(
        &url(
            "postgres",
            "localhost",
            elsewhere.port(),
            &format!("sslmode=verify-full&sslrootcert={ca}"),
        ),
        &["db.example.com", "\"localhost\""],
    );
    // The chain is right: verify-ca and require accept it.
    for mode in ["verify-ca", "require"] {
        assert_encrypted(&url(
            "postgres",
            "127.0.0.1",
            elsewhere.port(),
            &format!("sslmode={mode}&sslrootcert={ca}"),
        ));
    }
    // Two hosts: each gets its own handshake and its own name check.
    let multi = format!(
        "postgres://postgres@127.0.0.1:{},localhost:{}/postgres?sslmode=verify-full&sslrootcert={ca}",
        elsewhere.port(),
        local.port()
    );
    let params = ConnectParams::from_url(&multi).unwrap();
    let port = runtime().block_on(async {
        let mut conn = PgConnection::connect(&params, SessionKind::Sql)
            .await
            .unwrap_or_else(|e| panic!("{multi}: {e}"));
        let result = conn.simple_query("SHOW port").await.unwrap();
        result.get(0, "port").map(str::to_owned)
    });
    assert_eq!(
        port,
        Some(local.port().to_string()),
        "connected to the second host"
    );
}

/// A server without TLS (ssl=off, the harness default): prefer and allow go on in
/// plaintext, require and verify-* stop and say that the server does not do TLS.
#[test]
fn prefer_falls_back_to_plaintext_and_require_fails_without_server_ssl() {
    let pki = TestPki::new();
    let pg = PgCluster::start();
    let ca = path(pki.ca_file());
    for query in ["sslmode=prefer", "", "sslmode=allow", "sslmode=disable"] {
        assert_eq!(
            connect(&url("postgres", "127.0.0.1", pg.port(), query)),
            Ok(false),
            "{query}: plaintext"
        );
    }
    for query in [
        "sslmode=require".to_owned(),
        format!("sslmode=verify-ca&sslrootcert={ca}"),
        format!("sslmode=verify-full&sslrootcert={ca}"),
    ] {
        let mode = query
            .split('&')
            .next()
            .unwrap()
            .trim_start_matches("sslmode=");
        assert_refused(
            &url("postgres", "127.0.0.1", pg.port(), &query),
            &[
                "does not accept TLS",
                &format!("sslmode={mode} requires it"),
                "ssl=on",
            ],
        );
    }
}

/// Authentication over TLS: a client certificate for pg_hba's `cert` method (its CN is
/// the user), refused without one or with another user's; SCRAM-SHA-256 over TLS
/// without channel binding (the client's gs2 flag is 'n', which the server accepts).
#[test]
fn client_certificates_and_scram_over_tls() {
    let pki = TestPki::new();
    let pg = tls_cluster(&pki, "local", &["localhost", "127.0.0.1"]);
    let ca = path(pki.ca_file());
    let mine = pki.client_cert(CERT_USER);
    let theirs = pki.client_cert("mallory");
    let cert_url = |query: &str| {
        url(
            CERT_USER,
            "localhost",
            pg.port(),
            &format!("sslmode=verify-full&sslrootcert={ca}{query}"),
        )
    };

    assert_encrypted(&cert_url(&format!(
        "&sslcert={}&sslkey={}",
        path(&mine.cert),
        path(&mine.key)
    )));
    // The server saw our certificate.
    let params = ConnectParams::from_url(&cert_url(&format!(
        "&sslcert={}&sslkey={}",
        path(&mine.cert),
        path(&mine.key)
    )))
    .unwrap();
    let client_dn = runtime().block_on(async {
        let mut conn = PgConnection::connect(&params, SessionKind::Sql)
            .await
            .unwrap();
        let result = conn
            .simple_query("SELECT client_dn FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .await
            .unwrap();
        result.get(0, "client_dn").map(str::to_owned)
    });
    assert_eq!(client_dn.as_deref(), Some(&*format!("/CN={CERT_USER}")));

    // No certificate: the server says one is required.
    assert_refused(&cert_url(""), &["certificate", CERT_USER]);
    // Someone else's certificate: CN mallory is not certuser.
    assert_refused(
        &cert_url(&format!(
            "&sslcert={}&sslkey={}",
            path(&theirs.cert),
            path(&theirs.key)
        )),
        &["certificate authentication failed", CERT_USER],
    );
    // A certificate with a key that is not its own.
    assert_refused(
        &cert_url(&format!(
            "&sslcert={}&sslkey={}",
            path(&mine.cert),
            path(&theirs.key)
        )),
        &["do not fit together"],
    );
    // A certificate without its key file.
    assert_refused(
        &cert_url(&format!(
            "&sslcert={}&sslkey=/nonexistent/client.key",
            path(&mine.cert)
        )),
        &["not private key file /nonexistent/client.key"],
    );

    // SCRAM over TLS (no channel binding), and a wrong password.
    assert_encrypted(&format!(
        "postgres://{SCRAM_USER}:{SCRAM_PASSWORD}@localhost:{}/postgres?sslmode=verify-full&sslrootcert={ca}",
        pg.port()
    ));
    let error = assert_refused(
        &format!(
            "postgres://{SCRAM_USER}:wrong-password@localhost:{}/postgres?sslmode=require",
            pg.port()
        ),
        &["password authentication failed", SCRAM_USER],
    );
    assert!(
        !error.contains("wrong-password"),
        "the password is not printed: {error}"
    );
}

/// CVE-2021-23222: a "server" that answers SSLRequest with 'S' followed by bytes of
/// its own (a man in the middle injecting plaintext before the handshake). The bytes
/// are refused, in every mode that tries TLS; prefer does not fall back to plaintext.
#[test]
fn bytes_after_the_ssl_response_are_refused() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let modes = ["prefer", "require", "verify-full&sslrootcert=/nonexistent"];
    let server = std::thread::spawn(move || {
        // verify-full with a missing root certificate never connects.
        for _ in 0..2 {
            let (mut stream, _) = listener.accept().unwrap();
            let mut request = [0u8; 8];
            stream.read_exact(&mut request).unwrap();
            assert_eq!(request, [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f], "SSLRequest");
            // 'S', then an AuthenticationOk the client must not take as over TLS.
            stream.write_all(b"SR\0\0\0\x08\0\0\0\0").unwrap();
            let _ = stream.flush();
        }
    });
    for mode in &modes[..2] {
        assert_refused(
            &url("postgres", "127.0.0.1", port, &format!("sslmode={mode}")),
            &["CVE-2021-23222", &format!("127.0.0.1:{port}")],
        );
    }
    assert_refused(
        &url(
            "postgres",
            "127.0.0.1",
            port,
            &format!("sslmode={}", modes[2]),
        ),
        &["sslrootcert"],
    );
    server.join().unwrap();
}

/// The relay binary, `sslmode=verify-full` against a hostssl-only server: it streams,
/// its walsender's session is encrypted, and the events arrive.
#[test]
fn relay_streams_events_over_verify_full() {
    let pki = TestPki::new();
    let server = pki.server_cert("local", &["localhost", "127.0.0.1"]);
    let pg = cluster_with_outbox(PgOptions {
        tls: Some(pki.server_tls(&server)),
        hostssl_only: true,
        hba: vec!["hostssl all postgres 127.0.0.1/32 trust".into()],
        ..PgOptions::default()
    });
    let url = format!(
        "postgres://postgres@localhost:{}/app?sslmode=verify-full&sslrootcert={}",
        pg.port(),
        path(pki.ca_file())
    );
    let relay = RelayProcess::start(&format!(
        "[postgres]\nurl = \"{url}\"\nslot = \"{SLOT}\"\npublication = \"outbox_relay\"\n\
         status_interval_ms = 200\n\
         [outbox]\ntable = \"public.outbox\"\n[sink]\ntype = \"stdout\"\n"
    ));
    relay.wait_streaming(&pg.socket_conninfo("app"), SLOT, WAIT);
    let walsender_ssl = support::query_lsn(
        &mut pg.client_db("app"),
        &format!(
            "SELECT bool_and(s.ssl)::text FROM pg_stat_ssl s
             JOIN pg_replication_slots r ON r.active_pid = s.pid
             WHERE r.slot_name = '{SLOT}'"
        ),
    );
    assert_eq!(
        walsender_ssl, "true",
        "the replication session is encrypted"
    );
    let expected = insert_events(&pg, "tls", 25);
    let lines = relay.wait_for_lines(expected.len(), WAIT);
    assert_eq!(event_ids(&lines), expected);
}
