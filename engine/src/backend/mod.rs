//! The backend: per-revision records in append-only, memory-mapped data files.
//!
//! Every change the store makes (a put or a tombstone) is appended as one [`record`] to the
//! active data file and read back through its map; the store's revision log remembers where
//! each record lives ([`Loc`]). Files are preallocated at `file_size` bytes and named
//! `data/{id:08x}.dat`; when the active file is full it is sealed (never written again) and a
//! new one started.
//!
//! **Durability** comes from the WAL, not from these files: appends are not synced one by
//! one. A checkpoint syncs the files and records the *layout*, each file's id and length in
//! scan order, together with the applied index. Opening maps the layout's files, ignores bytes
//! past each length (appends after the checkpoint, replayed again from the WAL), deletes files
//! the layout does not name, and rebuilds the key index by scanning the records in order.
//!
//! **Defragmentation** copies the records still in history into fresh files while the store
//! keeps serving (`Maintenance::defragment`, through the protocol in `mvcc/defrag.rs`),
//! then switches the layout: the fresh files replace the old ones, which are deleted once a
//! checkpoint naming the new layout is durable.

mod mmap;
pub(crate) mod record;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use mmap::MappedFile;
use record::Record;

use crate::error::{Error, Failure, Result};

/// Where a record lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Loc {
    pub(crate) file: u32,
    pub(crate) offset: u32,
    /// Padded length.
    pub(crate) len: u32,
}

/// Bytes a file is cut by per step when it is deleted.
const DELETE_STEP: u64 = 4 << 20;

/// Deletes a data file by cutting it down a few MiB at a time first: freeing a big file's
/// blocks in one go is one long file-system transaction, which every `fdatasync` of the WAL
/// would wait behind. With `paced` (a defragmentation's old files, deleted while writes go
/// on), it rests after each cut at least as long as the cut took, so the WAL's syncs get in
/// between: cut back to back, those files held the disk for a tenth of a second. The apply
/// thread, deleting the files a snapshot replaced, does not rest: applies wait for it.
pub(crate) fn delete_gradually(path: &Path, paced: bool) -> std::io::Result<()> {
    let file = std::fs::OpenOptions::new().write(true).open(path)?;
    let mut len = file.metadata()?.len();
    while len > DELETE_STEP {
        let started = std::time::Instant::now();
        len -= DELETE_STEP;
        file.set_len(len)?;
        if paced {
            std::thread::sleep(started.elapsed().max(DELETE_REST));
        }
    }
    drop(file);
    std::fs::remove_file(path)
}

/// The least rest between two cuts of a paced [`delete_gradually`].
const DELETE_REST: std::time::Duration = std::time::Duration::from_millis(1);

/// Where the layout ended at some point: the active file and its length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Mark {
    id: u32,
    len: u64,
}

/// One data file of a layout, as a checkpoint records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FileLen {
    pub(crate) id: u32,
    /// Bytes of records in the file; anything after is not part of the state.
    pub(crate) len: u64,
}

/// The directory of the data files, under the engine's directory.
pub(crate) const DATA_DIR: &str = "data";

fn file_name(id: u32) -> String {
    format!("{id:08x}.dat")
}

/// The path of data file `id` in `data_dir`.
pub(crate) fn file_path(data_dir: &Path, id: u32) -> PathBuf {
    data_dir.join(file_name(id))
}

fn io_error(what: String) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::Backend(Failure::caused_by(what, e))
}

/// A file still being appended to. New records collect in a buffer and are written in one
/// `pwrite` when it fills (or before a checkpoint or seal), not one system call per record;
/// reads of records still in the buffer are served from it.
#[derive(Debug)]
pub(crate) struct Active {
    id: u32,
    map: MappedFile,
    /// Bytes written to the file. Invariant: a record boundary.
    flushed: u64,
    /// Records after `flushed`, not yet written.
    buf: Vec<u8>,
    /// `flushed + buf.len()`.
    len: u64,
    /// Bytes whose writeback has been started ([`MappedFile::start_writeback`]).
    written_back: u64,
}

/// Records buffered before a write.
const WRITE_BUFFER: usize = 256 << 10;

