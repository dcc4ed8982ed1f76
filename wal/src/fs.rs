//! The small file-system interface the log does all of its I/O through.
//!
//! [`StdFs`] is the real thing. [`crate::SimFs`] is an in-memory implementation that can lose
//! unsynced bytes, tear writes and fail calls, so crash and error handling can be tested
//! deterministically. The log needs nothing beyond these calls.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::Path;

/// A file opened for reading and writing. Calls take `&self`: the log writes a segment from one
/// thread and fdatasyncs it from another.
pub trait WalFile: Send + Sync + fmt::Debug {
    /// Reads the whole file.
    fn read_all(&self) -> io::Result<Vec<u8>>;
    /// Writes all of `buf` at `offset`.
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// fdatasync: makes written data, and the size needed to read it, durable.
    fn sync_data(&self) -> io::Result<()>;
    /// Sets the file's length; new bytes read as zero. Not durable until synced.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Reserves `len` zero-filled bytes for the file and makes the new size durable.
    fn preallocate(&self, len: u64) -> io::Result<()>;
}

/// A held lock on a log directory; dropping it releases the lock.
pub trait DirLock: Send + fmt::Debug {}

/// Directory and file operations.
pub trait FileSystem: Send + Sync + fmt::Debug {
    /// Creates `dir` and any missing ancestors. New entries are durable only once their parent
    /// directory is synced with [`FileSystem::sync_dir`].
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// The names of the entries of `dir`.
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// Creates `path`, truncating any existing file.
    fn create(&self, path: &Path) -> io::Result<Box<dyn WalFile>>;
    /// Opens an existing file for reading and writing.
    fn open(&self, path: &Path) -> io::Result<Box<dyn WalFile>>;
    /// Renames `from` to `to`, replacing any file at `to`. Durable once the directory is synced.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Removes the file at `path`. Durable once the directory is synced.
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// fsyncs the directory, making creations, renames and removals in it durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Takes an exclusive lock on `dir`, failing if another holder has it.
    fn lock_dir(&self, dir: &Path) -> io::Result<Box<dyn DirLock>>;
}

/// The operating system's file system.
#[derive(Debug, Default, Clone, Copy)]
pub struct StdFs;

#[derive(Debug)]
struct StdFile(File);

impl WalFile for StdFile {
    fn read_all(&self) -> io::Result<Vec<u8>> {
        let mut buf = Vec::new();
        let mut f = &self.0;
        let _ = io::Seek::seek(&mut f, io::SeekFrom::Start(0))?;
        f.read_to_end(&mut buf)?;
        Ok(buf)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.0.write_all_at(buf, offset)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }

    fn preallocate(&self, len: u64) -> io::Result<()> {
        match rustix::fs::fallocate(&self.0, rustix::fs::FallocateFlags::empty(), 0, len) {
            Ok(()) => {}
            // Some file systems (tmpfs on old kernels, some FUSE) cannot fallocate: a sized
            // sparse file still reads as zeros, which is all recovery relies on.
            Err(e) if e == rustix::io::Errno::OPNOTSUPP || e == rustix::io::Errno::NOSYS => {
                if self.0.metadata()?.len() < len {
                    self.0.set_len(len)?;
                }
            }
            Err(e) => return Err(e.into()),
        }
        self.0.sync_all()
    }
}

#[derive(Debug)]
struct StdLock(#[allow(dead_code)] File);

impl DirLock for StdLock {}

impl FileSystem for StdFs {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        // Private to the member's user, as etcd makes its data directories (0700).
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700).create(dir)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            if let Ok(name) = entry?.file_name().into_string() {
                names.push(name);
            }
        }
        Ok(names)
    }

    fn create(&self, path: &Path) -> io::Result<Box<dyn WalFile>> {
        // Private to the member's user, as etcd's files are (0600).
        let f = std::os::unix::fs::OpenOptionsExt::mode(&mut OpenOptions::new(), 0o600)
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        Ok(Box::new(StdFile(f)))
    }

    fn open(&self, path: &Path) -> io::Result<Box<dyn WalFile>> {
        let f = OpenOptions::new().read(true).write(true).open(path)?;
        Ok(Box::new(StdFile(f)))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }

    fn lock_dir(&self, dir: &Path) -> io::Result<Box<dyn DirLock>> {
        let f = std::os::unix::fs::OpenOptionsExt::mode(&mut OpenOptions::new(), 0o600)
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.join("LOCK"))?;
        rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive)?;
        Ok(Box::new(StdLock(f)))
    }
}
