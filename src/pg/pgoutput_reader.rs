//! The cursor the pgoutput decoder reads one message with: every length and count read
//! off the wire is untrusted, so each read is bounds-checked and says what was expected
//! and where (offsets count from the message's tag byte).

use bytes::Bytes;

use crate::pg::pgoutput_values::{ColumnValue, DecodeError, PgTimestamp, StreamState, TupleData};
use crate::pg::Lsn;

/// Cursor over one message. `pos` is an offset into the whole message, tag included, so
/// error offsets point at the byte a reader of a hex dump would look at.
pub(crate) struct Reader<'a> {
    pub(crate) buf: &'a [u8],
    /// The same bytes, for column values sliced out without a copy.
    pub(crate) bytes: &'a Bytes,
    pub(crate) pos: usize,
    pub(crate) message: &'static str,
}

impl<'a> Reader<'a> {
    pub(crate) fn rest(&self) -> &'a [u8] {
        self.buf.get(self.pos..).unwrap_or_default()
    }

    pub(crate) fn remaining(&self) -> usize {
        self.rest().len()
    }

    pub(crate) fn truncated(&self, needed: usize) -> DecodeError {
        DecodeError::Truncated {
            message: self.message,
            offset: self.pos,
            needed,
        }
    }

    pub(crate) fn invalid(&self, reason: String) -> DecodeError {
        self.invalid_at(self.pos, reason)
    }

    pub(crate) fn invalid_at(&self, offset: usize, reason: String) -> DecodeError {
        DecodeError::Invalid {
            message: self.message,
            offset,
            reason,
        }
    }

    pub(crate) fn take(&mut self, len: usize) -> Result<&'a [u8], DecodeError> {
        let rest = self.rest();
        let bytes = rest
            .get(..len)
            .ok_or_else(|| self.truncated(len - rest.len()))?;
        self.pos += len;
        Ok(bytes)
    }

    pub(crate) fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let rest = self.rest();
        let (bytes, _) = rest
            .split_first_chunk::<N>()
            .ok_or_else(|| self.truncated(N - rest.len()))?;
        self.pos += N;
        Ok(*bytes)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(u8::from_be_bytes(self.array()?))
    }

    pub(crate) fn i32(&mut self) -> Result<i32, DecodeError> {
        Ok(i32::from_be_bytes(self.array()?))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    pub(crate) fn lsn(&mut self) -> Result<Lsn, DecodeError> {
        Ok(Lsn(u64::from_be_bytes(self.array()?)))
    }

    pub(crate) fn timestamp(&mut self) -> Result<PgTimestamp, DecodeError> {
        Ok(PgTimestamp(i64::from_be_bytes(self.array()?)))
    }

    /// The extra leading xid of data messages sent inside a stream.
    pub(crate) fn stream_xid(&mut self, stream: StreamState) -> Result<Option<u32>, DecodeError> {
        match stream {
            StreamState::Outside => Ok(None),
            StreamState::InsideStream => self.u32().map(Some),
        }
    }

    /// An Int16 count that must not be negative.
    pub(crate) fn count_i16(&mut self, what: &str) -> Result<usize, DecodeError> {
        let offset = self.pos;
        let value = i16::from_be_bytes(self.array()?);
        usize::try_from(value)
            .map_err(|_| self.invalid_at(offset, format!("negative {what} {value}")))
    }

    /// An Int32 count or length that must not be negative.
    pub(crate) fn count_i32(&mut self, what: &str) -> Result<usize, DecodeError> {
        let offset = self.pos;
        let value = self.i32()?;
        usize::try_from(value)
            .map_err(|_| self.invalid_at(offset, format!("negative {what} {value}")))
    }

    /// A NUL-terminated UTF-8 string.
    pub(crate) fn string(&mut self) -> Result<String, DecodeError> {
        let rest = self.rest();
        let len = rest
            .iter()
            .position(|&b| b == 0)
            .ok_or_else(|| self.truncated(1))?;
        let offset = self.pos;
        let bytes = self.take(len)?;
        self.pos += 1; // the NUL found above
        match std::str::from_utf8(bytes) {
            Ok(text) => Ok(text.to_owned()),
            Err(err) => Err(self.invalid_at(offset, format!("string is not UTF-8: {err}"))),
        }
    }

    /// A one-byte marker or flag that must be one of `allowed`.
    pub(crate) fn marker(&mut self, allowed: &[u8], expected: &str) -> Result<u8, DecodeError> {
        let offset = self.pos;
        match self.u8()? {
            found if allowed.contains(&found) => Ok(found),
            found => {
                Err(self.invalid_at(offset, format!("found {found:#04x}, expected {expected}")))
            }
        }
    }

    /// TupleData: Int16 column count, then per column a kind byte and, for `t` and `b`,
    /// an Int32 length and the value.
    pub(crate) fn tuple(&mut self) -> Result<TupleData, DecodeError> {
        let count = self.count_i16("column count")?;
        // Every column takes at least its kind byte.
        let mut columns = Vec::with_capacity(count.min(self.remaining()));
        for _ in 0..count {
            let value = match self.marker(b"nutb", "column kind 'n', 'u', 't' or 'b'")? {
                b'n' => ColumnValue::Null,
                b'u' => ColumnValue::UnchangedToast,
                b't' => ColumnValue::Text(self.column_bytes()?),
                _ => ColumnValue::Binary(self.column_bytes()?),
            };
            columns.push(value);
        }
        Ok(TupleData { columns })
    }

    pub(crate) fn column_bytes(&mut self) -> Result<Bytes, DecodeError> {
        let len = self.count_i32("column length")?;
        self.take_bytes(len)
    }

    /// The next `len` bytes as a slice of the message (no copy).
    pub(crate) fn take_bytes(&mut self, len: usize) -> Result<Bytes, DecodeError> {
        let start = self.pos;
        self.take(len)?;
        Ok(self.bytes.slice(start..start + len))
    }

    /// The message must end exactly here.
    pub(crate) fn finish(self) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            extra => Err(self.invalid(format!("{extra} trailing bytes after the message"))),
        }
    }
}