/// Writeback of what is written starts every this many bytes, so that a checkpoint's sync
/// finds little to write (RocksDB's `bytes_per_sync`).
const WRITEBACK_STEP: u64 = 1 << 20;

impl Active {
    fn new(id: u32, map: MappedFile, len: u64) -> Active {
        Active {
            id,
            map,
            flushed: len,
            buf: Vec::new(),
            len,
            written_back: len,
        }
    }

    fn create(dir: Option<&Path>, id: u32, capacity: u64) -> Result<Active> {
        let map = match dir {
            Some(dir) => {
                let path = file_path(dir, id);
                MappedFile::create(&path, capacity).map_err(io_error(format!("create {}", path.display())))?
            }
            None => MappedFile::heap(
                usize::try_from(capacity).map_err(|_| Error::Backend(Failure::new("data file size too large")))?,
            ),
        };
        Ok(Active::new(id, map, 0))
    }

    /// Appends `record`; `Ok(None)` if it does not fit.
    fn append(&mut self, record: &Record<'_>) -> Result<Option<Loc>> {
        let len = record.padded_len();
        let end = self.len + len as u64;
        if end > self.map.capacity() {
            return Ok(None);
        }
        let (Ok(offset), Ok(len32)) = (u32::try_from(self.len), u32::try_from(len)) else {
            return Ok(None);
        };
        let at = self.buf.len();
        self.buf.resize(at + len, 0);
        let out = self.buf.get_mut(at..).unwrap_or_default();
        if record.encode_into(out).is_none() {
            self.buf.truncate(at);
            return Err(Error::internal("a record does not encode"));
        }
        self.len = end;
        if self.buf.len() >= WRITE_BUFFER {
            self.flush()?;
        }
        Ok(Some(Loc {
            file: self.id,
            offset,
            len: len32,
        }))
    }

    /// Writes the buffered records to the file.
    fn flush(&mut self) -> Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        self.map
            .write_at(self.flushed, &self.buf)
            .map_err(io_error(format!("write data file {}", file_name(self.id))))?;
        self.flushed = self.len;
        self.buf.clear();
        if self.flushed - self.written_back >= WRITEBACK_STEP {
            self.map
                .start_writeback(self.written_back, self.flushed - self.written_back);
            self.written_back = self.flushed;
        }
        Ok(())
    }

    fn read(&self, loc: Loc) -> Result<Record<'_>> {
        match u64::from(loc.offset).checked_sub(self.flushed) {
            Some(in_buf) => read_at(
                &self.buf,
                self.buf.len() as u64,
                Loc {
                    offset: u32::try_from(in_buf).unwrap_or(u32::MAX),
                    ..loc
                },
            ),
            None => read_at(self.map.bytes(), self.flushed, loc),
        }
    }

    /// Forgets everything after `len`.
    fn cut(&mut self, len: u64) {
        match len.checked_sub(self.flushed) {
            Some(in_buf) => self.buf.truncate(usize::try_from(in_buf).unwrap_or(usize::MAX)),
            None => {
                // Bytes past `len` on disk are overwritten by the next records.
                self.buf.clear();
                self.flushed = len;
            }
        }
        self.len = len;
        self.written_back = self.written_back.min(len);
    }

    /// Writes what is buffered and makes it durable.
    pub(crate) fn sync(&mut self) -> Result<()> {
        self.flush()?;
        self.map
            .sync()
            .map_err(io_error(format!("fsync data file {}", file_name(self.id))))
    }

    /// Bytes appended so far.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Writes what is buffered and seals the file.
    pub(crate) fn seal(mut self) -> Result<(u32, Sealed)> {
        self.flush()?;
        let sealed = Sealed {
            map: Arc::new(self.map),
            len: self.len,
        };
        Ok((self.id, sealed))
    }
}

/// A file no longer written: shared, so defragmentation can read it without the store's lock.
#[derive(Clone, Debug)]
pub(crate) struct Sealed {
    map: Arc<MappedFile>,
    len: u64,
}

impl Sealed {
    /// The record at `loc`, which must be in this file.
    pub(crate) fn read(&self, loc: Loc) -> Result<Record<'_>> {
        read_at(self.map.bytes(), self.len, loc)
    }
}

