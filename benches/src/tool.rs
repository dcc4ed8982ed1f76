//! What every load tool in `src/bin/` does the same way around its measurements: failing with a
//! message for a person, the exit code, the `--seconds` and list arguments, and its own work
//! directory under `--dir`.
//!
//! On disk: one `<tool>-<pid>` directory under `--dir`, removed when the [`WorkDir`] is removed
//! or dropped (so also after an error). A tool killed mid-run leaves that directory behind and
//! nothing else.

use std::collections::HashSet;
use std::fmt;
use std::fs;
use std::hash::Hash;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Why a tool gave up, said for a person: what it was doing, then the cause.
#[derive(Debug)]
pub struct Failure(pub String);

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Turns any error into a [`Failure`] that says what was being done: `what(): error`.
pub trait Context<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T, Failure>;
}

impl<T, E: fmt::Display> Context<T> for Result<T, E> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T, Failure> {
        self.map_err(|e| Failure(format!("{}: {e}", what())))
    }
}

/// The exit code for a tool's outcome; a failure is printed first, as `<tool>: <failure>`.
pub fn exit_code(tool: &str, outcome: Result<(), Failure>) -> ExitCode {
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{tool}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Longest accepted `--seconds`: a day is already more than anyone means.
pub const MAX_SECONDS: f64 = 86_400.0;

/// Parses `--seconds`: a positive number of seconds, fractions allowed, at most [`MAX_SECONDS`].
pub fn parse_seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("`{s}` is not a number of seconds"))?;
    if !(v.is_finite() && v > 0.0 && v <= MAX_SECONDS) {
        return Err(format!("must be more than 0 and at most {MAX_SECONDS}"));
    }
    Ok(v)
}

/// Parses a count argument: a whole number of `unit` from 1 to `max`.
pub fn parse_count<T>(s: &str, max: T, unit: &str) -> Result<T, String>
where
    T: std::str::FromStr + PartialOrd + From<u8> + std::fmt::Display,
{
    let v: T = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a whole number of {unit}"))?;
    if v < T::from(1) || v > max {
        return Err(format!("must be between 1 and {max} {unit}"));
    }
    Ok(v)
}

/// Drops repeated values from a list argument, keeping the first of each where it stood.
pub fn dedup_in_order<T: Copy + Eq + Hash>(v: &mut Vec<T>) {
    let mut seen = HashSet::new();
    v.retain(|n| seen.insert(*n));
}

/// A tool's own directory under `--dir`. Removed when dropped, so an error leaves nothing.
#[derive(Debug)]
pub struct WorkDir {
    path: PathBuf,
    /// Names the directory (`<tool>-<pid>`) and prefixes the warning when dropping fails.
    tool: &'static str,
    removed: bool,
}

impl WorkDir {
    /// Creates `<tool>-<pid>` under `parent`, which must be an existing directory.
    pub fn create(parent: &Path, tool: &'static str) -> Result<WorkDir, Failure> {
        let meta = fs::metadata(parent).context(|| format!("cannot use --dir {}", parent.display()))?;
        if !meta.is_dir() {
            return Err(Failure(format!("--dir {} is not a directory", parent.display())));
        }
        let path = parent.join(format!("{tool}-{}", std::process::id()));
        fs::create_dir(&path).context(|| format!("cannot create {}", path.display()))?;
        Ok(WorkDir {
            path,
            tool,
            removed: false,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the directory, reporting a failure (drop only warns).
    pub fn remove(mut self) -> Result<(), Failure> {
        self.removed = true;
        fs::remove_dir_all(&self.path).context(|| format!("cannot remove {}", self.path.display()))
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if !self.removed {
            if let Err(e) = fs::remove_dir_all(&self.path) {
                eprintln!("{}: warning: cannot remove {}: {e}", self.tool, self.path.display());
            }
        }
    }
}
