//! Shared helpers of cairn's integration tests. The tests themselves live in `tests/tests/`;
//! helper processes (a WAL appender and an engine writer to kill with SIGKILL) in `src/bin/`.

pub mod engine_crash;

use bytes::Bytes;
use cairn_wal::{Config, Record};

/// The payload the crash-test child writes for entry `index`: derived from the index, so the
/// parent can check every byte after recovery without sharing state.
pub fn crash_payload(index: u64) -> Bytes {
    let len = 16 + (index.wrapping_mul(2_654_435_761) % 700) as usize;
    (0..len)
        .map(|i| (index as usize).wrapping_mul(31).wrapping_add(i) as u8)
        .collect()
}

/// The configuration of the crash-test log: 64 KiB segments (about 170 entries of
/// [`crash_payload`]), so rotation, and a kill in the middle of one, happen often.
pub fn crash_config() -> Config {
    Config {
        segment_size: 64 << 10,
        ..Config::default()
    }
}

/// The entries a replay of the crash-test log holds: `first..=last`, or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CrashLog {
    pub first: Option<u64>,
    pub last: Option<u64>,
}

/// Checks a replay of the crash-test log and returns the range of its entries.
///
/// The crash-test log holds nothing but entries, so every record must be one, its index must
/// follow the previous one, and its payload must be [`crash_payload`] of its index. A replay
/// error (corruption, or a torn tail in strict mode) fails the check too. The error describes
/// the first problem found.
pub fn check_crash_log(records: impl IntoIterator<Item = cairn_wal::Result<Record>>) -> Result<CrashLog, String> {
    let mut log = CrashLog {
        first: None,
        last: None,
    };
    for record in records {
        let record = record.map_err(|e| format!("replay failed after entry {:?}: {e}", log.last))?;
        let Record::Entry { index, payload } = record else {
            return Err(format!("after entry {:?}: unexpected record {record:?}", log.last));
        };
        let index = index.get();
        if let Some(last) = log.last {
            if index != last + 1 {
                return Err(format!("entry {index} follows entry {last}"));
            }
        }
        if payload != crash_payload(index) {
            return Err(format!("entry {index} has a wrong payload of {} bytes", payload.len()));
        }
        log.first = log.first.or(Some(index));
        log.last = Some(index);
    }
    Ok(log)
}

/// The records of the committed WAL fixtures (`tests/fixtures/wal/`), shared by their generator
/// and their test.
pub mod fixtures {
    use bytes::Bytes;
    use cairn_wal::{LogIndex, Record};

    /// Entry `index`, with payload `entry-<index>`.
    pub fn entry(index: u64) -> Record {
        Record::Entry {
            index: LogIndex(index),
            payload: Bytes::from(format!("entry-{index}")),
        }
    }

    /// A state record holding `text`.
    pub fn state(text: &'static str) -> Record {
        Record::State(Bytes::from_static(text.as_bytes()))
    }
}