fn read_at(bytes: &[u8], len: u64, loc: Loc) -> Result<Record<'_>> {
    let end = u64::from(loc.offset) + u64::from(loc.len);
    let slice = (end <= len)
        .then(|| bytes.get(loc.offset as usize..end as usize))
        .flatten()
        .ok_or_else(|| Error::internal(format!("record {loc:?} is outside its file")))?;
    record::decode(slice)
        .map(|(r, _)| r)
        .map_err(|e| Error::Backend(Failure::caused_by(format!("record {loc:?}"), e)))
}

/// Decodes the record at the start of `rest`, which is at `offset` of data file `id`: where it
/// lies, and the record.
fn record_at(id: u32, offset: u64, rest: &[u8]) -> Result<(Loc, Record<'_>)> {
    let (record, used) = record::decode(rest).map_err(|e| {
        Error::Backend(Failure::new(format!(
            "data file {} is damaged at offset {offset}: {e}",
            file_name(id)
        )))
    })?;
    let loc = Loc {
        file: id,
        offset: offset as u32,
        len: used as u32,
    };
    Ok((loc, record))
}

/// Calls `f` with every record of data file `id` in `data_dir` from byte `from` to byte `to`,
/// with the checksum it stores, until `f` says to stop (false). Read with `pread` a few MiB
/// at a time, not mapped: a thread without the store's lock (the saved index's writer) reads
/// files a defragmentation may cut and delete meanwhile, which is then an error, not a fault.
pub(crate) fn read_records(
    data_dir: &Path,
    id: u32,
    (from, to): (u64, u64),
    mut f: impl FnMut(Loc, u32, Record<'_>) -> bool,
) -> Result<()> {
    use std::os::unix::fs::FileExt;
    const READ: usize = 4 << 20;
    let path = file_path(data_dir, id);
    let file = std::fs::File::open(&path).map_err(io_error(format!("open {}", path.display())))?;
    let mut buf: Vec<u8> = Vec::new();
    // `buf` holds the file's bytes from `start`; records are decoded from `at` on.
    let (mut start, mut at) = (from, 0usize);
    while start + (at as u64) < to {
        let rest = buf.get(at..).unwrap_or_default();
        let need = record::padded(record::u32_at(rest, 0) as usize).max(record::HEADER_LEN);
        if rest.len() < need {
            // Keep what is left, then read on.
            buf.drain(..at);
            start += at as u64;
            at = 0;
            let left = to - start - buf.len() as u64;
            if left == 0 {
                return Err(Error::Backend(Failure::new(format!(
                    "data file {} ends inside a record at offset {start}",
                    file_name(id),
                ))));
            }
            let have = buf.len();
            buf.resize(have + (need.max(READ) as u64).min(left) as usize, 0);
            file.read_exact_at(buf.get_mut(have..).unwrap_or_default(), start + have as u64)
                .map_err(io_error(format!("read {}", path.display())))?;
            continue;
        }
        let (loc, record) = record_at(id, start + at as u64, rest)?;
        if !f(loc, record::u32_at(rest, 4), record) {
            break;
        }
        at += loc.len as usize;
    }
    Ok(())
}

/// Files for new records: where and how big, and the next free id (shared with
/// defragmentation, which creates files without the store's lock).
#[derive(Clone, Debug)]
pub(crate) struct FileMaker {
    dir: Option<PathBuf>,
    file_size: u64,
    next_id: Arc<AtomicU32>,
}

impl FileMaker {
    /// A new file of the configured size, or bigger if `needed` bytes (one large record)
    /// would not fit.
    pub(crate) fn create(&self, needed: usize) -> Result<Active> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let needed = (needed as u64).div_ceil(4096) * 4096;
        Active::create(self.dir.as_deref(), id, self.file_size.max(needed))
    }

    /// Seals a file that will never be appended to, cut down to the pages its records use.
    pub(crate) fn finish(&self, mut active: Active) -> Result<(u32, Sealed)> {
        active.flush()?;
        let Active { id, map, len, .. } = active;
        let map = match &self.dir {
            Some(dir) => {
                let path = file_path(dir, id);
                map.shrink(len.div_ceil(4096).max(1) * 4096)
                    .map_err(io_error(format!("shrink {}", path.display())))?
            }
            None => map,
        };
        Active::new(id, map, len).seal()
    }

    /// Appends `record` to `active`, first sealing it into `sealed` and starting a new file if
    /// it is full.
    pub(crate) fn append(&self, active: &mut Active, record: &Record<'_>) -> Result<(Loc, Option<(u32, Sealed)>)> {
        if let Some(loc) = active.append(record)? {
            return Ok((loc, None));
        }
        let full = std::mem::replace(active, self.create(record.padded_len())?);
        let loc = active
            .append(record)?
            .ok_or_else(|| Error::internal("a record does not fit a new data file"))?;
        Ok((loc, Some(full.seal()?)))
    }

    /// Syncs data files to disk, then their directory, so a checkpoint can name them.
    pub(crate) fn sync_files(data_dir: &Path, files: &[FileLen]) -> Result<()> {
        for f in files {
            let path = file_path(data_dir, f.id);
            std::fs::File::open(&path)
                .and_then(|file| file.sync_data())
                .map_err(io_error(format!("fsync {}", path.display())))?;
        }
        std::fs::File::open(data_dir)
            .and_then(|d| d.sync_all())
            .map_err(io_error(format!("fsync {}", data_dir.display())))
    }
}

