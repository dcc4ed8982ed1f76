//! The saved key index (`index`, beside the checkpoint): what opening needs of the data files
//! without reading their values. It holds every key still in history, in key order, with its
//! generations, each revision's record location, and the lease of its current value, as the
//! data files up to a position (the *cover*) and a compaction make them. Opening loads it,
//! then scans only the records after the cover (see `mvcc::saved_index`).
//!
//! ```text
//! offset  size  field
//! 0       8     magic "CAIRNIDX"
//! 8       4     format version, u32 LE (1)
//! 12      ...   blocks, one after another, each:
//!                 4    body length, u32 LE
//!                 4    crc32 of the body, u32 LE
//!                 4    keys in the block, u32 LE
//!                 len  body: per key, postcard of a key head, then of each generation's
//!                      head followed by its revisions (no nested vectors: nothing to
//!                      allocate but the key)
//! end-16-n n    the cover: postcard of [`CoverV1`]
//! end-16  4     cover length n, u32 LE
//! end-12  4     crc32 of the cover, u32 LE
//! end-8   8     magic "CAIRNEND"
//! ```
//!
//! Keys ascend strictly across the whole file. The cover names the layout epoch, the
//! compaction, the number of keys, and each data file covered with its covered length and
//! the offset and stored checksum of its last covered record, so that a file with the same id
//! but other contents (after a defragmentation, or a restored backup) is told apart.
//!
//! Crash safety: written to `index.tmp`, fsynced, renamed over `index`, the directory fsynced.
//! Whatever is wrong with the file (missing, torn, damaged, or a cover that does not match
//! the checkpoint's layout) makes opening fall back to scanning every record: the file is a
//! cache of the data files, never the only copy of anything.

use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

use crate::backend::Loc;
use crate::error::{Error, Failure, Result};
use crate::mvcc::key_index::{Generation, KeyIndex};
use crate::revision::Revision;

const MAGIC: &[u8; 8] = b"CAIRNIDX";
const END_MAGIC: &[u8; 8] = b"CAIRNEND";
const HEAD_LEN: u64 = 12;
const FOOTER_LEN: u64 = 16;
const BLOCK_HEAD_LEN: usize = 12;
/// Bytes of keys a block collects before it is written.
const BLOCK_BYTES: usize = 256 << 10;
/// The largest block or cover a reader accepts (a damaged length must not allocate wildly).
const MAX_PART: u32 = 64 << 20;
pub(crate) const NAME: &str = "index";
const TMP_NAME: &str = "index.tmp";

/// The format written (and the only one read so far).
const VERSION: u32 = 1;

/// What the saved index covers: the data files up to a position, compacted at `compacted`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Cover {
    /// The layout epoch (`format::checkpoint`) of the files covered.
    pub(crate) epoch: u64,
    pub(crate) compacted: i64,
    /// Keys in the file.
    pub(crate) keys: u64,
    /// The files covered, in layout order: all of each but the last, which may go on.
    pub(crate) files: Vec<CoveredFile>,
}

/// One data file, covered up to `len`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CoveredFile {
    pub(crate) id: u32,
    pub(crate) len: u64,
    /// The last record covered (none: nothing covered in this file).
    pub(crate) last: Option<LastRecord>,
}

/// Where the last covered record of a file starts, and the checksum it stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LastRecord {
    pub(crate) offset: u64,
    pub(crate) crc: u32,
}

#[derive(Serialize, Deserialize)]
struct CoverV1 {
    epoch: u64,
    compacted: i64,
    keys: u64,
    files: Vec<FileV1>,
}

#[derive(Serialize, Deserialize)]
struct FileV1 {
    id: u32,
    len: u64,
    /// The last record's offset and stored checksum.
    last: Option<(u64, u32)>,
}

#[derive(Serialize, Deserialize)]
struct KeyHeadV1<'a> {
    #[serde(borrow)]
    key: &'a [u8],
    /// The lease of the key's current value (0: none, or the key does not exist now).
    lease: i64,
    generations: u32,
}

