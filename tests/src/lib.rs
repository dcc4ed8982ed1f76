//! Shared helpers of cairn's integration tests. The tests themselves live in `tests/tests/`;
//! helper processes (a WAL appender to kill with SIGKILL) in `src/bin/`.

use bytes::Bytes;

/// The payload the crash-test child writes for entry `index`: derived from the index, so the
/// parent can check every byte after recovery without sharing state.
pub fn crash_payload(index: u64) -> Bytes {
    let len = 16 + (index.wrapping_mul(2_654_435_761) % 700) as usize;
    (0..len)
        .map(|i| (index as usize).wrapping_mul(31).wrapping_add(i) as u8)
        .collect()
}
