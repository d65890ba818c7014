//! PostgreSQL text forms → raw bytes, JSON and Unix time: the router's pure helpers.
//!
//! pgoutput sends every value in its type's text output form, written under the
//! walsender session's settings: bytea as hex (`bytea_output = hex`, the default) and
//! timestamps in the ISO `DateStyle` (the default) are what these helpers read.

use crate::event::{push_base64, push_json_string};
use crate::pg::pgoutput::{ColumnValue, TupleData};

/// PostgreSQL type oids that decide how a value is written.
pub(super) const BOOL_OID: u32 = 16;
pub(super) const BYTEA_OID: u32 = 17;
pub(super) const INT8_OID: u32 = 20;
pub(super) const INT2_OID: u32 = 21;
pub(super) const INT4_OID: u32 = 23;
pub(super) const OID_OID: u32 = 26;
pub(super) const JSON_OID: u32 = 114;
pub(super) const FLOAT4_OID: u32 = 700;
pub(super) const FLOAT8_OID: u32 = 701;
pub(super) const NUMERIC_OID: u32 = 1700;
pub(super) const JSONB_OID: u32 = 3802;

/// How a column value is written into a JSON envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ValueKind {
    /// `json`, `jsonb`: embedded as JSON.
    Json,
    /// `bool`: `true` / `false`.
    Bool,
    /// Integer, floating point and `numeric` types: a JSON number when the text is one
    /// (`NaN` and `Infinity` are not, and become strings).
    Number,
    /// `bytea`: a base64 string, as Kafka Connect's JSON converter writes bytes.
    Bytea,
    /// Everything else: the text form as a JSON string.
    Text,
}

impl ValueKind {
    pub(super) fn of_type(type_oid: u32) -> Self {
        match type_oid {
            JSON_OID | JSONB_OID => ValueKind::Json,
            BOOL_OID => ValueKind::Bool,
            INT2_OID | INT4_OID | INT8_OID | OID_OID | FLOAT4_OID | FLOAT8_OID | NUMERIC_OID => {
                ValueKind::Number
            }
            BYTEA_OID => ValueKind::Bytea,
            _ => ValueKind::Text,
        }
    }
}

/// PostgreSQL's bytea hex output: `\x` followed by two hex digits per byte.
pub(super) fn decode_bytea(text: &[u8]) -> Option<Vec<u8>> {
    let hex = text.strip_prefix(b"\\x")?;
    if hex.len() % 2 != 0 {
        return None;
    }
    fn nibble(digit: u8) -> Option<u8> {
        match digit {
            b'0'..=b'9' => Some(digit - b'0'),
            b'a'..=b'f' => Some(digit - b'a' + 10),
            b'A'..=b'F' => Some(digit - b'A' + 10),
            _ => None,
        }
    }
    hex.chunks_exact(2)
        .map(|pair| Some(nibble(pair[0])? << 4 | nibble(pair[1])?))
        .collect()
}

/// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`: JSON's number grammar.
pub(super) fn is_json_number(text: &str) -> bool {
    fn digits(bytes: &[u8], mut i: usize) -> usize {
        while bytes.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        i
    }
    let bytes = text.as_bytes();
    let mut i = usize::from(bytes.first() == Some(&b'-'));
    match bytes.get(i) {
        Some(b'0') => i += 1,
        Some(b'1'..=b'9') => i = digits(bytes, i + 1),
        _ => return false,
    }
    if bytes.get(i) == Some(&b'.') {
        let end = digits(bytes, i + 1);
        if end == i + 1 {
            return false;
        }
        i = end;
    }
    if matches!(bytes.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(bytes.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        let end = digits(bytes, i);
        if end == i {
            return false;
        }
        i = end;
    }
    i == bytes.len()
}

/// Append one column value (its text form, `None` for NULL) as a JSON value.
/// `Err(())` only for a bytea value that is not in hex format.
pub(super) fn push_json_value(
    out: &mut Vec<u8>,
    kind: ValueKind,
    text: Option<&str>,
) -> Result<(), ()> {
    let Some(text) = text else {
        out.extend_from_slice(b"null");
        return Ok(());
    };
    match kind {
        // PostgreSQL checks json on input and writes jsonb itself: the text is JSON.
        ValueKind::Json => out.extend_from_slice(text.as_bytes()),
        ValueKind::Bool if text == "t" => out.extend_from_slice(b"true"),
        ValueKind::Bool if text == "f" => out.extend_from_slice(b"false"),
        ValueKind::Number if is_json_number(text) => out.extend_from_slice(text.as_bytes()),
        ValueKind::Bytea => {
            let bytes = decode_bytea(text.as_bytes()).ok_or(())?;
            out.push(b'"');
            push_base64(out, &bytes);
            out.push(b'"');
        }
        ValueKind::Bool | ValueKind::Number | ValueKind::Text => push_json_string(out, text),
    }
    Ok(())
}

/// A value cut to at most `max` characters for an error message.
pub(super) fn shorten(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

/// The raw row as a JSON object, `{"column": "text value" | null, ...}`, for dead-letter
/// records of rows that could not be routed. Values are PostgreSQL's text forms (bytes
/// read as UTF-8, lossily); NULL and unchanged TOAST values are `null`. Values beyond
/// the known column names are named `"$<position>"` (1-based), so nothing is lost when
/// the row and the relation disagree.
pub fn row_as_json<N: AsRef<str>>(column_names: &[N], row: &TupleData) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.push(b'{');
    for (i, value) in row.columns.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        match column_names.get(i) {
            Some(name) => push_json_string(&mut out, name.as_ref()),
            None => push_json_string(&mut out, &format!("${}", i + 1)),
        }
        out.push(b':');
        match value {
            ColumnValue::Text(bytes) | ColumnValue::Binary(bytes) => {
                push_json_string(&mut out, &String::from_utf8_lossy(bytes))
            }
            ColumnValue::Null | ColumnValue::UnchangedToast => out.extend_from_slice(b"null"),
        }
    }
    out.push(b'}');
    out
}

/// Parse PostgreSQL's ISO text form of a `timestamptz` or `timestamp` into Unix
/// milliseconds (rounded down): `2026-11-30 06:16:24.123456+00`, `…+05:30`,
/// `…-00:01:15`. A value without an offset (a `timestamp` column) is taken as UTC.
/// `infinity`, `-infinity` and BC dates have no Unix time and are rejected. The error
/// says what is wrong.
pub fn parse_pg_timestamp_ms(text: &str) -> Result<i64, &'static str> {
    if text.ends_with(" BC") {
        return Err("dates BC are not supported");
    }
    if text == "infinity" || text == "-infinity" {
        return Err("infinity has no Unix time");
    }
    let mut cursor = Cursor {
        bytes: text.as_bytes(),
        at: 0,
    };
    const NOT_ISO: &str = "not in ISO format (YYYY-MM-DD HH:MM:SS[.ffffff][+HH[:MM[:SS]]]; the relay needs DateStyle ISO)";
    let year = cursor.number(4, 6).ok_or(NOT_ISO)?;
    cursor.expect(b'-').ok_or(NOT_ISO)?;
    let month = cursor.number(2, 2).ok_or(NOT_ISO)?;
    cursor.expect(b'-').ok_or(NOT_ISO)?;
    let day = cursor.number(2, 2).ok_or(NOT_ISO)?;
    if cursor
        .expect(b' ')
        .or_else(|| cursor.expect(b'T'))
        .is_none()
    {
        return Err(NOT_ISO);
    }
    let hour = cursor.number(2, 2).ok_or(NOT_ISO)?;
    cursor.expect(b':').ok_or(NOT_ISO)?;
    let minute = cursor.number(2, 2).ok_or(NOT_ISO)?;
    cursor.expect(b':').ok_or(NOT_ISO)?;
    let second = cursor.number(2, 2).ok_or(NOT_ISO)?;
    let mut millis = 0;
    if cursor.expect(b'.').is_some() {
        let start = cursor.at;
        let fraction = cursor.number(1, 9).ok_or(NOT_ISO)?;
        let digits = cursor.at - start;
        // Keep the first three digits: milliseconds, rounded down.
        millis = match digits {
            1 => fraction * 100,
            2 => fraction * 10,
            _ => fraction / 10_i64.pow(u32::try_from(digits - 3).unwrap_or(0)),
        };
    }
    let offset_seconds = match cursor.peek() {
        None => 0,
        Some(b'Z') => {
            cursor.at += 1;
            0
        }
        Some(sign @ (b'+' | b'-')) => {
            cursor.at += 1;
            let hours = cursor.number(2, 2).ok_or(NOT_ISO)?;
            let mut minutes = 0;
            let mut seconds = 0;
            if cursor.expect(b':').is_some() {
                minutes = cursor.number(2, 2).ok_or(NOT_ISO)?;
                if cursor.expect(b':').is_some() {
                    seconds = cursor.number(2, 2).ok_or(NOT_ISO)?;
                }
            }
            if hours > 23 || minutes > 59 || seconds > 59 {
                return Err("the time zone offset is out of range");
            }
            let offset = hours * 3600 + minutes * 60 + seconds;
            if sign == b'-' {
                -offset
            } else {
                offset
            }
        }
        Some(_) => return Err(NOT_ISO),
    };
    if cursor.peek().is_some() {
        return Err(NOT_ISO);
    }
    if !(1..=12).contains(&month) || day < 1 || day > days_in_month(year, month) {
        return Err("the date does not exist");
    }
    if hour > 23 || minute > 59 || second > 59 {
        return Err("the time of day is out of range");
    }
    let days = days_from_civil(year, month, day);
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offset_seconds;
    Ok(seconds * 1000 + millis)
}

struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn expect(&mut self, byte: u8) -> Option<()> {
        (self.peek() == Some(byte)).then(|| self.at += 1)
    }

    /// `min..=max` ASCII digits as a number (at most 9 digits, so no overflow).
    fn number(&mut self, min: usize, max: usize) -> Option<i64> {
        let start = self.at;
        let mut value: i64 = 0;
        while self.at - start < max {
            match self.peek() {
                Some(digit @ b'0'..=b'9') => {
                    value = value * 10 + i64::from(digit - b'0');
                    self.at += 1;
                }
                _ => break,
            }
        }
        (self.at - start >= min).then_some(value)
    }
}

fn is_leap_year(year: i64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if is_leap_year(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year.rem_euclid(400);
    let month_from_march = (month + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_in_iso_form() {
        let ok = |text: &str| parse_pg_timestamp_ms(text).unwrap();
        assert_eq!(ok("1970-01-01 00:00:00+00"), 0);
        assert_eq!(ok("2000-01-01 00:00:00+00"), 946_684_800_000);
        // date -u -d '2026-11-30 06:16:24' +%s → 1796019384
        assert_eq!(ok("2026-11-30 06:16:24.123456+00"), 1_796_019_384_123);
        assert_eq!(ok("2026-11-30 06:16:24.123456"), 1_796_019_384_123, "UTC");
        assert_eq!(ok("2026-11-30T06:16:24.123456Z"), 1_796_019_384_123);
        assert_eq!(ok("2026-11-30 11:46:24.123+05:30"), 1_796_019_384_123);
        assert_eq!(ok("2026-11-30 01:16:24.1-05"), 1_796_019_384_100);
        assert_eq!(ok("2026-11-30 06:16:24.12+00"), 1_796_019_384_120);
        assert_eq!(ok("2026-11-30 06:16:24.999999999+00"), 1_796_019_384_999);
        // Local mean time offsets have seconds (Paris LMT was +00:09:21).
        assert_eq!(
            ok("1900-01-01 00:09:21+00:09:21"),
            ok("1900-01-01 00:00:00+00")
        );
        assert_eq!(ok("1900-01-01 00:00:00+00"), -2_208_988_800_000);
        // Before the epoch, milliseconds round down like everything else.
        assert_eq!(ok("1969-12-31 23:59:59.9995+00"), -1);
        assert_eq!(ok("2024-02-29 12:00:00+00"), 1_709_208_000_000);
        assert_eq!(ok("10000-01-01 00:00:00+00"), 253_402_300_800_000);
        assert_eq!(ok("0001-01-01 00:00:00+00"), -62_135_596_800_000);
    }

    #[test]
    fn timestamps_without_unix_time_or_iso_form_are_rejected() {
        for (text, reason) in [
            ("infinity", "infinity"),
            ("-infinity", "infinity"),
            ("0044-03-15 12:00:00+00 BC", "BC"),
            ("Mon Nov 30 06:16:24.123456 2026 UTC", "ISO"),
            ("11/30/2026 06:16:24.123456 UTC", "ISO"),
            ("2026-11-30", "ISO"),
            ("2026-11-30 06:16", "ISO"),
            ("2026-11-30 06:16:24.", "ISO"),
            ("2026-11-30 06:16:24+0", "ISO"),
            ("2026-11-30 06:16:24 +00", "ISO"),
            ("2026-11-30 06:16:24+00x", "ISO"),
            ("2025-02-29 00:00:00+00", "date"),
            ("2026-13-01 00:00:00+00", "date"),
            ("2026-04-31 00:00:00+00", "date"),
            ("2026-11-30 24:00:00+00", "time"),
            ("2026-11-30 23:60:00+00", "time"),
            ("2026-11-30 23:00:00+24", "offset"),
            ("", "ISO"),
        ] {
            let err = parse_pg_timestamp_ms(text).unwrap_err();
            assert!(err.contains(reason), "{text:?}: {err}");
        }
    }

    #[test]
    fn base64_matches_rfc_4648_vectors() {
        for (input, want) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            let mut out = Vec::new();
            push_base64(&mut out, input.as_bytes());
            assert_eq!(out, want.as_bytes(), "{input:?}");
        }
        let mut out = Vec::new();
        push_base64(&mut out, &[0xfb, 0xff, 0xbf]);
        assert_eq!(out, b"+/+/");
    }

    #[test]
    fn json_numbers() {
        for yes in ["0", "-0", "12", "-1.5", "1e+20", "1.5e-07", "3E2", "0.00"] {
            assert!(is_json_number(yes), "{yes}");
        }
        for no in [
            "",
            "-",
            "01",
            "1.",
            ".5",
            "1e",
            "NaN",
            "Infinity",
            "-Infinity",
            " 1",
            "1 ",
        ] {
            assert!(!is_json_number(no), "{no}");
        }
    }

    #[test]
    fn json_values_by_kind() {
        let json = |kind, text: Option<&str>| {
            let mut out = Vec::new();
            push_json_value(&mut out, kind, text).map(|()| String::from_utf8(out).unwrap())
        };
        assert_eq!(json(ValueKind::Text, None).unwrap(), "null");
        assert_eq!(json(ValueKind::Text, Some("a\"b")).unwrap(), r#""a\"b""#);
        assert_eq!(json(ValueKind::Number, Some("-12")).unwrap(), "-12");
        assert_eq!(json(ValueKind::Number, Some("NaN")).unwrap(), r#""NaN""#);
        assert_eq!(json(ValueKind::Bool, Some("t")).unwrap(), "true");
        assert_eq!(json(ValueKind::Bool, Some("f")).unwrap(), "false");
        assert_eq!(
            json(ValueKind::Json, Some(r#"{"a": 1}"#)).unwrap(),
            r#"{"a": 1}"#
        );
        assert_eq!(
            json(ValueKind::Bytea, Some("\\x666f6f")).unwrap(),
            r#""Zm9v""#
        );
        assert!(json(ValueKind::Bytea, Some("foo")).is_err());
        assert_eq!(ValueKind::of_type(INT8_OID), ValueKind::Number);
        assert_eq!(ValueKind::of_type(25), ValueKind::Text);
    }

    #[test]
    fn bytea_hex_decoding() {
        assert_eq!(decode_bytea(b"\\x00fF41"), Some(vec![0, 0xff, 0x41]));
        assert_eq!(decode_bytea(b"\\x"), Some(vec![]));
        for bad in [&b"\\x0"[..], b"\\xzz", b"00", b"\\x+1"] {
            assert_eq!(decode_bytea(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn rows_as_json_objects() {
        let row = TupleData {
            columns: vec![
                ColumnValue::Text(bytes::Bytes::from_static(b"e-1")),
                ColumnValue::Null,
                ColumnValue::UnchangedToast,
                ColumnValue::Text(bytes::Bytes::from_static(&[b'a', 0xff, b'"'])),
                ColumnValue::Text(bytes::Bytes::from_static(b"extra")),
            ],
        };
        let json = row_as_json(&["id", "payload", "big", "bad"], &row);
        assert_eq!(
            String::from_utf8(json).unwrap(),
            r#"{"id":"e-1","payload":null,"big":null,"bad":"a�\"","$5":"extra"}"#
        );
        assert_eq!(
            row_as_json::<&str>(&[], &TupleData { columns: vec![] }),
            b"{}"
        );
    }

    #[test]
    fn shorten_cuts_on_characters() {
        assert_eq!(shorten("äbc", 2), "äb…");
        assert_eq!(shorten("ab", 2), "ab");
    }
}
