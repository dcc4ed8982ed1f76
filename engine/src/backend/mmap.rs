//! Memory-mapped data files: the only `unsafe` code in the engine.
//!
//! A [`MappedFile`] is a data file (or, for a store without a directory, heap memory standing
//! in for one) mapped shared and read-only at its full, preallocated capacity. Records are
//! written with `pwrite` and read by borrowing from the map: on Linux both go through the one
//! page cache, so a read sees every write before it. As in LMDB's default mode, the map is
//! never writable, so no stray store through a pointer can reach the file, and the file's
//! pages count towards the process's memory only while reads use them.
//!
//! Syncing is by path, with `fsync` on the file (see `FileMaker::sync_files`). The one other
//! unsafe call here starts a written range's writeback early (`sync_file_range`), to pace it.
//!
//! # Safety argument
//!
//! Mapping a file is unsafe because the mapped bytes can change or vanish underneath Rust
//! references: another process may write or truncate the file, and touching a page past the
//! end of a truncated file raises SIGBUS. cairn rules both out for its own files:
//! - the engine's directory is locked (the WAL takes an exclusive `flock` before any data file
//!   is opened), so no other cairn process opens these files, and they are not for anyone
//!   else to edit while the engine runs, as with bbolt or LMDB files;
//! - a file is sized to its capacity (`fallocate`, so the blocks exist) before it is mapped,
//!   and cairn never shrinks a mapped file: a file leaves the engine only by being dropped
//!   from the set and then deleted, and deleting a mapped file leaves the mapping valid; the
//!   one file ever shortened, a defragmentation's last, is unmapped first and mapped again
//!   after (`shrink`);
//! - cairn's own writes only append past the end of the records already read (`Active` keeps
//!   the length), so bytes a reader borrows never change while it holds them.

#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use memmap2::{Mmap, MmapOptions, UncheckedAdvice};

/// A mapped data file, or heap memory standing in for one.
#[derive(Debug)]
pub(crate) enum MappedFile {
    File {
        map: Mmap,
        file: File,
    },
    /// For a store without a directory.
    Heap(Box<[u8]>),
}

fn preallocate(file: &File, len: u64) -> io::Result<()> {
    match rustix::fs::fallocate(file, rustix::fs::FallocateFlags::empty(), 0, len) {
        Ok(()) => Ok(()),
        // File systems that cannot fallocate (tmpfs on old kernels, some FUSE): a sized
        // sparse file.
        Err(e) if e == rustix::io::Errno::OPNOTSUPP || e == rustix::io::Errno::NOSYS => {
            if file.metadata()?.len() < len {
                file.set_len(len)?;
            }
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

impl MappedFile {
    /// Creates `path` (which must not exist) with `capacity` bytes allocated, and maps it.
    pub(crate) fn create(path: &Path, capacity: u64) -> io::Result<MappedFile> {
        // Private to the member's user, as etcd's database is (0600).
        let file = std::os::unix::fs::OpenOptionsExt::mode(&mut OpenOptions::new(), 0o600)
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)?;
        if let Err(e) = preallocate(&file, capacity) {
            // No room (a full disk): leave no empty file behind to trip over later.
            drop(file);
            let _ = std::fs::remove_file(path);
            return Err(e);
        }
        Self::map(file, capacity)
    }

    /// Maps an existing data file at its full size.
    pub(crate) fn open(path: &Path) -> io::Result<MappedFile> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        let len = file.metadata()?.len();
        Self::map(file, len)
    }

    fn map(file: File, len: u64) -> io::Result<MappedFile> {
        let len = usize::try_from(len).map_err(|_| io::Error::other("data file too large to map"))?;
        // SAFETY: see the module docs: the file is cairn's alone and at least `len` bytes long
        // (it was preallocated or its size just read), and it is never shrunk while mapped.
        let map = unsafe { MmapOptions::new().len(len).map(&file)? };
        Ok(MappedFile::File { map, file })
    }

    /// Shrinks the file to `len` bytes: the map is dropped before the file is cut and a new
    /// one made after, so no map ever reaches past the end.
    pub(crate) fn shrink(self, len: u64) -> io::Result<MappedFile> {
        match self {
            MappedFile::File { map, file } => {
                drop(map);
                file.set_len(len)?;
                Self::map(file, len)
            }
            heap => Ok(heap),
        }
    }

    /// Zeroed heap memory of `capacity` bytes (allocated lazily by the OS), for a store
    /// without a directory.
    pub(crate) fn heap(capacity: usize) -> MappedFile {
        MappedFile::Heap(vec![0; capacity].into_boxed_slice())
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            MappedFile::File { map, .. } => map,
            MappedFile::Heap(b) => b,
        }
    }

    /// Writes `bytes` at `offset`, which must be past every byte a reader may hold (see the
    /// module docs) and within the capacity.
    pub(crate) fn write_at(&mut self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        let end = offset
            .checked_add(bytes.len() as u64)
            .filter(|end| *end <= self.capacity())
            .ok_or_else(|| io::Error::other("write past the data file's capacity"))?;
        match self {
            MappedFile::File { file, .. } => file.write_all_at(bytes, offset),
            MappedFile::Heap(b) => {
                let range = usize::try_from(offset).ok().zip(usize::try_from(end).ok());
                range
                    .and_then(|(start, end)| b.get_mut(start..end))
                    .ok_or_else(|| io::Error::other("write past the heap file"))?
                    .copy_from_slice(bytes);
                Ok(())
            }
        }
    }

    /// Starts writing `len` bytes at `offset` back to the disk, without waiting for them
    /// (`sync_file_range` with `SYNC_FILE_RANGE_WRITE`). Best effort, for pacing: the
    /// checkpoint's `fdatasync` then finds little left to write, instead of every byte since
    /// the last one at once, which the WAL's syncs on the same disk would queue behind.
    pub(crate) fn start_writeback(&self, offset: u64, len: u64) {
        #[cfg(target_os = "linux")]
        if let MappedFile::File { file, .. } = self {
            use std::os::fd::AsRawFd;
            let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
                return;
            };
            // SAFETY: the call reads no memory of this process; the descriptor is the open
            // file's, borrowed for the call.
            let done = unsafe { libc::sync_file_range(file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE) };
            if done != 0 {
                tracing::debug!(error = %io::Error::last_os_error(), "cannot start a data file's writeback");
            }
        }
        #[cfg(not(target_os = "linux"))]
        let _ = (offset, len);
    }

    /// Makes what was written so far durable (`fdatasync`).
    pub(crate) fn sync(&self) -> io::Result<()> {
        match self {
            MappedFile::File { file, .. } => file.sync_data(),
            MappedFile::Heap(_) => Ok(()),
        }
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.bytes().len() as u64
    }

    /// Tells the kernel this process is done with the pages it touched (after scanning the
    /// whole file on open): they leave its resident set but stay in the page cache, and a
    /// later read maps them again.
    pub(crate) fn release_pages(&self) {
        if let MappedFile::File { map, .. } = self {
            // SAFETY: for a shared, read-only file mapping, MADV_DONTNEED only drops this
            // process's page table entries: the next access reads the same bytes back from the
            // page cache or the file, so no borrowed slice can observe a change.
            if let Err(e) = unsafe { map.unchecked_advise(UncheckedAdvice::DontNeed) } {
                tracing::debug!(error = %e, "madvise(DONTNEED) on a data file failed");
            }
        }
    }
}
