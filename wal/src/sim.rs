//! An in-memory [`FileSystem`] for crash and fault testing.
//!
//! Every file keeps two versions: what a reader sees now, and what survives a crash (as of the
//! last fdatasync). Directory entries likewise: creations, renames and removals survive a crash
//! only once their directory is synced. A crash keeps the durable state plus, per file, any
//! chosen part of the unsynced changes: a prefix of them (a write torn at any byte) or any
//! subset of their 512-byte sectors (writeback out of order). Handles opened before a crash fail
//! afterwards, like the file descriptors of a dead process.
//!
//! Faults: syncs or writes can be set to fail after a number of successful calls; a failing
//! write applies the first half of its bytes first, as a short write does.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use crate::fs::{DirLock, FileSystem, WalFile};

/// The sector size crash simulation tears at in [`SimFs::crash_sectors`]: the one recovery
/// assumes a device writes in.
pub const SECTOR: usize = crate::recovery::SECTOR;

/// A simulated file system; clones share the same state.
#[derive(Debug, Clone, Default)]
pub struct SimFs {
    state: Arc<Mutex<SimState>>,
}

#[derive(Debug, Default)]
struct SimState {
    /// Bumped by every crash; handles of an older generation are dead.
    generation: u64,
    next_id: u64,
    files: HashMap<u64, SimData>,
    /// Directory entries as a reader sees them now.
    names: BTreeMap<PathBuf, u64>,
    /// Directory entries that survive a crash.
    durable_names: BTreeMap<PathBuf, u64>,
    dirs: BTreeSet<PathBuf>,
    locks: BTreeSet<PathBuf>,
    /// Successful syncs left before syncs start failing; `None` never fails.
    syncs_left: Option<u64>,
    /// Successful writes left before writes start failing; `None` never fails.
    writes_left: Option<u64>,
    /// While set, file syncs wait at this gate.
    gate: Option<Arc<GateState>>,
    /// File syncs so far, by the name of the thread that made them.
    syncs_by_thread: BTreeMap<String, u64>,
}

#[derive(Debug, Default)]
struct GateState {
    /// (closed, syncs waiting)
    state: Mutex<(bool, usize)>,
    changed: Condvar,
}

impl GateState {
    fn pass(&self) {
        let mut st = self.state.lock();
        st.1 += 1;
        self.changed.notify_all();
        while st.0 {
            self.changed.wait(&mut st);
        }
        st.1 -= 1;
    }
}

/// Holds file syncs back until released: lets a test line requests up behind a sync in
/// progress, deterministically. Dropping the gate releases it.
#[derive(Debug)]
pub struct SyncGate {
    gate: Arc<GateState>,
    fs: SimFs,
}

impl SyncGate {
    /// Blocks until at least one sync is waiting at the gate.
    pub fn wait_for_blocked_sync(&self) {
        let mut st = self.gate.state.lock();
        while st.1 == 0 {
            self.gate.changed.wait(&mut st);
        }
    }

    /// Lets every held and later sync through.
    pub fn release(self) {}
}

impl Drop for SyncGate {
    fn drop(&mut self) {
        self.fs.state.lock().gate = None;
        let mut st = self.gate.state.lock();
        st.0 = false;
        self.gate.changed.notify_all();
    }
}

#[derive(Debug, Default, Clone)]
struct SimData {
    data: Vec<u8>,
    durable: Vec<u8>,
}

fn injected(what: &str) -> io::Error {
    io::Error::other(format!("simulated {what} failure"))
}

fn take_budget(budget: &mut Option<u64>) -> bool {
    match budget {
        None => true,
        Some(0) => false,
        Some(n) => {
            *n -= 1;
            true
        }
    }
}

impl SimFs {
    /// An empty file system: no files, no directories, no faults.
    pub fn new() -> SimFs {
        SimFs::default()
    }

    /// Creates (or replaces) a file with `bytes`, durably, parent directories included.
    pub fn write_file(&self, path: &Path, bytes: &[u8]) {
        let mut st = self.state.lock();
        if let Some(parent) = path.parent() {
            st.dirs.insert(parent.to_path_buf());
        }
        let id = st.next_id;
        st.next_id += 1;
        st.files.insert(
            id,
            SimData {
                data: bytes.to_vec(),
                durable: bytes.to_vec(),
            },
        );
        st.names.insert(path.to_path_buf(), id);
        st.durable_names.insert(path.to_path_buf(), id);
    }