/// The data files of a store (see the module docs).
#[derive(Debug)]
pub(crate) struct Backend {
    maker: FileMaker,
    /// Every sealed file records may point into: the layout's, and a defragmentation's new
    /// ones before the switch.
    sealed: BTreeMap<u32, Sealed>,
    /// Sealed files that make up the state, in scan order; the active file follows them.
    layout: Vec<u32>,
    active: Active,
}

impl Backend {
    /// A backend in anonymous memory: nothing survives the process.
    pub(crate) fn in_memory(file_size: usize) -> Backend {
        let maker = FileMaker {
            dir: None,
            file_size: file_size as u64,
            next_id: Arc::new(AtomicU32::new(1)),
        };
        let active = Active::new(0, MappedFile::heap(file_size), 0);
        Backend {
            maker,
            sealed: BTreeMap::new(),
            layout: Vec::new(),
            active,
        }
    }

    /// Opens the data files of `data_dir` in `layout` (none: a new, empty backend); files it
    /// does not name are deleted.
    pub(crate) fn open(data_dir: &Path, file_size: u64, layout: &[FileLen]) -> Result<Backend> {
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
            .create(data_dir)
            .map_err(io_error(format!("create {}", data_dir.display())))?;
        let listed: std::collections::BTreeSet<u32> = layout.iter().map(|f| f.id).collect();
        // Ids of removed files are free again: only the layout's count.
        let max_id = layout.iter().map(|f| f.id).max();
        let entries = std::fs::read_dir(data_dir).map_err(io_error(format!("list {}", data_dir.display())))?;
        for entry in entries {
            let entry = entry.map_err(io_error(format!("list {}", data_dir.display())))?;
            let name = entry.file_name();
            let id = name
                .to_str()
                .and_then(|n| n.strip_suffix(".dat"))
                .and_then(|n| u32::from_str_radix(n, 16).ok());
            if id.is_some_and(|id| listed.contains(&id)) {
                continue;
            }
            // Not part of the checkpointed state: written after it (the WAL replays it) or
            // left by an unfinished defragmentation.
            tracing::info!(file = ?entry.path(), "removing a data file the checkpoint does not name");
            std::fs::remove_file(entry.path()).map_err(io_error(format!("remove {:?}", entry.path())))?;
        }
        let maker = FileMaker {
            dir: Some(data_dir.to_path_buf()),
            file_size,
            next_id: Arc::new(AtomicU32::new(max_id.map_or(0, |id| id.saturating_add(1)))),
        };
        let mut sealed = BTreeMap::new();
        let mut maps = Vec::with_capacity(layout.len());
        for f in layout {
            let path = file_path(data_dir, f.id);
            let map = MappedFile::open(&path).map_err(io_error(format!("open {}", path.display())))?;
            if map.capacity() < f.len {
                return Err(Error::Backend(Failure::new(format!(
                    "{} holds {} bytes, but the checkpoint counts {}",
                    path.display(),
                    map.capacity(),
                    f.len
                ))));
            }
            maps.push((f.id, map, f.len));
        }
        let active = match maps.pop() {
            Some((id, map, len)) => Active::new(id, map, len),
            None => maker.create(0)?,
        };
        let mut order = Vec::with_capacity(maps.len());
        for (id, map, len) in maps {
            sealed.insert(
                id,
                Sealed {
                    map: Arc::new(map),
                    len,
                },
            );
            order.push(id);
        }
        Ok(Backend {
            maker,
            sealed,
            layout: order,
            active,
        })
    }

