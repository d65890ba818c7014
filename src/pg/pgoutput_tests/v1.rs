//! Protocol version 1 as PostgreSQL 15 sends it, from the captured fixtures
//! (`tests/fixtures/pgoutput/v1_text.hex`, `v1_binary.hex`): transactions and their
//! LSNs, Relation and Type messages, inserts, updates and deletes with every column
//! kind, Truncate and Origin, and binary columns. The version the relay streams with;
//! the other files test what later versions add and what must be refused.

use super::*;

#[test]
fn fixtures_cover_every_message_type() {
    let tags: BTreeSet<u8> = ALL_FIXTURES
        .iter()
        .flat_map(|(_, text)| parse_fixture(text))
        .map(|c| c.tag)
        .collect();
    let expected: BTreeSet<u8> = b"BCORYIUDTMSEcAbPKrp".iter().copied().collect();
    assert_eq!(tags, expected);
}

#[test]
fn v1_transactions_are_consistent() {
    let decoded = decode_fixture(V1_TEXT);
    let mut open: Option<(Lsn, PgTimestamp, u32)> = None;
    let mut last_end = Lsn::ZERO;
    let mut commits = 0;
    for (captured, state, message) in &decoded {
        assert_eq!(*state, StreamState::Outside);
        match message {
            PgOutputMessage::Begin {
                final_lsn,
                commit_ts,
                xid,
            } => {
                assert!(open.is_none(), "line {}: nested Begin", captured.line);
                assert_eq!(*xid, captured.xid);
                // The peek's lsn column for Begin is the first change of the transaction.
                assert!(captured.lsn < *final_lsn);
                open = Some((*final_lsn, *commit_ts, *xid));
            }
            PgOutputMessage::Commit {
                flags,
                commit_lsn,
                end_lsn,
                commit_ts,
            } => {
                let (final_lsn, begin_ts, xid) = open.take().expect("Commit without Begin");
                assert_eq!(*flags, 0);
                assert_eq!(*commit_lsn, final_lsn, "Begin announces the commit LSN");
                assert_eq!(*commit_ts, begin_ts);
                assert!(end_lsn > commit_lsn, "end_lsn is past the commit record");
                assert_eq!(*end_lsn, captured.lsn, "the slot position of a Commit");
                assert!(*end_lsn > last_end, "commits arrive in LSN order");
                assert!(commit_ts.unix_millis() > 1_700_000_000_000);
                assert_eq!(captured.xid, xid);
                last_end = *end_lsn;
                commits += 1;
            }
            PgOutputMessage::Message { flags: 0, .. } => {
                assert!(
                    open.is_none(),
                    "a non-transactional message is outside Begin/Commit"
                );
                assert_eq!(captured.xid, 0);
            }
            other => {
                let (_, _, xid) = open.unwrap_or_else(|| panic!("{other:?} outside a transaction"));
                assert_eq!(captured.xid, xid, "line {}", captured.line);
            }
        }
    }
    assert!(open.is_none());
    assert_eq!(commits, 15);
}

#[test]
fn v1_relation_and_type_messages() {
    let messages = messages(V1_TEXT);
    let relations = relations(&messages);
    let mood_oid = messages
        .iter()
        .find_map(|m| match m {
            PgOutputMessage::Type {
                xid,
                type_oid,
                namespace,
                name,
            } => {
                assert_eq!(
                    (xid, namespace.as_str(), name.as_str()),
                    (&None, "public", "mood")
                );
                Some(*type_oid)
            }
            _ => None,
        })
        .expect("a Type message for the enum");
    assert!(
        mood_oid >= 16384,
        "user types have OIDs from FirstNormalObjectId"
    );

    let outbox = &relations["outbox"];
    assert_eq!(outbox.xid, None);
    assert_eq!(outbox.namespace, "app");
    assert_eq!(outbox.replica_identity, b'd');
    assert_eq!(
        column_summary(outbox),
        [
            ("id", INT8_OID, -1, true),
            ("aggregatetype", VARCHAR_OID, 64 + 4, false),
            ("aggregateid", TEXT_OID, -1, false),
            ("payload", JSONB_OID, -1, false),
            ("big", TEXT_OID, -1, false),
            ("mood", mood_oid, -1, false),
        ]
    );
    let full_row = &relations["full_row"];
    assert_eq!(full_row.replica_identity, b'f');
    assert_eq!(
        column_summary(full_row),
        [("id", INT4_OID, -1, true), ("note", TEXT_OID, -1, true)],
        "with REPLICA IDENTITY FULL every column is part of the key"
    );
    let by_index = &relations["by_index"];
    assert_eq!(by_index.replica_identity, b'i');
    let keys: Vec<bool> = by_index.columns.iter().map(|c| c.is_key).collect();
    assert_eq!(keys, [false, true, false]);
    let nothing = &relations["nothing"];
    assert_eq!(nothing.replica_identity, b'n');
    assert!(nothing.columns.iter().all(|c| !c.is_key));
    assert_eq!(relations["trunc_child"].columns[1].name, "parent_id");
    let ids: BTreeSet<u32> = relations.values().map(|r| r.relation_id).collect();
    assert_eq!(ids.len(), relations.len(), "relation ids are distinct");
}

