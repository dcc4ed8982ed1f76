//! Reading flag values: the error a bad one gets, Go durations and paths as etcd takes them.

use std::path::PathBuf;
use std::time::Duration;

/// A flag value that does not make sense, with the flag's name.
#[derive(Debug, thiserror::Error)]
#[error("--{flag}: {reason}")]
pub struct BadFlag {
    /// The flag's name, without the leading `--`.
    pub flag: &'static str,
    /// What is wrong with its value.
    pub reason: String,
}

pub(crate) fn bad(flag: &'static str, reason: impl Into<String>) -> BadFlag {
    BadFlag {
        flag,
        reason: reason.into(),
    }
}

/// A path flag's value. Unlike clap's own path parser it takes an empty value, which etcd's
/// help shows as the default of its file flags and which means no file.
pub fn path(value: &str) -> Result<PathBuf, std::convert::Infallible> {
    Ok(PathBuf::from(value))
}

/// A Go duration (`5s`, `1m30s`, `500ms`, `1.5h`), as etcd's duration flags take.
pub fn go_duration(flag: &'static str, value: &str) -> Result<Duration, BadFlag> {
    let nanos = go_parse_duration::parse_duration(value.trim())
        .map_err(|_| bad(flag, format!("{value:?} is not a duration (for example 5s, 1m30s)")))?;
    u64::try_from(nanos)
        .map(Duration::from_nanos)
        .map_err(|_| bad(flag, format!("{value:?} is negative")))
}
