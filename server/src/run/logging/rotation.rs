//! Log rotation as etcd rotates its log (`--enable-log-rotation`, `--log-rotation-config-json`):
//! the one file among `--log-outputs` is rolled over the way lumberjack, etcd's rotating
//! writer, rolls it.
//!
//! On disk, beside the file (`cairn.log`) are its rotated copies, named for the time of the
//! rotation between the name and its extension: `cairn-2016-11-04T18-30-00.000.log` (UTC
//! unless `localtime`), `cairn-2016-11-04T18-30-00.000.log.gz` once gzipped. A write that
//! would take the file past `maxsize` megabytes first renames it so and starts a new one, so
//! every file holds whole writes (whole lines) and none exceeds the limit. After each rotation
//! a background thread, the mill, removes the rotated files beyond the newest `maxbackups` and
//! those older than `maxage` days (by the time in their names), then gzips the rest when
//! `compress` is set.
//!
//! A crash at any point leaves files the next start takes up: between the rename and the new
//! file, no `cairn.log` (it is created); halfway through a gzip, `x.log` beside a partial
//! `x.log.gz`, which count as one rotated file and are gzipped again over the partial one (a
//! `.gz` is synced before its source is removed); halfway through the removals, files the next
//! mill removes. A rotation that fails (a rename refused, say) is reported on stderr, and
//! writing goes on in the file at hand; the next write tries the rotation again.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use chrono::{DateTime, Local, NaiveDateTime, TimeDelta, Utc};
use crossbeam_channel::{Sender, TrySendError};
use parking_lot::Mutex;

use crate::config::Rotation;

impl Rotation {
    /// Whether the mill has anything to do.
    fn prunes_or_compresses(&self) -> bool {
        self.maxbackups > 0 || self.maxage > 0 || self.compress
    }

    /// The most bytes a file may hold.
    fn max_bytes(&self) -> u64 {
        let megabytes = match self.maxsize {
            0 => Rotation::default_max_size(),
            n => n,
        };
        megabytes.saturating_mul(1024 * 1024)
    }
}

/// lumberjack's time in a rotated file's name (Go's `2006-01-02T15-04-05.000`).
const STAMP: &str = "%Y-%m-%dT%H-%M-%S%.3f";
/// The extension of a gzipped rotated file.
const GZ: &str = ".gz";

/// The wall clock rotations are named by; tests set their own.
type Clock = Arc<dyn Fn() -> DateTime<Utc> + Send + Sync>;

/// The mill's thread, and what wakes it.
type Mill = (Sender<()>, std::thread::JoinHandle<()>);

/// A log file rotated as [`Rotation`] says, written to by any number of threads at once
/// (through `&RotatingFile`, as tracing's `Arc<W>` writer does): each write lands whole in
/// one file.
pub struct RotatingFile {
    files: Arc<Files>,
    /// The file written to. Not held while the mill works.
    current: Mutex<Current>,
    /// Wakes the mill; a wake-up already queued covers later rotations too. `None` when
    /// there is nothing to prune or compress, and once dropped, which lets the mill finish
    /// and stop.
    mill: Option<Mill>,
}

impl std::fmt::Debug for RotatingFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RotatingFile")
            .field("path", &self.files.path)
            .field("rotation", &self.files.rotation)
            .finish_non_exhaustive()
    }
}

/// The file being written.
struct Current {
    file: File,
    /// Bytes in the file: its length when opened, plus every write since.
    size: u64,
    /// The last rotation failed: said on stderr once, until one succeeds.
    failing: bool,
}

/// The log file and its rotated copies: where they are and how they are rotated. Shared
/// with the mill.
struct Files {
    path: PathBuf,
    rotation: Rotation,
    max_bytes: u64,
    now: Clock,
}

impl RotatingFile {
    /// Appends to the file at `path` (created if missing), rotated as `rotation` says. The
    /// rotated files already there are pruned at once, by the mill.
    pub fn open(path: &Path, rotation: Rotation) -> io::Result<RotatingFile> {
        let max_bytes = rotation.max_bytes();
        RotatingFile::open_with(path, rotation, max_bytes, Arc::new(Utc::now))
    }