#[derive(Serialize, Deserialize)]
struct GenerationHeadV1 {
    ver: i64,
    created: (i64, i64),
    revisions: u32,
}

#[derive(Serialize, Deserialize)]
struct RevisionV1 {
    main: i64,
    sub: i64,
    file: u32,
    offset: u32,
    len: u32,
}

impl From<&Cover> for CoverV1 {
    fn from(c: &Cover) -> CoverV1 {
        CoverV1 {
            epoch: c.epoch,
            compacted: c.compacted,
            keys: c.keys,
            files: c
                .files
                .iter()
                .map(|f| FileV1 {
                    id: f.id,
                    len: f.len,
                    last: f.last.map(|l| (l.offset, l.crc)),
                })
                .collect(),
        }
    }
}

impl From<CoverV1> for Cover {
    fn from(c: CoverV1) -> Cover {
        Cover {
            epoch: c.epoch,
            compacted: c.compacted,
            keys: c.keys,
            files: c
                .files
                .into_iter()
                .map(|f| CoveredFile {
                    id: f.id,
                    len: f.len,
                    last: f.last.map(|(offset, crc)| LastRecord { offset, crc }),
                })
                .collect(),
        }
    }
}

fn damaged(why: impl std::fmt::Display) -> Error {
    Error::Backend(Failure::new(format!("the saved index is damaged: {why}")))
}

fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::Backend(Failure::caused_by(what, e))
}

fn encode_error(e: postcard::Error) -> Error {
    Error::Backend(Failure::caused_by("encode the saved index", e))
}

/// Writes a saved index, key by key in ascending order, then its cover.
#[derive(Debug)]
pub(crate) struct Writer {
    out: BufWriter<File>,
    dir: PathBuf,
    block: Vec<u8>,
    in_block: u32,
    keys: u64,
}

impl Writer {
    /// Starts `index.tmp` in `dir`.
    pub(crate) fn create(dir: &Path) -> Result<Writer> {
        let file = std::os::unix::fs::OpenOptionsExt::mode(&mut OpenOptions::new(), 0o600)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.join(TMP_NAME))
            .map_err(io("create index.tmp"))?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        out.write_all(MAGIC).map_err(io("write index.tmp"))?;
        out.write_all(&VERSION.to_le_bytes()).map_err(io("write index.tmp"))?;
        Ok(Writer {
            out,
            dir: dir.to_path_buf(),
            block: Vec::with_capacity(BLOCK_BYTES + 4096),
            in_block: 0,
            keys: 0,
        })
    }

    /// Adds `key` (after every key added before) with its history and the lease of its
    /// current value; `loc` gives each revision's record.
    pub(crate) fn push(
        &mut self,
        key: &[u8],
        lease: i64,
        index: &KeyIndex,
        loc: impl Fn(&Revision) -> Option<Loc>,
    ) -> Result<()> {
        let block = std::mem::take(&mut self.block);
        let block = index.with_generations(|generations| -> Result<Vec<u8>> {
            let head = KeyHeadV1 {
                key,
                lease,
                generations: generations.len() as u32,
            };
            let mut block = postcard::to_extend(&head, block).map_err(encode_error)?;
            for g in generations {
                let head = GenerationHeadV1 {
                    ver: g.ver,
                    created: (g.created.main, g.created.sub),
                    revisions: g.revs.len() as u32,
                };
                block = postcard::to_extend(&head, block).map_err(encode_error)?;
                for rev in &g.revs {
                    let l = loc(rev).ok_or_else(|| Error::internal(format!("revision {rev} has no record")))?;
                    let r = RevisionV1 {
                        main: rev.main,
                        sub: rev.sub,
                        file: l.file,
                        offset: l.offset,
                        len: l.len,
                    };
                    block = postcard::to_extend(&r, block).map_err(encode_error)?;
                }
            }
            Ok(block)
        })?;
        self.block = block;
        self.in_block += 1;
        self.keys += 1;
        if self.block.len() >= BLOCK_BYTES {
            self.write_block()?;
        }
        Ok(())
    }

    fn write_block(&mut self) -> Result<()> {
        if self.in_block == 0 {
            return Ok(());
        }
        let mut head = [0u8; BLOCK_HEAD_LEN];
        head[..4].copy_from_slice(&(self.block.len() as u32).to_le_bytes());
        head[4..8].copy_from_slice(&crc32fast::hash(&self.block).to_le_bytes());
        head[8..].copy_from_slice(&self.in_block.to_le_bytes());
        self.out.write_all(&head).map_err(io("write index.tmp"))?;
        self.out.write_all(&self.block).map_err(io("write index.tmp"))?;
        self.block.clear();
        self.in_block = 0;
        Ok(())
    }

    /// Writes the cover (its key count is the writer's), makes the file durable and puts it
    /// in place of the previous one.
    pub(crate) fn finish(mut self, mut cover: Cover) -> Result<()> {
        self.write_block()?;
        cover.keys = self.keys;
        let body = postcard::to_allocvec(&CoverV1::from(&cover)).map_err(encode_error)?;
        let mut footer = Vec::with_capacity(body.len() + FOOTER_LEN as usize);
        footer.extend_from_slice(&body);
        footer.extend_from_slice(&(body.len() as u32).to_le_bytes());
        footer.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
        footer.extend_from_slice(END_MAGIC);
        self.out.write_all(&footer).map_err(io("write index.tmp"))?;
        let file = self
            .out
            .into_inner()
            .map_err(|e| io("write index.tmp")(e.into_error()))?;
        file.sync_all().map_err(io("fsync index.tmp"))?;
        fs::rename(self.dir.join(TMP_NAME), self.dir.join(NAME)).map_err(io("rename index.tmp"))?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(io("fsync the engine's directory"))
    }
}

