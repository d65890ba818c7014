//! The PostgreSQL side's section of the configuration, `[postgres]`: where to connect,
//! which slot and publication to stream from, and the liveness bounds of the
//! replication connection. [`PostgresConfig::check`] turns it into the connection
//! parameters; the composed configuration ([`crate::config`]) keeps the result.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::sql::QualifiedName;
use super::state::DEFAULT_STATE_TABLE;
use super::url::{ConnectParams, Secret};

/// Slot and publication names when none are configured.
pub const DEFAULT_SLOT: &str = "outbox_relay";
pub const DEFAULT_PUBLICATION: &str = "outbox_relay";
/// Upper bound of the status update interval; the actual interval is also kept under a
/// third of the server's `wal_sender_timeout`.
pub const DEFAULT_STATUS_INTERVAL_MS: u64 = 10_000;
/// A streaming relay sends a status update at least this often, whatever its status
/// interval (its heartbeat): a standby takes a longer silence for a frozen host
/// (`crate::relay::takeover`). A status update that moves nothing writes nothing.
pub const HEARTBEAT_MS: u64 = 1_000;
/// `takeover_silence_ms` may not be shorter than this many heartbeats: a standby would
/// end a healthy relay's walsender between two of its status updates.
pub const MIN_TAKEOVER_SILENCE_HEARTBEATS: u64 = 2;
/// `takeover_silence_ms` unset: this many heartbeats (4 s), so a hiccup of a few
/// missed heartbeats (a TCP retransmission, a descheduled process) is no takeover.
pub const DEFAULT_TAKEOVER_SILENCE_HEARTBEATS: u32 = 4;

/// The heartbeat of a relay whose status interval is `status_interval_ms`: the shorter
/// of the two.
pub fn heartbeat_ms(status_interval_ms: u64) -> u64 {
    status_interval_ms.min(HEARTBEAT_MS)
}
/// PostgreSQL's limit on identifiers (NAMEDATALEN - 1), slot names included.
const MAX_SLOT_NAME_BYTES: usize = 63;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostgresConfig {
    /// libpq URI. The password may be in it, or in `password` or `password_file`
    /// (one of the three), or else in the `PGPASSWORD` environment variable.
    pub url: Secret,
    /// The password, when the URL has none (typically set from the environment:
    /// `OUTBOX_RELAY__POSTGRES__PASSWORD`).
    #[serde(default)]
    pub password: Option<Secret>,
    /// A file holding the password (a mounted secret); its trailing newline is not
    /// part of it.
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    #[serde(default = "default_slot")]
    pub slot: String,
    #[serde(default = "default_publication")]
    pub publication: String,
    /// Upper bound of the standby status update interval.
    #[serde(default = "default_status_interval_ms")]
    pub status_interval_ms: u64,
    /// Reconnect when nothing arrives from PostgreSQL for this long although it was
    /// asked to reply; unset = the server's `wal_sender_timeout` (60 s when disabled).
    #[serde(default)]
    pub receive_timeout_ms: Option<u64>,
    /// A standby waiting for the slot ends the streaming relay's walsender once that
    /// relay has sent no status update for this long (its host vanished or froze
    /// without closing the connection); unset = four heartbeats (4 s; a streaming relay
    /// sends one at least every second), 0 = never (PostgreSQL ends it after
    /// `wal_sender_timeout`).
    #[serde(default)]
    pub takeover_silence_ms: Option<u64>,
    /// The table where the relay records its slot (that it streamed from it, and the
    /// last acknowledged position), so a lost slot is never silently replaced. Default:
    /// `outbox_relay_state` in the outbox's schema.
    #[serde(default)]
    pub state_table: Option<String>,
    /// Create the slot as a failover slot (PostgreSQL 17+: synchronised to standbys
    /// with `sync_replication_slots`, so a promoted standby has it). Ignored before 17.
    #[serde(default = "default_true")]
    pub failover_slot: bool,
    /// The primary of the standby `url` names: set, the relay decodes on that standby
    /// (PostgreSQL 16+) instead of waiting for it to be promoted, and uses the primary
    /// for what a server in recovery cannot do (its record, the publication, the
    /// snapshot a slot created on a standby waits for). Without a password of its own,
    /// the relay's password.
    #[serde(default)]
    pub primary_url: Option<Secret>,
}

impl PostgresConfig {
    /// `primary_url` as connection parameters (the password of `main` when it has
    /// none), or its problem.
    pub fn primary(&self, main: &ConnectParams) -> Result<Option<ConnectParams>, String> {
        let Some(url) = &self.primary_url else {
            return Ok(None);
        };
        let mut params = ConnectParams::from_url(url.expose())
            .map_err(|e| format!("postgres.primary_url: {e}"))?;
        if params.password.is_none() {
            params.password = main.password.clone();
        }
        params
            .tls
            .load()
            .map_err(|e| format!("postgres.primary_url: {e}"))?;
        Ok(Some(params))
    }

