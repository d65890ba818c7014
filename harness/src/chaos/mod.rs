//! Machinery of the chaos test (`tests/chaos.rs`, whose doc explains the design), and the
//! event ids every part shares.
//!
//! ```text
//! size        run size and seed from CHAOS_* variables
//! rng         seeded xorshift64*: fault plan and transaction shapes
//! writers     writer threads, COMMIT outcomes, unknown outcomes classified from the database
//! faults      fault plan, the rig under fault, injection
//! supervisor  the relay, restarted after kill -9 or an exit of its own
//! verify      what the broker holds against what the writers committed
//! ```
//!
//! Event ids encode `(writer, seq)`, so the verifier maps a record back to the writer's
//! log without a lookup table; each writer routes to its own topic.

pub mod faults;
pub mod rng;
pub mod size;
pub mod supervisor;
pub mod verify;
pub mod writers;

/// Event id of writer `writer`'s event number `seq` (the same text PostgreSQL prints).
pub fn event_id(writer: u32, seq: u64) -> String {
    format!("{writer:08x}-0000-4000-8000-{seq:012x}")
}

/// `(writer, seq)` back from an event id written by [`event_id`].
fn parse_event_id(id: &str) -> Option<(u32, u64)> {
    let bytes = id.as_bytes();
    if bytes.len() != 36 || &id[8..24] != "-0000-4000-8000-" {
        return None;
    }
    let writer = u32::from_str_radix(&id[0..8], 16).ok()?;
    let seq = u64::from_str_radix(&id[24..36], 16).ok()?;
    Some((writer, seq))
}

pub fn topic_of(writer: u32) -> String {
    format!("outbox.event.writer{writer}")
}