/// Reads a saved index: its cover first, then its keys block by block.
#[derive(Debug)]
pub(crate) struct Reader {
    file: File,
    cover: Cover,
    /// Bytes of blocks not read yet.
    left: u64,
    buf: Vec<u8>,
    keys: u64,
}

impl Reader {
    /// Opens the saved index in `dir`: `None` if there is none, an error if it is damaged.
    pub(crate) fn open(dir: &Path) -> Result<Option<Reader>> {
        let mut file = match File::open(dir.join(NAME)) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io("open the saved index")(e)),
        };
        let len = file.metadata().map_err(io("stat the saved index"))?.len();
        if len < HEAD_LEN + FOOTER_LEN {
            return Err(damaged("shorter than its header and footer"));
        }
        let mut head = [0u8; HEAD_LEN as usize];
        file.read_exact(&mut head).map_err(io("read the saved index"))?;
        if &head[..8] != MAGIC {
            return Err(damaged("bad magic"));
        }
        if head[8..12] != VERSION.to_le_bytes() {
            return Err(damaged("unknown format version"));
        }
        let mut footer = [0u8; FOOTER_LEN as usize];
        file.seek(SeekFrom::Start(len - FOOTER_LEN))
            .and_then(|_| file.read_exact(&mut footer))
            .map_err(io("read the saved index"))?;
        if &footer[8..] != END_MAGIC {
            return Err(damaged("no footer (cut short?)"));
        }
        let cover_len = u32::from_le_bytes([footer[0], footer[1], footer[2], footer[3]]);
        let crc = u32::from_le_bytes([footer[4], footer[5], footer[6], footer[7]]);
        let blocks_end = (len - FOOTER_LEN)
            .checked_sub(u64::from(cover_len.min(MAX_PART)))
            .filter(|end| *end >= HEAD_LEN)
            .ok_or_else(|| damaged("cover longer than the file"))?;
        let mut body = vec![0u8; cover_len as usize];
        file.seek(SeekFrom::Start(blocks_end))
            .and_then(|_| file.read_exact(&mut body))
            .map_err(io("read the saved index"))?;
        if crc32fast::hash(&body) != crc {
            return Err(damaged("cover checksum mismatch"));
        }
        let cover: Cover = postcard::from_bytes::<CoverV1>(&body).map_err(damaged)?.into();
        file.seek(SeekFrom::Start(HEAD_LEN))
            .map_err(io("read the saved index"))?;
        Ok(Some(Reader {
            file,
            cover,
            left: blocks_end - HEAD_LEN,
            buf: Vec::new(),
            keys: 0,
        }))
    }

    pub(crate) fn cover(&self) -> &Cover {
        &self.cover
    }

    /// The next block of keys; `None` after the last, once the keys read match the cover's
    /// count.
    pub(crate) fn next_block(&mut self) -> Result<Option<Block<'_>>> {
        if self.left == 0 {
            if self.keys != self.cover.keys {
                return Err(damaged(format!(
                    "{} keys, the cover counts {}",
                    self.keys, self.cover.keys
                )));
            }
            return Ok(None);
        }
        let mut head = [0u8; BLOCK_HEAD_LEN];
        if self.left < BLOCK_HEAD_LEN as u64 {
            return Err(damaged("a block cut short"));
        }
        self.file.read_exact(&mut head).map_err(io("read the saved index"))?;
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
        let crc = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
        let count = u32::from_le_bytes([head[8], head[9], head[10], head[11]]);
        let total = BLOCK_HEAD_LEN as u64 + u64::from(len);
        if len > MAX_PART || total > self.left {
            return Err(damaged("a block longer than the file"));
        }
        self.buf.resize(len as usize, 0);
        self.file
            .read_exact(&mut self.buf)
            .map_err(io("read the saved index"))?;
        if crc32fast::hash(&self.buf) != crc {
            return Err(damaged("block checksum mismatch"));
        }
        self.left -= total;
        self.keys += u64::from(count);
        Ok(Some(Block {
            rest: &self.buf,
            left: count,
        }))
    }
}

