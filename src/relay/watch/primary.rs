//! Decoding on a standby: where the watch writes. A standby is read-only, so the relay's
//! record and a pattern's new table in the publication are written on the primary
//! (which the standby replays: the same table, the same publication); once the standby
//! is promoted, on itself, since the old primary may live on apart. The watch asks its
//! own server before every write whether it is still in recovery.

use crate::pg::conn::{PgConnection, PgError, SessionKind};
use crate::pg::url::ConnectParams;

/// The primary's connection, opened at the first write it takes.
pub(super) struct PrimarySide {
    /// `None`: the relay decodes on the primary itself.
    params: Option<ConnectParams>,
    conn: Option<PgConnection>,
}

impl PrimarySide {
    pub(super) fn new(params: Option<ConnectParams>) -> Self {
        PrimarySide { params, conn: None }
    }

    /// The connection a write must go through: the primary's while `local` (the
    /// server the relay decodes on) is in recovery, `None` for `local` itself.
    pub(super) async fn for_writes(
        &mut self,
        local: &mut PgConnection,
    ) -> Result<Option<&mut PgConnection>, PgError> {
        let Some(params) = &self.params else {
            return Ok(None);
        };
        let found = local
            .simple_query("SELECT pg_catalog.pg_is_in_recovery() AS recovery")
            .await?;
        if found.get(0, "recovery") != Some("t") {
            return Ok(None);
        }
        if self.conn.is_none() {
            self.conn = Some(PgConnection::connect(params, SessionKind::Sql).await?);
        }
        Ok(self.conn.as_mut())
    }
}
