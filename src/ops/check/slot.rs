//! Pure: the slot (free slots and WAL senders, the slot itself, its `wal_status` and
//! retained WAL, failover) and the relay's record table ([`crate::pg::state`]), whose
//! record tells a slot never created from one that was lost.

use crate::pg::diagnose::SetupError;
use crate::pg::slot::FAILOVER_SLOTS_SINCE;
use crate::pg::sql::{quote_ident, quote_literal};
use crate::pg::state;

use super::facts::{not_checked, PgFacts, StateFacts, Target};
use super::Finding;

/// Retained WAL above this share of `max_slot_wal_keep_size` is worth a warning.
const RETAINED_WARNING_PERCENT: i64 = 50;

/// The slot's findings, then the record table's.
pub(super) fn findings(facts: &PgFacts, target: &Target<'_>, out: &mut Vec<Finding>) {
    slot(facts, target, out);
    takeover(facts, out);
    state_table(&facts.state, target, out);
}

/// A standby takes the slot over from a silent relay (its host vanished) only if it
/// may see the walsender's `reply_time` (`pg_read_all_stats`) and end it: a walsender
/// of its own role always, another role's with `pg_signal_backend`
/// ([`crate::relay::takeover`]).
fn takeover(facts: &PgFacts, out: &mut Vec<Finding>) {
    const ID: &str = "postgres.takeover";
    let server = &facts.server;
    let ends = if server.signals_backends {
        "of any role but a superuser's"
    } else {
        "of its own role (pg_signal_backend for instances under other roles)"
    };
    out.push(if server.reads_all_stats {
        Finding::ok(
            ID,
            format!(
                "role {:?} may see a silent relay's walsender and end one {ends}: a standby takes over before wal_sender_timeout",
                server.user
            ),
        )
    } else {
        Finding::warning(
            ID,
            format!(
                "role {:?} lacks pg_read_all_stats: a standby relay cannot see that the relay streaming from the slot went silent (its host vanished), and waits for PostgreSQL's wal_sender_timeout instead",
                server.user
            ),
            format!(
                "GRANT pg_read_all_stats TO {} (and pg_signal_backend when the instances use different roles)",
                quote_ident(&server.user)
            ),
        )
    });
}