#[test]
fn v1_inserts_updates_deletes_in_text() {
    let messages = messages(V1_TEXT);
    let relations = relations(&messages);
    let id = |name: &str| relations[name].relation_id;
    let (outbox, full_row, by_index, nothing) =
        (id("outbox"), id("full_row"), id("by_index"), id("nothing"));

    let inserts: Vec<(u32, &TupleData)> = messages
        .iter()
        .filter_map(|m| match m {
            PgOutputMessage::Insert {
                xid: None,
                relation_id,
                new_tuple,
            } => Some((*relation_id, new_tuple)),
            _ => None,
        })
        .collect();
    assert_eq!(inserts.len(), 8);
    assert_eq!(
        inserts[0],
        (
            outbox,
            &tuple(vec![
                text("1"),
                text("order"),
                text("ö-42 ✓ 日本"),
                text(r#"{"total": 12.5}"#),
                ColumnValue::Null,
                text("happy"),
            ])
        )
    );
    // The TOASTed value is sent in full on insert: 128 md5 hex digests.
    let ColumnValue::Text(big) = &inserts[1].1.columns[4] else {
        panic!("big column: {:?}", inserts[1].1.columns[4])
    };
    assert_eq!(big.len(), 128 * 32);
    assert!(big.iter().all(u8::is_ascii_hexdigit));
    let rest: Vec<(u32, TupleData)> = inserts[2..]
        .iter()
        .map(|(id, t)| (*id, (*t).clone()))
        .collect();
    assert_eq!(
        rest,
        [
            (full_row, tuple(vec![text("1"), text("first")])),
            (full_row, tuple(vec![text("2"), ColumnValue::Null])),
            (by_index, tuple(vec![text("1"), text("code-1"), text("n")])),
            (nothing, tuple(vec![text("1"), text("nothing")])),
            (nothing, tuple(vec![text("2"), text("with message")])),
            (nothing, tuple(vec![text("3"), text("from upstream")])),
        ]
    );

    let updates: Vec<&PgOutputMessage> = messages
        .iter()
        .filter(|m| matches!(m, PgOutputMessage::Update { .. }))
        .collect();
    let update = |xid, relation_id, old_tuple, new_tuple| PgOutputMessage::Update {
        xid,
        relation_id,
        old_tuple,
        new_tuple,
    };
    let null = || ColumnValue::Null;
    let outbox_row = |id: &str| {
        tuple(vec![
            text(id),
            text("order"),
            text("a-2-updated"),
            null(),
            ColumnValue::UnchangedToast,
            text("ok"),
        ])
    };
    assert_eq!(
        updates,
        [
            // Key unchanged: no old tuple; the TOASTed column is not sent: 'u'.
            &update(None, outbox, None, outbox_row("2")),
            // Key changed: the old key columns only, 'K'.
            &update(
                None,
                outbox,
                Some(OldTuple::Key(tuple(vec![
                    text("2"),
                    null(),
                    null(),
                    null(),
                    null(),
                    null()
                ]))),
                outbox_row("3"),
            ),
            // REPLICA IDENTITY FULL: the whole old row, 'O'.
            &update(
                None,
                full_row,
                Some(OldTuple::Old(tuple(vec![text("1"), text("first")]))),
                tuple(vec![text("1"), text("second")]),
            ),
            // REPLICA IDENTITY USING INDEX: the index column only.
            &update(
                None,
                by_index,
                Some(OldTuple::Key(tuple(vec![null(), text("code-1"), null()]))),
                tuple(vec![text("1"), text("code-2"), text("n")]),
            ),
        ]
    );

    let deletes: Vec<&PgOutputMessage> = messages
        .iter()
        .filter(|m| matches!(m, PgOutputMessage::Delete { .. }))
        .collect();
    assert_eq!(
        deletes,
        [
            &PgOutputMessage::Delete {
                xid: None,
                relation_id: outbox,
                old_tuple: OldTuple::Key(tuple(vec![
                    text("1"),
                    null(),
                    null(),
                    null(),
                    null(),
                    null()
                ])),
            },
            &PgOutputMessage::Delete {
                xid: None,
                relation_id: full_row,
                old_tuple: OldTuple::Old(tuple(vec![text("2"), null()])),
            },
        ]
    );
}

#[test]
fn v1_truncate_message_and_origin() {
    let decoded = decode_fixture(V1_TEXT);
    let messages: Vec<PgOutputMessage> = decoded.iter().map(|(_, _, m)| m.clone()).collect();
    let relations = relations(&messages);
    let id = |name: &str| relations[name].relation_id;

    let truncates: Vec<&PgOutputMessage> = messages
        .iter()
        .filter(|m| matches!(m, PgOutputMessage::Truncate { .. }))
        .collect();
    assert_eq!(
        truncates,
        [
            &PgOutputMessage::Truncate {
                xid: None,
                options: 1 | 2, // CASCADE | RESTART IDENTITY
                relation_ids: vec![id("trunc_parent"), id("trunc_child")],
            },
            &PgOutputMessage::Truncate {
                xid: None,
                options: 0,
                relation_ids: vec![id("full_row")],
            },
        ]
    );

    let logical_messages: Vec<(&Captured, &PgOutputMessage)> = decoded
        .iter()
        .filter(|(_, _, m)| matches!(m, PgOutputMessage::Message { .. }))
        .map(|(c, _, m)| (c, m))
        .collect();
    let [(transactional_line, transactional), (plain_line, plain)] = logical_messages[..] else {
        panic!("expected two messages: {logical_messages:?}")
    };
    assert_eq!(
        transactional,
        &PgOutputMessage::Message {
            xid: None,
            flags: 1,
            lsn: transactional_line.lsn,
            prefix: "outbox".into(),
            content: Bytes::from("hello ✓"),
        }
    );
    assert_eq!(
        plain,
        &PgOutputMessage::Message {
            xid: None,
            flags: 0,
            lsn: plain_line.lsn,
            prefix: "outbox".into(),
            content: Bytes::from_static(&[0x00, 0xff]),
        }
    );

    // Begin, then Origin with the upstream commit LSN given to pg_replication_origin_xact_setup.
    let origin_at = messages
        .iter()
        .position(|m| matches!(m, PgOutputMessage::Origin { .. }))
        .expect("an Origin message");
    assert_eq!(
        messages[origin_at],
        PgOutputMessage::Origin {
            commit_lsn: Lsn(0x1234_5678),
            name: "upstream".into(),
        }
    );
    let PgOutputMessage::Begin { commit_ts, .. } = messages[origin_at - 1] else {
        panic!("Origin follows Begin: {:?}", messages[origin_at - 1])
    };
    // The origin's commit timestamp, 2024-01-02 03:04:05 UTC, replaces the local one.
    assert_eq!(commit_ts.unix_millis(), 1_704_164_645_000);
    assert_eq!(
        commit_ts,
        PgTimestamp((1_704_164_645 - 946_684_800) * 1_000_000)
    );
}

#[test]
fn v1_binary_columns() {
    let text_messages = messages(V1_TEXT);
    let binary_messages = messages(V1_BINARY);
    assert_eq!(text_messages.len(), binary_messages.len());
    // Everything but the column values is the same as in text mode.
    for (t, b) in text_messages.iter().zip(&binary_messages) {
        match (t, b) {
            (PgOutputMessage::Insert { .. }, PgOutputMessage::Insert { .. })
            | (PgOutputMessage::Update { .. }, PgOutputMessage::Update { .. })
            | (PgOutputMessage::Delete { .. }, PgOutputMessage::Delete { .. }) => {}
            (PgOutputMessage::Begin { xid: x, .. }, PgOutputMessage::Begin { xid: y, .. }) => {
                assert_eq!(x, y)
            }
            _ => assert_eq!(t, b),
        }
    }
    let inserts: Vec<&TupleData> = binary_messages
        .iter()
        .filter_map(|m| match m {
            PgOutputMessage::Insert { new_tuple, .. } => Some(new_tuple),
            _ => None,
        })
        .collect();
    let mut jsonb = vec![1u8]; // jsonb binary format version
    jsonb.extend_from_slice(br#"{"total": 12.5}"#);
    assert_eq!(
        inserts[0],
        &tuple(vec![
            binary(&1i64.to_be_bytes()),
            binary(b"order"),
            binary("ö-42 ✓ 日本".as_bytes()),
            binary(&jsonb),
            ColumnValue::Null,
            binary(b"happy"),
        ])
    );
    assert_eq!(
        inserts[2],
        &tuple(vec![binary(&1i32.to_be_bytes()), binary(b"first")])
    );
    let first_update = binary_messages
        .iter()
        .find_map(|m| match m {
            PgOutputMessage::Update { new_tuple, .. } => Some(new_tuple),
            _ => None,
        })
        .expect("an Update");
    // Unchanged TOAST stays 'u' in binary mode too.
    assert_eq!(first_update.columns[4], ColumnValue::UnchangedToast);
    assert_eq!(first_update.columns[3], ColumnValue::Null);
}
