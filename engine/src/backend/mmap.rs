//! Memory-mapped data files: the only `unsafe` code in the engine.
//!
//! A [`MappedFile`] is a data file (or, for a store without a directory, anonymous memory)
//! mapped shared and writable at its full, preallocated capacity. Records are written by
//! copying into the map and read by borrowing from it. Syncing is by path, with `fsync` on
//! the file, which on Linux also writes back pages dirtied through shared mappings.
//!
//! # Safety argument
//!
//! Mapping a file is unsafe because the mapped bytes can change or vanish underneath Rust
//! references: another process may write or truncate the file, and touching a page past the
//! end of a truncated file raises SIGBUS. cairn rules both out for its own files:
//! - the engine's directory is locked (the WAL takes an exclusive `flock` before any data file
//!   is opened), so no other cairn process opens these files, and they are not for anyone
//!   else to edit while the engine runs, as with bbolt or LMDB files;
//! - a file is sized to its capacity (`fallocate`, so the blocks exist and a write cannot hit
//!   ENOSPC through the map) before it is mapped, and cairn never shrinks a mapped file: a
//!   file leaves the engine only by being dropped from the set and then deleted, and deleting
//!   a mapped file leaves the mapping valid;
//! - all access goes through `&self`/`&mut self` of the owning `MappedFile`, so Rust's borrow
//!   rules order the engine's own reads and writes.

#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;

use memmap2::{MmapMut, MmapOptions};

/// A mapped data file, or heap memory standing in for one.
#[derive(Debug)]
pub(crate) enum MappedFile {
    /// The file's descriptor is not kept: the mapping outlives it.
    File(MmapMut),
    /// For a store without a directory.
    Heap(Box<[u8]>),
}

fn preallocate(file: &File, len: u64) -> io::Result<()> {
    match rustix::fs::fallocate(file, rustix::fs::FallocateFlags::empty(), 0, len) {
        Ok(()) => Ok(()),
        // File systems that cannot fallocate (tmpfs on old kernels, some FUSE): a sized
        // sparse file, at the risk of ENOSPC surfacing as SIGBUS on such file systems only.
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
        let file = OpenOptions::new().read(true).write(true).create_new(true).open(path)?;
        preallocate(&file, capacity)?;
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
        let map = unsafe { MmapOptions::new().len(len).map_mut(&file)? };
        Ok(MappedFile::File(map))
    }

    /// Zeroed heap memory of `capacity` bytes (allocated lazily by the OS), for a store
    /// without a directory.
    pub(crate) fn heap(capacity: usize) -> MappedFile {
        MappedFile::Heap(vec![0; capacity].into_boxed_slice())
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            MappedFile::File(map) => map,
            MappedFile::Heap(b) => b,
        }
    }

    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            MappedFile::File(map) => map,
            MappedFile::Heap(b) => b,
        }
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.bytes().len() as u64
    }
}
