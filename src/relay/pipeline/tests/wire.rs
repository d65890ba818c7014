//! The pgoutput messages of the scripted stream (protocol version 1): the outbox's
//! Relation message and one Insert per row, as PostgreSQL sends them.

use bytes::{BufMut, Bytes, BytesMut};

/// The outbox table's relation id in the scripted stream.
pub(super) const OUTBOX_OID: u32 = 16_384;

/// One outbox row as the test writes it.
#[derive(Debug, Clone)]
pub(super) struct Row {
    id: Option<String>,
    payload: String,
}

impl Row {
    /// A well-formed event with id `id` and a small JSON payload.
    pub(super) fn event(id: &str) -> Row {
        Row {
            id: Some(id.to_owned()),
            payload: format!(r#"{{"event":"{id}"}}"#),
        }
    }

    /// A well-formed event whose payload is about `bytes` long.
    pub(super) fn sized(id: &str, bytes: usize) -> Row {
        Row {
            id: Some(id.to_owned()),
            payload: format!(r#"{{"pad":"{}"}}"#, "x".repeat(bytes)),
        }
    }

    /// A row the router refuses: its event id is NULL.
    pub(super) fn without_id() -> Row {
        Row {
            id: None,
            payload: "{}".to_owned(),
        }
    }
}

/// The outbox's Relation message: Debezium's columns, all text but the JSON payload.
pub(super) fn relation_message() -> Bytes {
    let mut message = BytesMut::new();
    message.put_u8(b'R');
    message.put_u32(OUTBOX_OID);
    put_cstr(&mut message, "public");
    put_cstr(&mut message, "outbox");
    message.put_u8(b'd');
    let columns: [(&str, u32); 5] = [
        ("id", 25),
        ("aggregatetype", 25),
        ("aggregateid", 25),
        ("type", 25),
        ("payload", 3802),
    ];
    message.put_i16(5);
    for (name, type_oid) in columns {
        message.put_u8(u8::from(name == "id"));
        put_cstr(&mut message, name);
        message.put_u32(type_oid);
        message.put_i32(-1);
    }
    message.freeze()
}

pub(super) fn insert_message(row: &Row) -> Bytes {
    let mut message = BytesMut::new();
    message.put_u8(b'I');
    message.put_u32(OUTBOX_OID);
    message.put_u8(b'N');
    let values = [
        row.id.as_deref(),
        Some("order"),
        Some("order-1"),
        Some("created"),
        Some(row.payload.as_str()),
    ];
    message.put_i16(5);
    for value in values {
        match value {
            None => message.put_u8(b'n'),
            Some(text) => {
                message.put_u8(b't');
                message.put_i32(i32::try_from(text.len()).expect("a test value fits"));
                message.put_slice(text.as_bytes());
            }
        }
    }
    message.freeze()
}

fn put_cstr(message: &mut BytesMut, text: &str) {
    message.put_slice(text.as_bytes());
    message.put_u8(0);
}
