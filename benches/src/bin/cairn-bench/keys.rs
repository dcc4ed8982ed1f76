//! Key spaces, and values stamped with their send time.

use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use cairn_benches::Failure;
use rand::rngs::StdRng;
use rand::Rng;

/// A key space: keys `prefix` + a zero-padded number below `space`, `digits` wide.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    pub(crate) prefix: String,
    pub(crate) digits: usize,
    pub(crate) space: u64,
    pub(crate) sequential: bool,
}

impl Keys {
    /// The key space of `space` keys `key_size` bytes long; fails if the prefix and the
    /// number do not fit.
    pub(crate) fn new(prefix: &str, key_size: usize, space: u64, sequential: bool) -> Result<Keys, Failure> {
        let need = digits(space.saturating_sub(1));
        if key_size < prefix.len() + need {
            return Err(Failure(format!(
                "--key-size {key_size} is too small for the prefix `{prefix}` and {need} digits of \
                 {space} keys: take at least {}",
                prefix.len() + need
            )));
        }
        Ok(Keys {
            prefix: prefix.to_string(),
            digits: key_size - prefix.len(),
            space,
            sequential,
        })
    }

    pub(crate) fn key(&self, n: u64) -> Bytes {
        Bytes::from(format!("{}{n:0width$}", self.prefix, width = self.digits))
    }

    /// The key of request `i`: in order, or at random.
    pub(crate) fn pick(&self, i: u64, rng: &mut StdRng) -> Bytes {
        let n = if self.sequential {
            i % self.space
        } else {
            rng.random_range(0..self.space)
        };
        self.key(n)
    }
}

/// Decimal digits of `n`.
pub(crate) fn digits(n: u64) -> usize {
    n.checked_ilog10().map_or(1, |d| d as usize + 1)
}

/// The end of the range of every key starting with `prefix`, as etcd's clients compute it.
pub(crate) fn prefix_end(prefix: &[u8]) -> Bytes {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Bytes::from(end);
        }
    }
    // All 0xff (or empty): every key from `prefix` on.
    Bytes::from_static(b"\0")
}

/// `value` with its first 8 bytes replaced by the nanoseconds from `epoch` to now.
pub(crate) fn stamped(value: &Bytes, epoch: Instant) -> Bytes {
    let nanos = u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
    let mut v = BytesMut::with_capacity(value.len().max(8));
    v.put_u64(nanos);
    v.extend_from_slice(value.get(8..).unwrap_or_default());
    v.freeze()
}

/// The send time a `stamped` value carries, as time since the epoch.
pub(crate) fn stamp_of(value: &[u8]) -> Option<Duration> {
    let nanos: [u8; 8] = value.get(..8)?.try_into().ok()?;
    Some(Duration::from_nanos(u64::from_be_bytes(nanos)))
}
