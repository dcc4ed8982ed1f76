//! Tunables of the log, with their defaults.

use crate::error::{Error, Result};
use crate::segment::HEADER_LEN;

/// What `open` does with damage at the end of the last segment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RecoveryMode {
    /// Truncate a torn tail (a crash during the last write), keeping a `.broken` copy of the
    /// segment first. Corruption anywhere else is still an error. The default.
    #[default]
    TolerateTornTail,
    /// Any damage, a torn tail included, is an error; [`crate::repair`] fixes it explicitly.
    Strict,
}

/// Configuration of a [`crate::Wal`].
#[derive(Clone, Debug)]
pub struct Config {
    /// A segment is sealed, and the next one begun, once it holds this many bytes. Each segment
    /// is preallocated to this size ahead of need. Default 64 MiB.
    pub segment_size: u64,
    /// Recovery behaviour for a torn tail. Default [`RecoveryMode::TolerateTornTail`].
    pub recovery: RecoveryMode,
    /// The largest payload one record may carry; larger appends are refused. Default 64 MiB.
    pub max_record_bytes: u64,
    /// Requests that may wait for the writer before `append` blocks (back-pressure). Default 4096.
    pub queue_depth: usize,
    /// Skip the fdatasync after each group of records: appends are acknowledged once written
    /// to the page cache, so a crash of the machine (not of the process) loses them. For
    /// tests and throwaway clusters only (etcd's `--unsafe-no-fsync`). Segment headers are
    /// still synced. Default false.
    pub unsafe_no_fsync: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            segment_size: 64 << 20,
            recovery: RecoveryMode::default(),
            max_record_bytes: 64 << 20,
            queue_depth: 4096,
            unsafe_no_fsync: false,
        }
    }
}

impl Config {
    /// The smallest segment size accepted (tests use tiny segments to exercise rotation).
    pub const MIN_SEGMENT_SIZE: u64 = 512;

    /// Checks every field is in range: `segment_size` at least [`Self::MIN_SEGMENT_SIZE`],
    /// `max_record_bytes` between 1 and `u32::MAX - 64`, `queue_depth` at least 1. Opening a
    /// log calls it; a failure is [`Error::InvalidConfig`].
    pub fn validate(&self) -> Result<()> {
        if self.segment_size < Self::MIN_SEGMENT_SIZE || self.segment_size <= HEADER_LEN as u64 {
            return Err(Error::InvalidConfig("segment_size must be at least 512 bytes"));
        }
        if self.max_record_bytes == 0 || self.max_record_bytes > u64::from(u32::MAX) - 64 {
            return Err(Error::InvalidConfig("max_record_bytes must be between 1 and 4 GiB"));
        }
        if self.queue_depth == 0 {
            return Err(Error::InvalidConfig("queue_depth must be at least 1"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_values_are_refused() {
        Config::default().validate().unwrap();
        let bad = [
            Config {
                segment_size: 100,
                ..Config::default()
            },
            Config {
                max_record_bytes: 0,
                ..Config::default()
            },
            Config {
                max_record_bytes: u64::MAX,
                ..Config::default()
            },
            Config {
                queue_depth: 0,
                ..Config::default()
            },
        ];
        for c in bad {
            assert!(matches!(c.validate(), Err(Error::InvalidConfig(_))), "{c:?}");
        }
    }
}