    /// Check the section against the outbox `table` it streams (the state table's
    /// default schema), the password taken from `PGPASSWORD` (`env_password`) when
    /// neither the URL, `password` nor `password_file` has one; reads `password_file`.
    /// Every problem comes back, each with its key path; none shows a password.
    pub fn check(
        &self,
        tables: Option<&[QualifiedName]>,
        env_password: Option<String>,
    ) -> Result<(ConnectParams, QualifiedName), Vec<String>> {
        let mut problems = Vec::new();
        let connect = match ConnectParams::from_url(self.url.expose()) {
            Ok(mut params) => {
                let mut given = Vec::new();
                if params.password.is_some() {
                    given.push("postgres.url");
                }
                if let Some(password) = &self.password {
                    given.push("postgres.password");
                    params.password = Some(password.clone());
                }
                if let Some(path) = &self.password_file {
                    given.push("postgres.password_file");
                    match read_password_file(path) {
                        Ok(password) => params.password = Some(password),
                        Err(problem) => problems.push(format!("postgres.password_file: {problem}")),
                    }
                }
                if given.len() > 1 {
                    problems.push(format!(
                        "postgres.password: given in {}; keep one",
                        given.join(" and ")
                    ));
                }
                if params.password.is_none() {
                    params.password = env_password.map(Secret::new);
                }
                // The certificate files, read now so a missing one is reported with the
                // config's other problems (and read again at every connection).
                if let Err(e) = params.tls.load() {
                    problems.push(format!("postgres.url: {e}"));
                }
                Some(params)
            }
            Err(e) => {
                problems.push(format!("postgres.url: {e}"));
                None
            }
        };
        for (path, value) in [
            ("postgres.slot", &self.slot),
            ("postgres.publication", &self.publication),
        ] {
            if value.is_empty() {
                problems.push(format!("{path}: must not be empty"));
            }
        }
        // Slot names are restricted by PostgreSQL itself; say so before it does.
        if !self
            .slot
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        {
            problems.push(format!(
                "postgres.slot: {:?} may contain only lower case letters, digits and underscores",
                self.slot
            ));
        }
        if self.slot.len() > MAX_SLOT_NAME_BYTES {
            problems.push(format!(
                "postgres.slot: longer than {MAX_SLOT_NAME_BYTES} bytes"
            ));
        }
        if self.status_interval_ms == 0 {
            problems.push("postgres.status_interval_ms: must be greater than 0".into());
        }
        if self.receive_timeout_ms == Some(0) {
            problems.push("postgres.receive_timeout_ms: must be greater than 0".into());
        }
        if let Some(silence) = self.takeover_silence_ms.filter(|ms| *ms > 0) {
            let beat = heartbeat_ms(self.status_interval_ms);
            let least = beat.saturating_mul(MIN_TAKEOVER_SILENCE_HEARTBEATS);
            if silence < least {
                problems.push(format!(
                    "postgres.takeover_silence_ms: must be 0 (off) or at least {MIN_TAKEOVER_SILENCE_HEARTBEATS} heartbeats ({least} ms): a streaming relay sends a status update every {beat} ms (every second, or every status interval when status_interval_ms is shorter)"
                ));
            }
        }
        // By default beside the (first) outbox table; in `public` when only patterns
        // name the outboxes.
        let state_table = match (&self.state_table, tables) {
            (Some(name), _) => QualifiedName::parse(name)
                .map_err(|e| problems.push(format!("postgres.state_table: {e}")))
                .ok(),
            (None, Some(tables)) => Some(QualifiedName {
                schema: tables
                    .first()
                    .map_or_else(|| "public".to_owned(), |table| table.schema.clone()),
                name: DEFAULT_STATE_TABLE.to_owned(),
            }),
            (None, None) => None,
        };
        if let (Some(state_table), Some(tables)) = (&state_table, tables) {
            if tables.contains(state_table) {
                problems.push(format!(
                    "postgres.state_table: {state_table} is an outbox table; the relay's state table must be a table of its own"
                ));
            }
        }
        match (connect, state_table) {
            (Some(connect), Some(state_table)) if problems.is_empty() => Ok((connect, state_table)),
            _ => Err(problems),
        }
    }
}

/// The content of a password file without its trailing newline; a problem never shows
/// the content.
fn read_password_file(path: &Path) -> Result<Secret, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let password = text.trim_end_matches(['\n', '\r']);
    if password.is_empty() {
        return Err(format!("{} is empty", path.display()));
    }
    Ok(Secret::new(password))
}

fn default_slot() -> String {
    DEFAULT_SLOT.into()
}
fn default_publication() -> String {
    DEFAULT_PUBLICATION.into()
}
fn default_status_interval_ms() -> u64 {
    DEFAULT_STATUS_INTERVAL_MS
}
fn default_true() -> bool {
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_certificate_file_is_a_config_problem() {
        let config: PostgresConfig = toml::from_str(
            "url = \"postgres://u@h/app?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem\"",
        )
        .unwrap();
        let table = QualifiedName::parse("public.outbox").unwrap();
        let problems = config
            .check(Some(std::slice::from_ref(&table)), None)
            .unwrap_err();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0]
                .starts_with("postgres.url: cannot read sslrootcert file /nonexistent/ca.pem"),
            "{problems:?}"
        );
    }

    #[test]
    fn a_takeover_silence_shorter_than_two_heartbeats_is_refused() {
        let table = QualifiedName::parse("public.outbox").unwrap();
        let checked = |extra: &str| {
            let config: PostgresConfig =
                toml::from_str(&format!("url = \"postgres://u@h/app\"\n{extra}")).unwrap();
            config
                .check(Some(std::slice::from_ref(&table)), None)
                .map(drop)
        };
        assert!(checked("").is_ok());
        assert!(checked("takeover_silence_ms = 0").is_ok());
        assert!(checked("takeover_silence_ms = 2000").is_ok());
        let problems = checked("takeover_silence_ms = 1999").unwrap_err();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with("postgres.takeover_silence_ms: must be 0 (off) or at least 2 heartbeats (2000 ms): a streaming relay sends a status update every 1000 ms"),
            "{problems:?}"
        );
        assert!(checked("status_interval_ms = 200\ntakeover_silence_ms = 400").is_ok());
        assert!(checked("status_interval_ms = 200\ntakeover_silence_ms = 399").is_err());
        // A long status interval does not lengthen the heartbeat.
        assert!(checked("status_interval_ms = 30000\ntakeover_silence_ms = 2000").is_ok());
    }
}
