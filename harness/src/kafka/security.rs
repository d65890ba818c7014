//! TLS and SASL for the test broker ([`KafkaBroker::start_secured`]): a throwaway CA and a
//! broker certificate for `127.0.0.1`, made with the `openssl` CLI; SCRAM users written
//! into the metadata log when the storage is formatted; two client listeners next to the
//! plain one.
//!
//! ```text
//! PLAINTEXT  127.0.0.1:port           test helpers (create, consume), readiness; also
//!                                     the inter-broker listener
//! CONTROLLER 127.0.0.1:controller     plain: only the client listeners are secured
//! SSL        127.0.0.1:ssl_port       TLS, server certificate signed by `ca.pem`
//! SASL_SSL   127.0.0.1:sasl_ssl_port  TLS + SCRAM-SHA-256, SCRAM-SHA-512 or PLAIN
//! ```
//!
//! The broker's key and certificate are a PEM keystore (`ssl.keystore.type=PEM`), so no
//! `keytool` run and no JKS file. SCRAM credentials need no running broker with KRaft:
//! `kafka-storage format --add-scram 'SCRAM-SHA-256=[name=…,password=…]'` (Kafka's
//! `StorageTool`, checked against 4.4) writes them into the bootstrap metadata. PLAIN users
//! are listed in the listener's JAAS line. No authorizer: every authenticated user may do
//! everything, so these tests are about authentication and TLS, not ACLs.
//!
//! [`KafkaBroker::start_secured`]: super::KafkaBroker::start_secured

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The one SASL user: SCRAM-SHA-256, SCRAM-SHA-512 and PLAIN all know it.
pub const SASL_USER: &str = "outbox-relay";
/// Its password (the same for every mechanism). Distinctive, so a test can look for it
/// in the relay's output.
pub const SASL_PASSWORD: &str = "Rel4y-Secret-Zq9";
/// SCRAM iterations at format time (Kafka's minimum is 4096).
const SCRAM_ITERATIONS: u32 = 4096;
/// Days the generated certificates are valid; a test run takes minutes.
const CERT_DAYS: &str = "2";

/// The certificates a secured broker was started with, as PEM files.
#[derive(Debug, Clone)]
pub struct BrokerTls {
    dir: PathBuf,
}

impl BrokerTls {
    /// The CA that signed the broker's certificate: a client's `ssl.ca.location`.
    pub fn ca_pem(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// Another CA, which signed nothing the broker presents: a client trusting only it
    /// must refuse the broker.
    pub fn untrusted_ca_pem(&self) -> PathBuf {
        self.dir.join("other-ca.pem")
    }

    /// The broker's keystore: its private key, then its certificate.
    fn keystore_pem(&self) -> PathBuf {
        self.dir.join("broker-keystore.pem")
    }
}

/// Ports and certificates of a secured broker's client listeners.
#[derive(Debug)]
pub(super) struct SecureListeners {
    pub(super) tls: BrokerTls,
    pub(super) ssl_port: u16,
    pub(super) sasl_ssl_port: u16,
}

impl SecureListeners {
    /// Makes the certificates in `dir/tls`; the ports are picked by the broker.
    pub(super) fn generate(dir: &Path) -> Self {
        let tls_dir = dir.join("tls");
        std::fs::create_dir_all(&tls_dir).expect("creating the broker's tls dir");
        let tls = BrokerTls { dir: tls_dir };
        make_certificates(&tls);
        SecureListeners {
            tls,
            ssl_port: 0,
            sasl_ssl_port: 0,
        }
    }

    /// Entries for `listeners` (and `advertised.listeners`: the same addresses).
    pub(super) fn listeners(&self) -> String {
        format!(
            "SSL://127.0.0.1:{},SASL_SSL://127.0.0.1:{}",
            self.ssl_port, self.sasl_ssl_port
        )
    }