    /// The current content of a file, if it exists.
    pub fn read_file(&self, path: &Path) -> Option<Vec<u8>> {
        let st = self.state.lock();
        let id = st.names.get(path)?;
        st.files.get(id).map(|f| f.data.clone())
    }

    /// The names in `dir`, sorted.
    pub fn file_names(&self, dir: &Path) -> Vec<String> {
        self.list(dir).unwrap_or_default()
    }

    /// Syncs start failing after `n` more successful ones.
    pub fn fail_syncs_after(&self, n: u64) {
        self.state.lock().syncs_left = Some(n);
    }

    /// Writes start failing after `n` more successful ones.
    pub fn fail_writes_after(&self, n: u64) {
        self.state.lock().writes_left = Some(n);
    }

    /// How many file syncs the thread named `name` has made.
    pub fn syncs_by(&self, name: &str) -> u64 {
        self.state.lock().syncs_by_thread.get(name).copied().unwrap_or(0)
    }

    /// Makes file syncs wait until the returned gate is released or dropped.
    pub fn hold_syncs(&self) -> SyncGate {
        let gate = Arc::new(GateState::default());
        gate.state.lock().0 = true;
        self.state.lock().gate = Some(gate.clone());
        SyncGate { gate, fs: self.clone() }
    }

    /// Stops injecting faults: syncs and writes succeed again. Does not release a
    /// [`SyncGate`].
    pub fn clear_faults(&self) {
        let mut st = self.state.lock();
        st.syncs_left = None;
        st.writes_left = None;
    }

    /// Simulates power loss, keeping of each file's unsynced changes the first
    /// `keep(path, dirty_len)` bytes (clamped): a write torn at any byte.
    pub fn crash_tearing(&self, mut keep: impl FnMut(&Path, u64) -> u64) {
        self.crash_with(|path, data| {
            let Some((start, end)) = dirty_range(&data.data, &data.durable) else {
                return data.durable.clone();
            };
            let kept = keep(path, (end - start) as u64).min((end - start) as u64) as usize;
            let cut = start + kept;
            if cut >= data.data.len() {
                return data.data.clone();
            }
            let mut out = data.data.get(..cut).unwrap_or_default().to_vec();
            out.extend_from_slice(data.durable.get(cut..).unwrap_or_default());
            out
        });
    }

    /// Simulates power loss where each unsynced 512-byte sector independently survives or not,
    /// as `keep(path, sector_number)` decides. A file that grew keeps its new length, the lost
    /// sectors reading as their old content or zeros.
    pub fn crash_sectors(&self, mut keep: impl FnMut(&Path, u64) -> bool) {
        self.crash_with(|path, data| {
            let len = data.data.len().max(data.durable.len());
            let byte = |v: &Vec<u8>, i: usize| v.get(i).copied().unwrap_or(0);
            let mut out = Vec::with_capacity(len);
            for start in (0..len).step_by(SECTOR) {
                let end = (start + SECTOR).min(len);
                let changed = (start..end).any(|i| byte(&data.data, i) != byte(&data.durable, i));
                let src = if changed && !keep(path, (start / SECTOR) as u64) {
                    &data.durable
                } else {
                    &data.data
                };
                out.extend((start..end).map(|i| byte(src, i)));
            }
            out
        });
    }

    fn crash_with(&self, mut survive: impl FnMut(&Path, &SimData) -> Vec<u8>) {
        let mut st = self.state.lock();
        st.generation += 1;
        st.locks.clear();
        st.names = st.durable_names.clone();
        let live: BTreeMap<u64, PathBuf> = st.names.iter().map(|(p, id)| (*id, p.clone())).collect();
        let mut files = HashMap::new();
        for (id, path) in live {
            if let Some(data) = st.files.get(&id) {
                let kept = survive(&path, data);
                files.insert(
                    id,
                    SimData {
                        data: kept.clone(),
                        durable: kept,
                    },
                );
            }
        }
        st.files = files;
    }
}