    /// [`RotatingFile::open`] with a limit in bytes rather than megabytes, and a clock.
    fn open_with(path: &Path, rotation: Rotation, max_bytes: u64, now: Clock) -> io::Result<RotatingFile> {
        let files = Arc::new(Files {
            path: path.to_path_buf(),
            rotation,
            max_bytes,
            now,
        });
        let file = files.open_file(None)?;
        let size = file.metadata()?.len();
        let mill = match files.rotation.prunes_or_compresses() {
            true => Some(Files::start_mill(&files)?),
            false => None,
        };
        let rotating = RotatingFile {
            files,
            current: Mutex::new(Current {
                file,
                size,
                failing: false,
            }),
            mill,
        };
        rotating.wake_mill();
        Ok(rotating)
    }

    fn wake_mill(&self) {
        if let Some((wake, _)) = &self.mill {
            match wake.try_send(()) {
                Ok(()) | Err(TrySendError::Full(())) => {}
                Err(TrySendError::Disconnected(())) => report("the log rotation mill has stopped"),
            }
        }
    }

    /// Writes `buf` whole into the file, rotating it first when `buf` would take it past the
    /// limit: whether it rotated.
    fn write_whole(&self, buf: &[u8]) -> io::Result<bool> {
        let len = u64::try_from(buf.len()).unwrap_or(u64::MAX);
        let max = self.files.max_bytes;
        if len > max {
            // lumberjack refuses a write no file could hold.
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("write length {len} exceeds maximum file size {max}"),
            ));
        }
        let mut current = self.current.lock();
        let mut rotated = false;
        if current.size.saturating_add(len) > max {
            match self.files.rotate(&current.file) {
                Ok(file) => {
                    current.file = file;
                    current.size = 0;
                    current.failing = false;
                    rotated = true;
                }
                Err(e) => {
                    if !current.failing {
                        report(&format!(
                            "cannot rotate {}: {e}; writing on in the file at hand",
                            self.files.path.display()
                        ));
                    }
                    current.failing = true;
                }
            }
        }
        current.size = current.size.saturating_add(len);
        current.file.write_all(buf)?;
        Ok(rotated)
    }
}

impl Write for &RotatingFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.write_whole(buf)? {
            self.wake_mill();
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.current.lock().file.flush()
    }
}

impl Drop for RotatingFile {
    /// Lets the mill finish what it was woken for, and waits for it.
    fn drop(&mut self) {
        if let Some((wake, mill)) = self.mill.take() {
            drop(wake);
            if mill.join().is_err() {
                report("the log rotation mill panicked");
            }
        }
    }
}

impl Files {
    /// Opens the file to append to, with `like`'s permissions if it is created.
    fn open_file(&self, like: Option<&fs::Metadata>) -> io::Result<File> {
        let mut options = OpenOptions::new();
        options.create(true).append(true);
        if let Some(like) = like {
            use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
            options.mode(like.permissions().mode());
        }
        options.open(&self.path)
    }

    /// Renames the file to its rotated name and opens a new one: the new file. `file` is
    /// the one at hand, whose permissions the new one takes.
    fn rotate(&self, file: &File) -> io::Result<File> {
        let like = file.metadata().ok();
        // After a rotation that renamed the file but could not open a new one, there is
        // nothing left to rename.
        if fs::symlink_metadata(&self.path).is_ok() {
            let at = (self.now)();
            // Two rotations in one millisecond: the later one takes the next free
            // millisecond rather than replace the first.
            let backup = (0..1000)
                .map(|ms| backup_name(&self.path, at + TimeDelta::milliseconds(ms), self.rotation.localtime))
                .find(|name| fs::symlink_metadata(name).is_err())
                .unwrap_or_else(|| backup_name(&self.path, at, self.rotation.localtime));
            fs::rename(&self.path, &backup)?;
        }
        self.open_file(like.as_ref())
    }

    /// Starts the mill: a thread that prunes and compresses each time it is woken, until
    /// the sender is dropped.
    fn start_mill(files: &Arc<Files>) -> io::Result<Mill> {
        // lumberjack's mill: one wake-up waiting at most, as its channel of one.
        let (wake, woken) = crossbeam_channel::bounded::<()>(1);
        let files = files.clone();
        let mill = std::thread::Builder::new().name("log-rotation".into()).spawn(move || {
            for () in woken {
                if let Err(e) = files.mill() {
                    report(&format!(
                        "cannot prune or compress the rotated logs of {}: {e}",
                        files.path.display()
                    ));
                }
            }
        })?;
        Ok((wake, mill))
    }

