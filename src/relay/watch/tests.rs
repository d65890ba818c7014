//! The watch's comparisons, on readings written by hand.

use super::watched::{first_reading_change, Watched};
use super::*;
use crate::pg::publication::PublicationIdentity;

fn identity(table_oid: u32, membership: &str) -> PublicationIdentity {
    PublicationIdentity {
        table_oid: Some(table_oid),
        publication_oid: Some(500),
        publishes_insert: true,
        via_root: false,
        all_tables: false,
        membership: membership.into(),
        published: true,
    }
}

fn outbox(name: &str, oid: u32) -> OutboxRelation {
    OutboxRelation {
        table: QualifiedName::parse(name).unwrap(),
        oid,
        partitioned: false,
    }
}

#[test]
fn a_change_to_any_outbox_is_reported_with_that_table() {
    let outboxes = vec![outbox("a.outbox", 10), outbox("b.outbox", 20)];
    let reading = Watched::new("p".into(), outboxes.clone(), Vec::new());
    let baseline = vec![identity(10, "1"), identity(20, "2")];
    assert_eq!(reading.change(&baseline, &baseline), None);
    // b's table left the publication: b is named, not a.
    let mut now = baseline.clone();
    now[1].published = false;
    now[1].membership.clear();
    assert_eq!(
        reading.change(&baseline, &now),
        Some((
            PublicationChange::TableLeftPublication,
            Some(QualifiedName::parse("b.outbox").unwrap())
        ))
    );
    // b's name now belongs to another table.
    let mut now = baseline.clone();
    now[1].table_oid = Some(21);
    assert!(matches!(
        reading.change(&baseline, &now),
        Some((PublicationChange::TableReplaced { was: 20, now: 21 }, Some(ref t))) if t.to_string() == "b.outbox"
    ));
    assert_eq!(first_reading_change(&outboxes, &baseline), None);
    assert_eq!(
        first_reading_change(&outboxes, &now),
        Some((
            PublicationChange::TableReplaced { was: 20, now: 21 },
            Some(QualifiedName::parse("b.outbox").unwrap())
        ))
    );
    // The publication dropped between the preparation and the first reading: said as
    // such (with its repair), not as a table that changed.
    let mut now = baseline.clone();
    for identity in &mut now {
        identity.publication_oid = None;
        identity.published = false;
    }
    assert_eq!(
        first_reading_change(&outboxes, &now).map(|(change, _)| change),
        Some(PublicationChange::PublicationDropped)
    );
}

#[test]
fn without_outbox_tables_only_the_publication_counts() {
    let reading = Watched::new("p".into(), Vec::new(), Vec::new());
    let baseline = vec![identity(0, "")];
    let mut now = baseline.clone();
    now[0].published = false;
    assert_eq!(reading.change(&baseline, &now), None);
    now[0].publication_oid = None;
    assert_eq!(
        reading.change(&baseline, &now),
        Some((PublicationChange::PublicationDropped, None))
    );
}