/// One key read back.
#[derive(Debug)]
pub(crate) struct SavedKey<'a> {
    pub(crate) key: &'a [u8],
    pub(crate) lease: i64,
    pub(crate) index: KeyIndex,
}

/// The keys of one block.
#[derive(Debug)]
pub(crate) struct Block<'a> {
    rest: &'a [u8],
    left: u32,
}

impl<'a> Block<'a> {
    fn take<T: Deserialize<'a>>(&mut self) -> Result<T> {
        let (value, rest) = postcard::take_from_bytes(self.rest).map_err(damaged)?;
        self.rest = rest;
        Ok(value)
    }

    /// The next key of the block, its revisions' records added to `locs`; `None` after the
    /// last.
    pub(crate) fn next_key(&mut self, locs: &mut Vec<(Revision, Loc)>) -> Result<Option<SavedKey<'a>>> {
        if self.left == 0 {
            return if self.rest.is_empty() {
                Ok(None)
            } else {
                Err(damaged("bytes after a block's last key"))
            };
        }
        self.left -= 1;
        let head: KeyHeadV1<'a> = self.take()?;
        let mut generations = SmallVec::with_capacity(head.generations.min(1024) as usize);
        for _ in 0..head.generations {
            let g: GenerationHeadV1 = self.take()?;
            let mut revs = SmallVec::with_capacity(g.revisions.min(1024) as usize);
            for _ in 0..g.revisions {
                let r: RevisionV1 = self.take()?;
                let rev = Revision::new(r.main, r.sub);
                revs.push(rev);
                locs.push((
                    rev,
                    Loc {
                        file: r.file,
                        offset: r.offset,
                        len: r.len,
                    },
                ));
            }
            generations.push(Generation {
                ver: g.ver,
                created: Revision::new(g.created.0, g.created.1),
                revs,
            });
        }
        let index = KeyIndex::from_generations(generations).ok_or_else(|| damaged("a key with no generation"))?;
        Ok(Some(SavedKey {
            key: head.key,
            lease: head.lease,
            index,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rev(main: i64) -> Revision {
        Revision::new(main, 0)
    }

    fn loc_of(r: &Revision) -> Option<Loc> {
        Some(Loc {
            file: 1,
            offset: (r.main * 72) as u32,
            len: 72,
        })
    }

    /// Two keys: `a`, put at 2 and 3 with lease 7; `b`, put at 4, deleted at 5, put at 6.
    fn sample(dir: &Path) -> Vec<u8> {
        let mut a = KeyIndex::default();
        a.put(rev(2)).unwrap();
        a.put(rev(3)).unwrap();
        let mut b = KeyIndex::default();
        b.put(rev(4)).unwrap();
        b.tombstone(rev(5)).unwrap();
        b.put(rev(6)).unwrap();
        let mut w = Writer::create(dir).unwrap();
        w.push(b"a", 7, &a, loc_of).unwrap();
        w.push(b"b", 0, &b, loc_of).unwrap();
        let cover = Cover {
            epoch: 3,
            compacted: 1,
            keys: 0,
            files: vec![CoveredFile {
                id: 1,
                len: 504,
                last: Some(LastRecord {
                    offset: 432,
                    crc: 0xdead_beef,
                }),
            }],
        };
        w.finish(cover).unwrap();
        fs::read(dir.join(NAME)).unwrap()
    }

    /// A saved index read back: its cover, its keys with their leases, its records.
    type ReadBack = (Cover, Vec<(Vec<u8>, i64, KeyIndex)>, Vec<(Revision, Loc)>);

    fn read_all(dir: &Path) -> Result<ReadBack> {
        let mut r = Reader::open(dir)?.expect("an index");
        let cover = r.cover().clone();
        let (mut keys, mut locs) = (Vec::new(), Vec::new());
        while let Some(mut block) = r.next_block()? {
            while let Some(k) = block.next_key(&mut locs)? {
                keys.push((k.key.to_vec(), k.lease, k.index));
            }
        }
        Ok((cover, keys, locs))
    }

    #[test]
    fn keys_read_back_as_written() {
        let dir = tempfile::tempdir().unwrap();
        sample(dir.path());
        let (cover, keys, locs) = read_all(dir.path()).unwrap();
        assert_eq!((cover.epoch, cover.compacted, cover.keys), (3, 1, 2));
        assert_eq!(keys.len(), 2);
        assert_eq!((keys[0].0.as_slice(), keys[0].1), (&b"a"[..], 7));
        assert_eq!(keys[0].2.current().unwrap().version, 2);
        assert_eq!(keys[1].2.generations().len(), 2);
        assert_eq!(keys[1].2.get(5), None, "deleted at 5");
        let revs: Vec<i64> = locs.iter().map(|(r, _)| r.main).collect();
        assert_eq!(revs, [2, 3, 4, 5, 6]);
        assert_eq!(locs[4].1, loc_of(&rev(6)).unwrap());
        assert!(!dir.path().join(TMP_NAME).exists());
    }

    #[test]
    fn every_damage_is_detected() {
        let dir = tempfile::tempdir().unwrap();
        let good = sample(dir.path());
        // Every byte flipped, and every cut: an error, never different keys.
        for at in 0..good.len() {
            let mut bad = good.clone();
            bad[at] ^= 0x20;
            fs::write(dir.path().join(NAME), &bad).unwrap();
            assert!(read_all(dir.path()).is_err(), "a flip at {at} is found");
        }
        for len in 0..good.len() {
            fs::write(dir.path().join(NAME), &good[..len]).unwrap();
            assert!(read_all(dir.path()).is_err(), "a cut at {len} is found");
        }
        fs::remove_file(dir.path().join(NAME)).unwrap();
        assert!(Reader::open(dir.path()).unwrap().is_none());
    }

    /// The bytes of [`sample`], pinned: a change to them is a new format version.
    #[test]
    fn version_1_is_byte_for_byte_what_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = sample(dir.path());
        let hex: String = include_str!("index_v1.golden").split_whitespace().collect();
        let golden: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        assert_eq!(
            bytes,
            golden,
            "{}",
            bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
        );
    }
}