    /// An empty backend whose files `maker` creates: beside a live one in the same directory
    /// (new file ids), for a state that may replace it.
    pub(crate) fn fresh(maker: FileMaker) -> Result<Backend> {
        let active = maker.create(0)?;
        Ok(Backend {
            maker,
            sealed: BTreeMap::new(),
            layout: Vec::new(),
            active,
        })
    }

    /// What creates this backend's files.
    pub(crate) fn maker(&self) -> FileMaker {
        self.maker.clone()
    }

    /// The paths of every file of this backend, to delete once it is replaced (none in
    /// memory).
    pub(crate) fn file_paths(&self) -> Vec<PathBuf> {
        let Some(dir) = self.dir() else {
            return Vec::new();
        };
        self.sealed
            .keys()
            .chain(std::iter::once(&self.active.id))
            .map(|id| file_path(dir, *id))
            .collect()
    }

    pub(crate) fn append(&mut self, record: &Record<'_>) -> Result<Loc> {
        let (loc, full) = self.maker.append(&mut self.active, record)?;
        if let Some((id, sealed)) = full {
            self.sealed.insert(id, sealed);
            self.layout.push(id);
        }
        Ok(loc)
    }

    /// Where the files end now, to cut off what is appended after (see [`Backend::rollback`]).
    pub(crate) fn mark(&self) -> Mark {
        Mark {
            id: self.active.id,
            len: self.active.len,
        }
    }

    /// Forgets every record appended since `mark` (their write request was abandoned): files
    /// end where they ended then, and files started since are left empty.
    pub(crate) fn rollback(&mut self, mark: Mark) {
        if self.active.id == mark.id {
            self.active.cut(mark.len);
            return;
        }
        self.active.cut(0);
        for id in &self.layout {
            if let Some(file) = self.sealed.get_mut(id) {
                if *id == mark.id {
                    file.len = mark.len;
                } else if *id > mark.id {
                    file.len = 0;
                }
            }
        }
    }