    /// Lines of `server.properties` after the listener lines: TLS for both listeners,
    /// the SASL mechanisms of the SASL_SSL one.
    pub(super) fn server_properties(&self) -> String {
        let scram = "org.apache.kafka.common.security.scram.ScramLoginModule required;";
        format!(
            "# TLS on the SSL and SASL_SSL listeners (harness/src/kafka/security.rs).\n\
             ssl.keystore.type=PEM\n\
             ssl.keystore.location={keystore}\n\
             ssl.client.auth=none\n\
             listener.name.sasl_ssl.sasl.enabled.mechanisms=SCRAM-SHA-256,SCRAM-SHA-512,PLAIN\n\
             listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config={scram}\n\
             listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config={scram}\n\
             listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_{SASL_USER}=\"{SASL_PASSWORD}\";\n",
            keystore = self.tls.keystore_pem().display(),
        )
    }

    /// `--add-scram` arguments of the storage tool: the SCRAM user, for both hashes.
    pub(super) fn format_args() -> Vec<String> {
        ["SCRAM-SHA-256", "SCRAM-SHA-512"]
            .iter()
            .flat_map(|mechanism| {
                [
                    "--add-scram".to_owned(),
                    format!(
                        "{mechanism}=[name={SASL_USER},password={SASL_PASSWORD},iterations={SCRAM_ITERATIONS}]"
                    ),
                ]
            })
            .collect()
    }
}

/// A CA, the broker's key and certificate (`subjectAltName` 127.0.0.1 and localhost, so
/// librdkafka's default host name check passes), and a second, unrelated CA. EC P-256
/// keys: generated in milliseconds, and Kafka's PEM keystore reads them.
fn make_certificates(tls: &BrokerTls) {
    let dir = &tls.dir;
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let ca_extensions = [
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ];
    for (name, subject) in [
        ("ca", "/CN=outbox-relay test CA"),
        ("other-ca", "/CN=outbox-relay untrusted test CA"),
    ] {
        openssl(
            dir,
            &[
                &["req", "-x509", "-days", CERT_DAYS, "-subj", subject][..],
                &ec,
                &ca_extensions,
                &[
                    "-keyout",
                    &format!("{name}.key"),
                    "-out",
                    &format!("{name}.pem"),
                ],
            ]
            .concat(),
        );
    }
    openssl(
        dir,
        &[
            &["req", "-subj", "/CN=127.0.0.1"][..],
            &ec,
            &["-keyout", "broker.key", "-out", "broker.csr"],
        ]
        .concat(),
    );
    std::fs::write(
        dir.join("broker.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n\
         extendedKeyUsage=serverAuth\n\
         keyUsage=critical,digitalSignature,keyEncipherment\n",
    )
    .expect("writing broker.ext");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "broker.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            CERT_DAYS,
            "-extfile",
            "broker.ext",
            "-out",
            "broker.crt",
        ],
    );
    let read = |name: &str| {
        std::fs::read_to_string(dir.join(name)).unwrap_or_else(|e| panic!("reading {name}: {e}"))
    };
    // Kafka's PEM keystore: the (unencrypted PKCS#8) key, then the chain.
    let keystore = format!("{}{}", read("broker.key"), read("broker.crt"));
    assert!(
        keystore.contains("BEGIN PRIVATE KEY"),
        "openssl wrote the broker key in a form Kafka's PEM keystore does not read"
    );
    std::fs::write(tls.keystore_pem(), keystore).expect("writing the broker keystore");
}

/// Runs `openssl ARGS` in `dir`; panics with its output when it fails.
fn openssl(dir: &Path, args: &[&str]) {
    let output = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|err| {
            panic!(
                "running openssl {args:?}: {err}; the secured Kafka broker needs the openssl \
                 CLI (Debian package openssl; ./deploy/dev-deps.sh installs it)"
            )
        });
    assert!(
        output.status.success(),
        "openssl {args:?} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