/// The range of bytes where `data` differs from `durable` (lengths included).
fn dirty_range(data: &[u8], durable: &[u8]) -> Option<(usize, usize)> {
    let longest = data.len().max(durable.len());
    let differs = |i: &usize| data.get(*i) != durable.get(*i);
    let start = (0..longest).find(differs)?;
    let end = (0..longest).rev().find(differs).map_or(start, |e| e + 1);
    Some((start, end))
}

#[derive(Debug)]
struct SimFile {
    state: Arc<Mutex<SimState>>,
    id: u64,
    generation: u64,
}

impl SimFile {
    fn with<T>(&self, f: impl FnOnce(&mut SimState) -> io::Result<T>) -> io::Result<T> {
        let mut st = self.state.lock();
        if st.generation != self.generation {
            return Err(io::Error::other("simulated crash: stale file handle"));
        }
        f(&mut st)
    }
}

fn file_mut(st: &mut SimState, id: u64) -> io::Result<&mut SimData> {
    st.files
        .get_mut(&id)
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "simulated file vanished"))
}

impl WalFile for SimFile {
    fn read_all(&self) -> io::Result<Vec<u8>> {
        let id = self.id;
        self.with(|st| Ok(file_mut(st, id)?.data.clone()))
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let id = self.id;
        self.with(|st| {
            let ok = take_budget(&mut st.writes_left);
            let f = file_mut(st, id)?;
            let at = usize::try_from(offset).map_err(io::Error::other)?;
            let n = if ok { buf.len() } else { buf.len() / 2 };
            if f.data.len() < at + n {
                f.data.resize(at + n, 0);
            }
            if let (Some(dst), Some(src)) = (f.data.get_mut(at..at + n), buf.get(..n)) {
                dst.copy_from_slice(src);
            }
            if ok {
                Ok(())
            } else {
                Err(injected("write"))
            }
        })
    }

    fn sync_data(&self) -> io::Result<()> {
        let gate = self.state.lock().gate.clone();
        if let Some(gate) = gate {
            gate.pass();
        }
        let id = self.id;
        self.with(|st| {
            if !take_budget(&mut st.syncs_left) {
                return Err(injected("fsync"));
            }
            let thread = std::thread::current().name().unwrap_or_default().to_owned();
            *st.syncs_by_thread.entry(thread).or_default() += 1;
            let f = file_mut(st, id)?;
            f.durable = f.data.clone();
            Ok(())
        })
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let id = self.id;
        self.with(|st| {
            let len = usize::try_from(len).map_err(io::Error::other)?;
            file_mut(st, id)?.data.resize(len, 0);
            Ok(())
        })
    }

    fn preallocate(&self, len: u64) -> io::Result<()> {
        let id = self.id;
        self.with(|st| {
            if !take_budget(&mut st.syncs_left) {
                return Err(injected("fsync"));
            }
            let len = usize::try_from(len).map_err(io::Error::other)?;
            let f = file_mut(st, id)?;
            if f.data.len() < len {
                f.data.resize(len, 0);
            }
            f.durable = f.data.clone();
            Ok(())
        })
    }
}

#[derive(Debug)]
struct SimLock {
    state: Arc<Mutex<SimState>>,
    dir: PathBuf,
    generation: u64,
}

impl DirLock for SimLock {}

impl Drop for SimLock {
    fn drop(&mut self) {
        let mut st = self.state.lock();
        if st.generation == self.generation {
            st.locks.remove(&self.dir);
        }
    }
}

impl SimFs {
    fn handle(&self, id: u64, generation: u64) -> Box<dyn WalFile> {
        Box::new(SimFile {
            state: self.state.clone(),
            id,
            generation,
        })
    }
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, format!("{} not found", path.display()))
}