fn slot(facts: &PgFacts, target: &Target<'_>, out: &mut Vec<Finding>) {
    const ID: &str = "postgres.slot";
    let spec = target.spec;
    let name = &spec.slot;
    let server = &facts.server;
    let slot = match &facts.slot {
        Ok(slot) => slot,
        Err(e) => return out.push(not_checked(ID, e)),
    };
    let free_slots = server
        .max_replication_slots
        .saturating_sub(server.used_replication_slots);
    out.push(if slot.is_some() || free_slots > 0 {
        Finding::ok(
            "postgres.replication_slots",
            format!("{} of max_replication_slots = {} in use{}", server.used_replication_slots, server.max_replication_slots, if slot.is_some() { ", the relay's among them" } else { "; the relay needs one more" }),
        )
    } else {
        Finding::problem(
            "postgres.replication_slots",
            format!("all {} replication slots (max_replication_slots) are in use: the relay cannot create {name:?}", server.max_replication_slots),
            "raise max_replication_slots (restart needed) or drop an unused slot with SELECT pg_drop_replication_slot('name')",
        )
    });
    let active = slot.as_ref().and_then(|s| s.active_pid);
    let free_senders = server
        .max_wal_senders
        .saturating_sub(server.active_wal_senders);
    out.push(if free_senders > 0 || active.is_some() {
        Finding::ok(
            "postgres.wal_senders",
            format!("{} of max_wal_senders = {} in use", server.active_wal_senders, server.max_wal_senders),
        )
    } else {
        Finding::problem(
            "postgres.wal_senders",
            format!("all {} WAL senders (max_wal_senders) are in use: the relay's replication connection would be refused", server.max_wal_senders),
            "raise max_wal_senders (restart needed) or stop an unused replication client",
        )
    });
    let Some(slot) = slot else {
        let record = match &facts.state {
            Ok(StateFacts::Exists { record, .. }) => record.as_ref(),
            _ => None,
        };
        out.push(match record {
            Some(record) if record.streamed() => Finding::problem(
                ID,
                state::lost_slot_message(name, &spec.state_table, record, &target.config_hint),
                format!(
                    "outbox-relay slot create --accept-gap {hint}; then outbox-relay backfill {hint} --since '{}'",
                    record.acknowledged_at.as_deref().or(record.first_streamed_at.as_deref()).unwrap_or("TIME"),
                    hint = target.config_hint
                ),
            ),
            _ => Finding::ok(ID, format!("slot {name:?} does not exist; the relay will create it (pgoutput{}) on its first run", if spec.failover && server.version_num >= FAILOVER_SLOTS_SINCE { ", failover" } else { "" })),
        });
        return;
    };
    let plugin = slot.plugin.as_deref().unwrap_or_default();
    if slot.slot_type != "logical" || plugin != "pgoutput" {
        return out.push(Finding::problem(
            ID,
            format!("slot {name:?} exists but is not a logical pgoutput slot (type {}, plugin {plugin:?})", slot.slot_type),
            format!("choose another [postgres] slot name or drop it with SELECT pg_drop_replication_slot({})", quote_literal(name)),
        ));
    }
    if slot.database.as_deref() != Some(server.database.as_str()) {
        return out.push(Finding::problem(
            ID,
            format!(
                "slot {name:?} belongs to database {:?}, not {:?}",
                slot.database.as_deref().unwrap_or_default(),
                server.database
            ),
            "choose another [postgres] slot name, or point [postgres] url at the slot's database",
        ));
    }
    let wal_status = slot.wal_status.as_deref().unwrap_or("unknown");
    let retained = slot
        .retained_bytes
        .map_or_else(|| "unknown".to_owned(), bytes);
    let limit = server
        .max_slot_wal_keep_size
        .map_or_else(|| "unlimited".to_owned(), bytes);
    let holder = active.map_or_else(String::new, |pid| format!("; streamed from by pid {pid} (a relay already running: another instance waits as a standby)"));
    out.push(match wal_status {
        "lost" => Finding::problem(
            ID,
            SetupError::SlotInvalidated { slot: name.clone(), reason: slot.invalidation_reason.clone() }.to_string(),
            format!("SELECT pg_drop_replication_slot({}); outbox-relay slot create --accept-gap {hint}; outbox-relay backfill {hint} --since TIME", quote_literal(name), hint = target.config_hint),
        ),
        "unreserved" => Finding::warning(
            ID,
            format!("slot {name:?}: wal_status = unreserved, retained WAL {retained} is past max_slot_wal_keep_size = {limit}: the next checkpoint may invalidate it{holder}"),
            "start the relay (or let it catch up) now, or raise max_slot_wal_keep_size",
        ),
        "extended" => Finding::warning(
            ID,
            format!("slot {name:?}: wal_status = extended, it holds WAL beyond max_wal_size (retained {retained}, max_slot_wal_keep_size = {limit}){holder}"),
            "let the relay catch up; see why it lags (a stopped relay, Kafka down, a long transaction)",
        ),
        _ => {
            let near = matches!((slot.retained_bytes, server.max_slot_wal_keep_size), (Some(r), Some(max)) if max > 0 && r.saturating_mul(100) / max >= RETAINED_WARNING_PERCENT);
            let message = format!("slot {name:?} exists (pgoutput, wal_status = {wal_status}, retained WAL {retained} of max_slot_wal_keep_size = {limit}){holder}");
            if near {
                Finding::warning(ID, message, "the slot is past half of max_slot_wal_keep_size: let the relay catch up, or raise the limit")
            } else if active.is_some() {
                Finding::warning(ID, message, "stop the running relay first if this one is meant to take over")
            } else {
                Finding::ok(ID, message)
            }
        }
    });
    if spec.failover && server.version_num >= FAILOVER_SLOTS_SINCE {
        let standbys = server
            .synchronized_standby_slots
            .as_deref()
            .unwrap_or_default()
            .trim()
            .to_owned();
        out.push(if standbys.is_empty() {
            Finding::warning(
                "postgres.failover",
                format!("slot {name:?} is {}a failover slot, but the primary has no synchronized_standby_slots: a failover to a standby could lose the slot or its position", if slot.failover { "" } else { "not yet (the relay makes it one) " }),
                "set synchronized_standby_slots to the standbys' physical slots, and sync_replication_slots = on on the standbys",
            )
        } else {
            Finding::ok("postgres.failover", format!("slot {name:?} is {}a failover slot; synchronized_standby_slots = {standbys}", if slot.failover { "" } else { "made (by the relay) " }))
        });
    }
}

fn state_table(state: &Result<StateFacts, String>, target: &Target<'_>, out: &mut Vec<Finding>) {
    const ID: &str = "postgres.state_table";
    let table = &target.spec.state_table;
    let grant = format!(
        "GRANT SELECT, INSERT, UPDATE ON {} TO the relay's role",
        table.quoted()
    );
    out.push(match state {
        Err(e) => not_checked(ID, e),
        Ok(StateFacts::Exists { may_select, may_insert, may_update, .. }) => {
            let missing: Vec<&str> = [(may_select, "SELECT"), (may_insert, "INSERT"), (may_update, "UPDATE")]
                .iter()
                .filter(|(may, _)| !**may)
                .map(|(_, privilege)| *privilege)
                .collect();
            if missing.is_empty() {
                Finding::ok(ID, format!("the relay's record table {table} exists and the role may use it"))
            } else {
                Finding::problem(ID, format!("the role lacks {} on the relay's record table {table}", missing.join(", ")), grant)
            }
        }
        Ok(StateFacts::Missing { schema_exists: false, .. }) => Finding::problem(
            ID,
            format!("schema {:?} of the relay's record table {table} does not exist", table.schema),
            format!("CREATE SCHEMA {}, or set [postgres] state_table", quote_ident(&table.schema)),
        ),
        Ok(StateFacts::Missing { may_create: true, .. }) => {
            Finding::ok(ID, format!("the relay's record table {table} does not exist; the relay will create it"))
        }
        Ok(StateFacts::Missing { may_create: false, .. }) => Finding::problem(
            ID,
            format!("the relay's record table {table} does not exist and the role may not create it (no CREATE on schema {:?})", table.schema),
            format!("run `{}` and {grant}, or set [postgres] state_table to a table it may create", state::create_table_sql(table)),
        ),
    });
}

/// A byte count as people read it.
fn bytes(n: i64) -> String {
    const UNITS: [&str; 5] = ["bytes", "kB", "MB", "GB", "TB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value.abs() >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} bytes")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}
