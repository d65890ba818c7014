//! A partition's log as the broker wrote it, batch by batch, read straight from its
//! segment files: what a failure message needs when a `read_committed` consumer sees
//! fewer records than the log holds (which producer wrote what, in which transaction
//! state, and where the commit and abort markers are).
//!
//! Only record batches of format v2 (magic 2, every Kafka since 0.11) are read; the
//! batch header is fixed-size (Kafka's protocol guide, "Record Batch"):
//!
//! ```text
//! baseOffset i64 | batchLength i32 | partitionLeaderEpoch i32 | magic i8 | crc u32
//! attributes i16 | lastOffsetDelta i32 | baseTimestamp i64 | maxTimestamp i64
//! producerId i64 | producerEpoch i16 | baseSequence i32 | records count i32 | records…
//! ```
//!
//! Attributes bit 4 is "transactional", bit 5 "control". A control batch holds one
//! uncompressed record whose key is `version i16, type i16` (0 abort, 1 commit).

use std::fmt;
use std::path::Path;

/// One record batch's header (and, for a control batch, its marker).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    pub base_offset: i64,
    pub last_offset: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub records: i32,
    pub transactional: bool,
    /// `Some(true)` commit marker, `Some(false)` abort marker, `None` data.
    pub marker: Option<bool>,
}

impl fmt::Display for Batch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match (self.marker, self.transactional) {
            (Some(true), _) => "COMMIT",
            (Some(false), _) => "ABORT",
            (None, true) => "txn data",
            (None, false) => "data",
        };
        write!(
            f,
            "{}..={} {kind} pid {} epoch {} seq {} ({} records)",
            self.base_offset,
            self.last_offset,
            self.producer_id,
            self.producer_epoch,
            self.base_sequence,
            self.records
        )
    }
}

const HEADER: usize = 61;
const TRANSACTIONAL: i16 = 0x10;
const CONTROL: i16 = 0x20;

/// Every batch of `dir` (one partition's directory, `<topic>-<partition>`), in offset
/// order over its `.log` segments. A torn tail (a batch cut short) ends the segment.
pub fn partition_batches(dir: &Path) -> std::io::Result<Vec<Batch>> {
    let mut segments: Vec<_> = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "log"))
        .collect();
    segments.sort();
    let mut batches = Vec::new();
    for segment in segments {
        batches.extend(parse_segment(&std::fs::read(segment)?));
    }
    Ok(batches)
}

/// The batches of one segment file's bytes.
pub fn parse_segment(bytes: &[u8]) -> Vec<Batch> {
    let mut batches = Vec::new();
    let mut at = 0usize;
    while let Some(header) = bytes.get(at..at + HEADER) {
        let length = i32::from_be_bytes(header[8..12].try_into().expect("4 bytes"));
        let Ok(length) = usize::try_from(length) else {
            break;
        };
        // batchLength counts from partitionLeaderEpoch (offset 12) to the batch's end.
        let end = at + 12 + length;
        if end > bytes.len() || length < HEADER - 12 || header[16] != 2 {
            break;
        }
        let be_i64 = |from: usize| i64::from_be_bytes(header[from..from + 8].try_into().unwrap());
        let be_i32 = |from: usize| i32::from_be_bytes(header[from..from + 4].try_into().unwrap());
        let be_i16 = |from: usize| i16::from_be_bytes(header[from..from + 2].try_into().unwrap());
        let base_offset = be_i64(0);
        let attributes = be_i16(21);
        let marker = if attributes & CONTROL != 0 {
            control_type(&bytes[at + HEADER..end])
        } else {
            None
        };
        batches.push(Batch {
            base_offset,
            last_offset: base_offset + i64::from(be_i32(23)),
            producer_id: be_i64(43),
            producer_epoch: be_i16(51),
            base_sequence: be_i32(53),
            records: be_i32(57),
            transactional: attributes & TRANSACTIONAL != 0,
            marker,
        });
        at = end;
    }
    batches
}

/// A control record's type (`Some(true)` commit, `Some(false)` abort) from the batch's
/// records: length, attributes i8, timestampDelta, offsetDelta, keyLength (varints),
/// then the key `version i16, type i16`.
fn control_type(records: &[u8]) -> Option<bool> {
    let mut at = 0;
    varint(records, &mut at)?;
    at += 1;
    for _ in 0..3 {
        varint(records, &mut at)?;
    }
    let kind = records.get(at + 2..at + 4)?;
    match i16::from_be_bytes([kind[0], kind[1]]) {
        0 => Some(false),
        1 => Some(true),
        _ => None,
    }
}

/// A zig-zag varint at `*at`, advancing past it.
fn varint(bytes: &[u8], at: &mut usize) -> Option<i64> {
    let mut value: u64 = 0;
    for shift in (0..64).step_by(7) {
        let byte = *bytes.get(*at)?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            let signed = (value >> 1) as i64 ^ -((value & 1) as i64);
            return Some(signed);
        }
    }
    None
}