    /// Removes the rotated files [`plan`] says to, and gzips the others if asked to.
    fn mill(&self) -> io::Result<()> {
        let r = &self.rotation;
        let dir = match self.path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        let mut names = Vec::new();
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            if entry.file_type()?.is_file() {
                if let Ok(name) = entry.file_name().into_string() {
                    names.push(name);
                }
            }
        }
        let Some(base) = self.path.file_name().and_then(|n| n.to_str()) else {
            return Ok(());
        };
        let plan = plan(base, &names, r, local_now(self.now.as_ref()(), r.localtime));
        let mut first_error = None;
        for name in &plan.remove {
            if let Err(e) = fs::remove_file(dir.join(name)) {
                first_error.get_or_insert(e);
            }
        }
        for name in &plan.compress {
            if let Err(e) = gzip(&dir.join(name)) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// `now` as the times in rotated names are written: UTC, or local time.
fn local_now(now: DateTime<Utc>, localtime: bool) -> NaiveDateTime {
    match localtime {
        true => now.with_timezone(&Local).naive_local(),
        false => now.naive_utc(),
    }
}

/// The name `path` is rotated to at `at`: the time goes between its name and its extension
/// (Go's `filepath.Ext`, from the last dot), as lumberjack's `backupName`.
fn backup_name(path: &Path, at: DateTime<Utc>, localtime: bool) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default();
    let (prefix, ext) = split_ext(&name);
    let stamp = match localtime {
        true => at.with_timezone(&Local).format(STAMP).to_string(),
        false => at.format(STAMP).to_string(),
    };
    path.with_file_name(format!("{prefix}-{stamp}{ext}"))
}

/// A file name's stem and extension (with its dot; empty without one).
fn split_ext(name: &str) -> (&str, &str) {
    match name.rfind('.') {
        Some(dot) => name.split_at(dot),
        None => (name, ""),
    }
}

/// The time in `name` if it is a rotated copy of `base` (gzipped or not), as lumberjack's
/// `timeFromName` reads it; other files in the folder are none of the mill's business.
fn rotated_at(base: &str, name: &str) -> Option<NaiveDateTime> {
    let (prefix, ext) = split_ext(base);
    let name = name.strip_suffix(GZ).unwrap_or(name);
    let stamp = name.strip_prefix(prefix)?.strip_prefix('-')?.strip_suffix(ext)?;
    // chrono's `%.3f` also reads fewer or more digits; lumberjack's names have exactly 3.
    let millis = stamp.rsplit_once('.')?.1;
    if millis.len() != 3 {
        return None;
    }
    NaiveDateTime::parse_from_str(stamp, STAMP).ok()
}

/// What the mill does to the rotated files among `names`.
#[derive(Debug, Default, PartialEq, Eq)]
struct Plan {
    remove: Vec<String>,
    compress: Vec<String>,
}

/// lumberjack's `millRunOnce`: newest first, the rotated copies of `base` beyond the first
/// `maxbackups` are removed (a file and its `.gz` count once), then those rotated more than
/// `maxage` days before `now`; with `compress`, those left that are not gzipped yet are to be.
fn plan(base: &str, names: &[String], rotation: &Rotation, now: NaiveDateTime) -> Plan {
    let mut rotated: Vec<(NaiveDateTime, &String)> = names
        .iter()
        .filter_map(|name| Some((rotated_at(base, name)?, name)))
        .collect();
    rotated.sort_by(|a, b| b.cmp(a));
    let mut plan = Plan::default();
    let mut kept: Vec<&str> = Vec::new();
    let keep = usize::try_from(rotation.maxbackups).unwrap_or(usize::MAX);
    let cutoff = i64::try_from(rotation.maxage)
        .ok()
        .and_then(TimeDelta::try_days)
        .and_then(|age| now.checked_sub_signed(age));
    let mut left = Vec::new();
    for (at, name) in rotated {
        let plain = name.strip_suffix(GZ).unwrap_or(name);
        if !kept.contains(&plain) {
            kept.push(plain);
        }
        let too_many = rotation.maxbackups > 0 && kept.len() > keep;
        let too_old = rotation.maxage > 0 && cutoff.is_some_and(|cutoff| at < cutoff);
        match too_many || too_old {
            true => plan.remove.push(name.clone()),
            false => left.push(name),
        }
    }
    if rotation.compress {
        plan.compress = left.into_iter().filter(|name| !name.ends_with(GZ)).cloned().collect();
    }
    plan
}

/// Gzips `src` into `src.gz` (replacing a partial one a crash left), synced, then removes
/// `src`. On failure `src` stays and the partial `.gz` is removed.
fn gzip(src: &Path) -> io::Result<()> {
    let mut dst_name = src.as_os_str().to_owned();
    dst_name.push(GZ);
    let dst = PathBuf::from(dst_name);
    let written = (|| {
        let mut input = File::open(src)?;
        let mode = {
            use std::os::unix::fs::PermissionsExt;
            input.metadata()?.permissions().mode()
        };
        let output = {
            use std::os::unix::fs::OpenOptionsExt;
            OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(mode)
                .open(&dst)?
        };
        let mut gz = flate2::write::GzEncoder::new(output, flate2::Compression::default());
        io::copy(&mut input, &mut gz)?;
        gz.finish()?.sync_all()
    })();
    match written {
        Ok(()) => fs::remove_file(src),
        Err(e) => {
            let _ = fs::remove_file(&dst);
            Err(e)
        }
    }
}

/// Says what went wrong with the log on stderr, the one place left to say it; if stderr is
/// gone too, there is no one to tell.
fn report(what: &str) {
    let _ = writeln!(io::stderr(), "cairn: log rotation: {what}");
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

    use super::*;
    use std::io::Read;
    use std::sync::atomic::{AtomicI64, Ordering};

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text).unwrap().with_timezone(&Utc)
    }

    fn naive(text: &str) -> NaiveDateTime {
        at(text).naive_utc()
    }

    fn rotation(maxbackups: u64, maxage: u64, compress: bool) -> Rotation {
        Rotation {
            maxsize: 1,
            maxage,
            maxbackups,
            localtime: false,
            compress,
        }
    }

    fn strings(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| (*n).to_string()).collect()
    }

    /// A clock tests move by hand, in milliseconds since the epoch.
    fn manual(start: &str) -> (Arc<AtomicI64>, Clock) {
        let millis = Arc::new(AtomicI64::new(at(start).timestamp_millis()));
        let read = millis.clone();
        let clock: Clock = Arc::new(move || DateTime::from_timestamp_millis(read.load(Ordering::SeqCst)).unwrap());
        (millis, clock)
    }

    /// The names in `dir`, sorted.
    fn listing(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_rotated_file_is_named_for_the_time_between_its_name_and_extension_as_lumberjacks() {
        // lumberjack's doc: `/var/log/foo/server.log` rotated at 6:30pm on Nov 4 2016 is
        // `/var/log/foo/server-2016-11-04T18-30-00.000.log`.
        let when = at("2016-11-04T18:30:00.042Z");
        for (path, rotated) in [
            (
                "/var/log/foo/server.log",
                "/var/log/foo/server-2016-11-04T18-30-00.042.log",
            ),
            ("cairn.log", "cairn-2016-11-04T18-30-00.042.log"),
            ("/logs/cairn", "/logs/cairn-2016-11-04T18-30-00.042"),
            ("/logs/cairn.json.log", "/logs/cairn.json-2016-11-04T18-30-00.042.log"),
        ] {
            assert_eq!(
                backup_name(Path::new(path), when, false),
                PathBuf::from(rotated),
                "{path}"
            );
        }
        let local = backup_name(Path::new("cairn.log"), when, true);
        let expected = format!("cairn-{}.log", when.with_timezone(&Local).format(STAMP));
        assert_eq!(local, PathBuf::from(expected));
    }

    #[test]
    fn only_the_files_lumberjack_names_are_taken_for_rotated_ones() {
        let t = Some(naive("2016-11-04T18:30:00.042Z"));
        for (name, expected) in [
            ("cairn-2016-11-04T18-30-00.042.log", t),
            ("cairn-2016-11-04T18-30-00.042.log.gz", t),
            ("cairn.log", None),
            ("cairn-2016-11-04T18-30-00.log", None),
            ("cairn-2016-11-04T18-30-00.0421.log", None),
            ("cairn-2016-11-04T18-30-00.042.txt", None),
            ("other-2016-11-04T18-30-00.042.log", None),
            ("cairn-not-a-time.log", None),
        ] {
            assert_eq!(rotated_at("cairn.log", name), expected, "{name}");
        }
    }

    #[test]
    fn the_mill_keeps_the_newest_maxbackups_and_drops_those_older_than_maxage_as_lumberjack() {
        /// `"3"` names the file rotated at the start of 2024-01-03, `"3.gz"` that file gzipped.
        fn on(days: &[&str]) -> Vec<String> {
            days.iter()
                .map(|day| {
                    let (day, gz) = day.split_once('.').map_or((*day, ""), |(d, _)| (d, GZ));
                    format!("cairn-2024-01-0{day}T00-00-00.000.log{gz}")
                })
                .collect()
        }
        struct Case {
            maxbackups: u64,
            maxage: u64,
            compress: bool,
            removed: &'static [&'static str],
            compressed: &'static [&'static str],
        }
        // A gzip a crash interrupted left both "3" and "3.gz": they count as one.
        let mut names = on(&["5", "4.gz", "3", "3.gz", "1"]);
        names.extend(strings(&["cairn.log", "notes.txt"]));
        let now = naive("2024-01-06T12:00:00Z");
        let cases = [
            Case {
                maxbackups: 0,
                maxage: 0,
                compress: false,
                removed: &[],
                compressed: &[],
            },
            Case {
                maxbackups: 2,
                maxage: 0,
                compress: false,
                removed: &["3.gz", "3", "1"],
                compressed: &[],
            },
            Case {
                maxbackups: 3,
                maxage: 0,
                compress: false,
                removed: &["1"],
                compressed: &[],
            },
            // Older than 2 days of 24 hours: rotated before 2024-01-04T12:00.
            Case {
                maxbackups: 0,
                maxage: 2,
                compress: false,
                removed: &["4.gz", "3.gz", "3", "1"],
                compressed: &[],
            },
            Case {
                maxbackups: 0,
                maxage: 0,
                compress: true,
                removed: &[],
                compressed: &["5", "3", "1"],
            },
            Case {
                maxbackups: 2,
                maxage: 30,
                compress: true,
                removed: &["3.gz", "3", "1"],
                compressed: &["5"],
            },
        ];
        for c in cases {
            let got = plan("cairn.log", &names, &rotation(c.maxbackups, c.maxage, c.compress), now);
            let want = Plan {
                remove: on(c.removed),
                compress: on(c.compressed),
            };
            let (b, a, z) = (c.maxbackups, c.maxage, c.compress);
            assert_eq!(got, want, "maxbackups {b}, maxage {a}, compress {z}");
        }
    }

    #[test]
    fn a_write_that_would_pass_the_limit_goes_into_a_new_file_and_old_ones_are_pruned() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cairn.log");
        fs::write(&path, "already there\n").unwrap();
        let (clock, now) = manual("2024-03-01T10:00:00Z");
        let writer = RotatingFile::open_with(&path, rotation(2, 0, false), 30, now).unwrap();
        // Lines of 10 bytes, 3 to a file; the 14 bytes already there count, so the second
        // line (at 1 s) is the first to go into a new file.
        for i in 0..8 {
            (&writer).write_all(format!("line {i:04}\n").as_bytes()).unwrap();
            clock.fetch_add(1000, Ordering::SeqCst);
        }
        // Dropped, the writer has waited for its mill. Rotated at 1 s, 4 s and 7 s: the
        // oldest is beyond the 2 kept.
        drop(writer);
        assert_eq!(
            listing(dir.path()),
            [
                "cairn-2024-03-01T10-00-04.000.log",
                "cairn-2024-03-01T10-00-07.000.log",
                "cairn.log"
            ]
        );
        let read = |name: &str| fs::read_to_string(dir.path().join(name)).unwrap();
        assert_eq!(
            read("cairn-2024-03-01T10-00-04.000.log"),
            "line 0001\nline 0002\nline 0003\n"
        );
        assert_eq!(
            read("cairn-2024-03-01T10-00-07.000.log"),
            "line 0004\nline 0005\nline 0006\n"
        );
        assert_eq!(read("cairn.log"), "line 0007\n");
    }

    #[test]
    fn rotated_files_older_than_maxage_are_removed_from_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cairn.log");
        for name in [
            "cairn-2024-02-27T09-59-59.999.log",
            "cairn-2024-02-28T10-00-00.001.log.gz",
            "unrelated-2024-01-01T00-00-00.000.log",
        ] {
            fs::write(dir.path().join(name), "x").unwrap();
        }
        // A day is 24 hours, as in lumberjack: the cutoff is 2024-02-28T10:00:00.
        let (_, now) = manual("2024-02-29T10:00:00Z");
        drop(RotatingFile::open_with(&path, rotation(0, 1, false), 30, now).unwrap());
        assert_eq!(
            listing(dir.path()),
            [
                "cairn-2024-02-28T10-00-00.001.log.gz",
                "cairn.log",
                "unrelated-2024-01-01T00-00-00.000.log"
            ]
        );
    }

    #[test]
    fn a_write_larger_than_the_limit_is_refused_as_lumberjack_refuses_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cairn.log");
        let (_, now) = manual("2024-03-01T10:00:00Z");
        let writer = RotatingFile::open_with(&path, rotation(0, 0, false), 8, now).unwrap();
        assert!((&writer).write(b"123456789").is_err());
        (&writer).write_all(b"12345678").unwrap();
        drop(writer);
        assert_eq!(fs::read_to_string(&path).unwrap(), "12345678");
    }

    #[test]
    fn rotated_files_are_gzipped_whole_with_compress() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cairn.log");
        let (clock, now) = manual("2024-03-01T10:00:00Z");
        let writer = RotatingFile::open_with(&path, rotation(0, 0, true), 20, now).unwrap();
        for line in ["first line\n", "second line\n"] {
            (&writer).write_all(line.as_bytes()).unwrap();
            clock.fetch_add(1, Ordering::SeqCst);
        }
        drop(writer);
        assert_eq!(
            listing(dir.path()),
            ["cairn-2024-03-01T10-00-00.001.log.gz", "cairn.log"]
        );
        let gz = File::open(dir.path().join("cairn-2024-03-01T10-00-00.001.log.gz")).unwrap();
        let mut text = String::new();
        flate2::read::GzDecoder::new(gz).read_to_string(&mut text).unwrap();
        assert_eq!(text, "first line\n");
        assert_eq!(fs::read_to_string(&path).unwrap(), "second line\n");
    }

    #[test]
    fn lines_from_many_threads_land_whole_and_once_even_when_rotations_share_a_millisecond() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cairn.log");
        // The clock never moves: every rotation falls in the same millisecond.
        let (_, now) = manual("2024-03-01T10:00:00Z");
        let max = 256;
        let writer = RotatingFile::open_with(&path, rotation(0, 0, false), max, now).unwrap();
        std::thread::scope(|s| {
            for t in 0..4 {
                let writer = &writer;
                s.spawn(move || {
                    for i in 0..200 {
                        (&*writer)
                            .write_all(format!("thread {t} line {i:03}\n").as_bytes())
                            .unwrap();
                    }
                });
            }
        });
        drop(writer);
        let mut lines = Vec::new();
        let names = listing(dir.path());
        assert!(names.len() > 10, "{names:?}");
        for name in names {
            let text = fs::read_to_string(dir.path().join(&name)).unwrap();
            assert!(text.len() as u64 <= max, "{name}: {} bytes", text.len());
            assert!(text.ends_with('\n'), "{name}");
            lines.extend(text.lines().map(str::to_string));
        }
        lines.sort();
        let mut expected: Vec<String> = (0..4)
            .flat_map(|t| (0..200).map(move |i| format!("thread {t} line {i:03}")))
            .collect();
        expected.sort();
        assert_eq!(lines, expected);
    }

    #[test]
    fn a_rotation_that_fails_leaves_writing_going_on_in_the_file_at_hand() {
        let dir = tempfile::tempdir().unwrap();
        // 240 bytes of name is a legal file name; with a time in it (24 more) it is past
        // Linux's 255, so every rename fails.
        let path = dir.path().join(format!("{}.log", "c".repeat(236)));
        let (_, now) = manual("2024-03-01T10:00:00Z");
        let writer = RotatingFile::open_with(&path, rotation(1, 0, false), 16, now).unwrap();
        for i in 0..5 {
            (&writer).write_all(format!("line {i:04}\n").as_bytes()).unwrap();
        }
        drop(writer);
        assert_eq!(listing(dir.path()).len(), 1);
        let text = fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 5, "{text}");
    }

    #[test]
    fn maxsize_is_in_megabytes_and_zero_is_lumberjacks_default() {
        let mut r = rotation(0, 0, false);
        assert_eq!(r.max_bytes(), 1024 * 1024);
        r.maxsize = 0;
        assert_eq!(r.max_bytes(), 100 * 1024 * 1024);
    }
}