impl FileSystem for SimFs {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        self.state.lock().dirs.insert(dir.to_path_buf());
        Ok(())
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let st = self.state.lock();
        if !st.dirs.contains(dir) {
            return Err(not_found(dir));
        }
        Ok(st
            .names
            .keys()
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| p.file_name()?.to_str().map(str::to_owned))
            .collect())
    }

    fn create(&self, path: &Path) -> io::Result<Box<dyn WalFile>> {
        let mut st = self.state.lock();
        let parent = path.parent().unwrap_or(Path::new(""));
        if !st.dirs.contains(parent) {
            return Err(not_found(parent));
        }
        let id = match st.names.get(path) {
            Some(id) => *id,
            None => {
                let id = st.next_id;
                st.next_id += 1;
                st.names.insert(path.to_path_buf(), id);
                id
            }
        };
        st.files.entry(id).or_default().data.clear();
        let generation = st.generation;
        drop(st);
        Ok(self.handle(id, generation))
    }

    fn open(&self, path: &Path) -> io::Result<Box<dyn WalFile>> {
        let st = self.state.lock();
        let id = *st.names.get(path).ok_or_else(|| not_found(path))?;
        let generation = st.generation;
        drop(st);
        Ok(self.handle(id, generation))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut st = self.state.lock();
        let id = st.names.remove(from).ok_or_else(|| not_found(from))?;
        st.names.insert(to.to_path_buf(), id);
        Ok(())
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut st = self.state.lock();
        st.names.remove(path).map(|_| ()).ok_or_else(|| not_found(path))
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut st = self.state.lock();
        if !take_budget(&mut st.syncs_left) {
            return Err(injected("fsync"));
        }
        st.durable_names.retain(|p, _| p.parent() != Some(dir));
        let entries: Vec<(PathBuf, u64)> = st
            .names
            .iter()
            .filter(|(p, _)| p.parent() == Some(dir))
            .map(|(p, id)| (p.clone(), *id))
            .collect();
        st.durable_names.extend(entries);
        Ok(())
    }

    fn lock_dir(&self, dir: &Path) -> io::Result<Box<dyn DirLock>> {
        let mut st = self.state.lock();
        if !st.locks.insert(dir.to_path_buf()) {
            return Err(io::Error::new(io::ErrorKind::WouldBlock, "simulated lock is held"));
        }
        Ok(Box::new(SimLock {
            state: self.state.clone(),
            dir: dir.to_path_buf(),
            generation: st.generation,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crash_keeps_synced_data_and_drops_unsynced_names() {
        let fs = SimFs::new();
        let dir = Path::new("/d");
        fs.create_dir_all(dir).unwrap();
        let a = fs.create(&dir.join("a")).unwrap();
        a.write_all_at(b"durable", 0).unwrap();
        a.sync_data().unwrap();
        fs.sync_dir(dir).unwrap();
        a.write_all_at(b" and not", 7).unwrap();
        let b = fs.create(&dir.join("b")).unwrap();
        b.write_all_at(b"never named durably", 0).unwrap();
        b.sync_data().unwrap();
        fs.crash_tearing(|_, _| 0);
        assert_eq!(fs.read_file(&dir.join("a")).unwrap(), b"durable");
        assert_eq!(fs.read_file(&dir.join("b")), None);
        assert!(a.write_all_at(b"x", 0).is_err(), "handles die with the crash");
    }

    #[test]
    fn torn_write_keeps_a_prefix() {
        let fs = SimFs::new();
        let dir = Path::new("/d");
        fs.write_file(&dir.join("f"), &[0u8; 16]);
        let f = fs.open(&dir.join("f")).unwrap();
        f.write_all_at(b"abcdefgh", 4).unwrap();
        fs.crash_tearing(|_, len| {
            assert_eq!(len, 8);
            3
        });
        assert_eq!(fs.read_file(&dir.join("f")).unwrap(), b"\0\0\0\0abc\0\0\0\0\0\0\0\0\0");
    }

    #[test]
    fn faults_fire_after_the_budget() {
        let fs = SimFs::new();
        fs.write_file(Path::new("/d/f"), b"");
        let f = fs.open(Path::new("/d/f")).unwrap();
        fs.fail_syncs_after(1);
        f.sync_data().unwrap();
        assert!(f.sync_data().is_err());
        assert!(f.sync_data().is_err(), "a failed disk stays failed");
        fs.clear_faults();
        fs.fail_writes_after(0);
        assert!(f.write_all_at(b"abcd", 0).is_err());
        assert_eq!(
            fs.read_file(Path::new("/d/f")).unwrap(),
            b"ab",
            "short write applied half"
        );
    }
}