    /// The record at `loc`.
    pub(crate) fn read(&self, loc: Loc) -> Result<Record<'_>> {
        if loc.file == self.active.id {
            return self.active.read(loc);
        }
        self.sealed
            .get(&loc.file)
            .ok_or_else(|| Error::internal(format!("record {loc:?} names an unknown data file")))?
            .read(loc)
    }

    /// Writes buffered records to the active file (before a checkpoint names its length).
    pub(crate) fn flush(&mut self) -> Result<()> {
        self.active.flush()
    }

    /// Drops the pages of every file from this process's resident set (see
    /// [`MappedFile::release_pages`]).
    pub(crate) fn release_pages(&self) {
        for file in self.sealed.values() {
            file.map.release_pages();
        }
        self.active.map.release_pages();
    }

    /// The files that make up the state and their lengths, in scan order. Call
    /// [`Backend::flush`] first when the files must hold them.
    pub(crate) fn layout(&self) -> Vec<FileLen> {
        let sealed = self
            .layout
            .iter()
            .filter_map(|id| self.sealed.get(id).map(|s| FileLen { id: *id, len: s.len }));
        sealed
            .chain(std::iter::once(FileLen {
                id: self.active.id,
                len: self.active.len,
            }))
            .collect()
    }

    /// Bytes of records the data files hold, history no longer kept included, in whole 4 KiB
    /// pages per file (at least one: never 0, as etcd's file never is, so ratios of in-use to
    /// total that tools compute stay defined); not the space preallocated past the active
    /// file's end (an empty member holds 4 KiB, not `data_file_size`).
    pub(crate) fn held_bytes(&self) -> u64 {
        const PAGE: u64 = 4096;
        let pages = |len: u64| len.div_ceil(PAGE).max(1) * PAGE;
        self.sealed.values().map(|s| pages(s.len)).sum::<u64>() + pages(self.active.len)
    }

    /// Calls `f` with every record of the layout, in order.
    pub(crate) fn scan(&self, f: impl FnMut(Loc, Record<'_>) -> Result<()>) -> Result<()> {
        self.scan_after(&[], f)
    }

    /// Calls `f` with every record of the layout after `covered`, in order: the first file
    /// after its first `covered[0]` bytes, and so on (a prefix of the layout, as
    /// [`Backend::covers`] checks).
    pub(crate) fn scan_after(&self, covered: &[u64], mut f: impl FnMut(Loc, Record<'_>) -> Result<()>) -> Result<()> {
        let files = self
            .layout
            .iter()
            .filter_map(|id| self.sealed.get(id).map(|s| (*id, s.map.bytes(), s.len)))
            .chain(std::iter::once((
                self.active.id,
                self.active.map.bytes(),
                self.active.len,
            )));
        for (i, (id, bytes, len)) in files.enumerate() {
            let mut offset = covered.get(i).copied().unwrap_or_default();
            while offset < len {
                let rest = bytes.get(offset as usize..len as usize).unwrap_or_default();
                let (loc, record) = record_at(id, offset, rest)?;
                f(loc, record)?;
                offset += u64::from(loc.len);
            }
        }
        Ok(())
    }

    /// The checksum stored in the record at `offset` of file `id`, and where the record ends;
    /// `None` if there is no such file or no record header there.
    pub(crate) fn stored_crc(&self, id: u32, offset: u64) -> Option<(u32, u64)> {
        let (bytes, len) = if id == self.active.id {
            (self.active.map.bytes(), self.active.flushed)
        } else {
            let file = self.sealed.get(&id)?;
            (file.map.bytes(), file.len)
        };
        let header = bytes.get(offset as usize..(offset as usize).checked_add(8)?.min(len as usize))?;
        let word = |at: usize| header.get(at..at + 4)?.try_into().ok().map(u32::from_le_bytes);
        let end = offset + record::padded(word(0)? as usize) as u64;
        Some((word(4)?, end))
    }

    /// The data directory; `None` in memory.
    pub(crate) fn dir(&self) -> Option<&Path> {
        self.maker.dir.as_deref()
    }

    /// Starts a defragmentation: seals the active file (writes go on in a new one) and returns
    /// the files to copy from, with a maker for the new files.
    pub(crate) fn begin_defrag(&mut self) -> Result<(Vec<(u32, Sealed)>, FileMaker)> {
        // A small file for the writes made meanwhile, so that defragmenting a small store does
        // not leave it bigger; the next file has the full size again.
        let id = self.maker.next_id.fetch_add(1, Ordering::Relaxed);
        let small = (self.maker.file_size / 16).max(1 << 20).min(self.maker.file_size);
        let fresh = Active::create(self.maker.dir.as_deref(), id, small)?;
        let (id, sealed) = std::mem::replace(&mut self.active, fresh).seal()?;
        self.sealed.insert(id, sealed);
        self.layout.push(id);
        let old = self
            .layout
            .iter()
            .filter_map(|id| self.sealed.get(id).map(|s| (*id, s.clone())))
            .collect();
        Ok((old, self.maker.clone()))
    }

    /// Makes a new sealed file readable (records may point into it from now on).
    pub(crate) fn register(&mut self, id: u32, file: Sealed) {
        self.sealed.insert(id, file);
    }

    /// Finishes a defragmentation: the `fresh` files replace the `old` ones at the head of the
    /// layout. Returns the paths of the old files, to delete once a checkpoint naming the new
    /// layout is durable.
    pub(crate) fn switch(&mut self, old: &[u32], fresh: &[u32]) -> Vec<PathBuf> {
        let mut layout = fresh.to_vec();
        layout.extend(self.layout.iter().filter(|id| !old.contains(id)));
        self.layout = layout;
        let mut paths = Vec::new();
        for id in old {
            self.sealed.remove(id);
            if let Some(dir) = self.dir() {
                paths.push(file_path(dir, *id));
            }
        }
        paths
    }
}
