//! `outbox-relay init`: the set-up script for the configured outbox, publication and
//! state table ([`super::init_sql`], pure), printed, or applied in one transaction as
//! a role that may create roles, tables and publications.

use std::time::Duration;

use crate::pg::conn::{PgConnection, SessionKind};
use crate::pg::url::ConnectParams;
use crate::relay::settings::Settings;
use crate::relay::RelayError;

use super::definite;
use super::init_sql::{setup_sql, InitSpec};

/// The set-up script for `settings`' outbox, publication and state table.
pub fn init_script(
    settings: &Settings,
    partitioned: bool,
    relay_role: &str,
    app_role: &str,
) -> String {
    setup_sql(&InitSpec {
        tables: settings.tables(),
        state_table: settings.state_table.clone(),
        publication: settings.postgres.publication.clone(),
        partitioned,
        relay_role: relay_role.to_owned(),
        app_role: app_role.to_owned(),
        messages: settings.messages.is_some(),
        patterns: settings
            .patterns()
            .iter()
            .map(ToString::to_string)
            .collect(),
    })
}

/// Runs the set-up script as the user of `admin` (a role that may create roles,
/// tables and publications), in one transaction.
pub async fn apply_script(admin: &ConnectParams, script: &str) -> Result<(), RelayError> {
    let mut conn = PgConnection::connect(admin, SessionKind::Sql).await?;
    let applied = conn
        .simple_query(&format!("BEGIN;\n{script}\nCOMMIT;"))
        .await;
    if let Err(error) = applied {
        let _ = conn.simple_query("ROLLBACK").await;
        return Err(definite(format!(
            "applying the set-up SQL as {:?} failed, nothing was changed: {error} (apply it as a role that may create roles, tables and publications, e.g. --admin-url postgres://postgres@host/db)",
            admin.user
        )));
    }
    conn.close(Duration::from_secs(1)).await;
    Ok(())
}