/// A short account of `batches` for a failure message: each producer (id, epoch) with
/// its data batches and markers in order, and what is left open at the log's end.
pub fn summarize(batches: &[Batch]) -> String {
    let mut out = String::new();
    let mut open: std::collections::BTreeMap<i64, i64> = Default::default();
    for batch in batches {
        match batch.marker {
            Some(_) => {
                open.remove(&batch.producer_id);
            }
            None if batch.transactional => {
                open.entry(batch.producer_id).or_insert(batch.base_offset);
            }
            None => {}
        }
    }
    let last = batches.last().map_or(-1, |b| b.last_offset);
    out.push_str(&format!(
        "{} batches, offsets up to {last}; transactions open at the end (pid: first offset): {open:?}\n",
        batches.len()
    ));
    // Markers and the batches around them tell the story; data batches between two
    // markers of one producer are folded into one line.
    let mut run: Option<(i64, i64, i64, i16, i32)> = None;
    let flush = |out: &mut String, run: &mut Option<(i64, i64, i64, i16, i32)>| {
        if let Some((first, last, pid, epoch, records)) = run.take() {
            out.push_str(&format!(
                "  {first}..={last} txn data pid {pid} epoch {epoch} ({records} records)\n"
            ));
        }
    };
    for batch in batches {
        let joins = batch.marker.is_none()
            && batch.transactional
            && run.is_some_and(|(_, _, pid, epoch, _)| {
                pid == batch.producer_id && epoch == batch.producer_epoch
            });
        if joins {
            if let Some(run) = run.as_mut() {
                run.1 = batch.last_offset;
                run.4 += batch.records;
            }
            continue;
        }
        flush(&mut out, &mut run);
        if batch.marker.is_none() && batch.transactional {
            run = Some((
                batch.base_offset,
                batch.last_offset,
                batch.producer_id,
                batch.producer_epoch,
                batch.records,
            ));
        } else {
            out.push_str(&format!("  {batch}\n"));
        }
    }
    flush(&mut out, &mut run);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch_bytes(base: i64, attributes: i16, count: i32, records: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend(base.to_be_bytes());
        let length = i32::try_from(HEADER - 12 + records.len()).unwrap();
        out.extend(length.to_be_bytes());
        out.extend(0i32.to_be_bytes()); // leader epoch
        out.push(2); // magic
        out.extend(0u32.to_be_bytes()); // crc (not checked)
        out.extend(attributes.to_be_bytes());
        out.extend((count - 1).to_be_bytes());
        out.extend(0i64.to_be_bytes());
        out.extend(0i64.to_be_bytes());
        out.extend(7i64.to_be_bytes()); // producer id
        out.extend(3i16.to_be_bytes()); // epoch
        out.extend(0i32.to_be_bytes()); // base sequence
        out.extend(count.to_be_bytes());
        out.extend(records);
        out
    }

    /// A control record: length, attributes, timestampDelta 0, offsetDelta 0, keyLength
    /// 4 (zig-zag 8), key `version 0, type`.
    fn control_record(kind: i16) -> Vec<u8> {
        let mut body = vec![0u8, 0, 0, 8, 0, 0];
        body.extend(kind.to_be_bytes());
        let mut record = vec![u8::try_from(body.len() * 2).unwrap()];
        record.extend(body);
        record
    }

    #[test]
    fn batches_and_markers_are_read_and_a_torn_tail_is_left_out() {
        let mut log = batch_bytes(0, TRANSACTIONAL, 3, &[0u8; 10]);
        log.extend(batch_bytes(
            3,
            TRANSACTIONAL | CONTROL,
            1,
            &control_record(1),
        ));
        log.extend(batch_bytes(4, TRANSACTIONAL, 2, &[0u8; 4]));
        log.extend(batch_bytes(
            6,
            TRANSACTIONAL | CONTROL,
            1,
            &control_record(0),
        ));
        log.extend(batch_bytes(7, TRANSACTIONAL, 1, &[0u8; 4]));
        let torn = batch_bytes(8, 0, 1, &[0u8; 20]);
        log.extend(&torn[..30]);
        let batches = parse_segment(&log);
        let kinds: Vec<_> = batches.iter().map(|b| (b.base_offset, b.marker)).collect();
        assert_eq!(
            kinds,
            [
                (0, None),
                (3, Some(true)),
                (4, None),
                (6, Some(false)),
                (7, None)
            ]
        );
        assert_eq!(batches[0].last_offset, 2);
        assert_eq!((batches[0].producer_id, batches[0].producer_epoch), (7, 3));
        let summary = summarize(&batches);
        assert!(summary.contains("{7: 7}"), "{summary}");
        assert!(summary.contains("3..=3 COMMIT"), "{summary}");
        assert!(summary.contains("6..=6 ABORT"), "{summary}");
    }
}
