//! Writing a fresh bbolt file from buckets whose entries come in key order, bottom-up, a page
//! at a time (memory holds one page, each level's first keys, and pages not yet written, up to
//! a megabyte).
//!
//! The layout is the one Go bbolt and `etcdutl` accept from a fresh database: 4096-byte pages;
//! pages 0 and 1 both valid metas (transaction 2 on page 0, 1 on page 1); page 2 an empty
//! freelist; then every tree page, each reachable, none free; the file exactly the pages in use
//! long. Pages are filled whole (bbolt splits them when they are written to again). An empty
//! bucket is inline, as bbolt makes a new one.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use super::{BRANCH, BUCKET_HEADER, BUCKET_LEAF, ELEMENT, FREELIST, HEADER, LEAF, MAGIC, META, VERSION};

/// The page size written.
pub(crate) const PAGE_SIZE: usize = 4096;
/// The first page of the tree: after the two metas and the freelist.
const FIRST_TREE_PAGE: u64 = 3;
/// bbolt's largest key.
const MAX_KEY: usize = 32768;

fn invalid(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, why)
}

/// A fresh bbolt file being written.
#[derive(Debug)]
pub(crate) struct DbWriter {
    file: File,
    /// The next page to allocate.
    next: u64,
    /// The buckets finished so far, in name order, with their values (bucket headers).
    buckets: Vec<(Vec<u8>, Vec<u8>)>,
    /// The bucket being written, if any.
    open: Option<OpenBucket>,
    /// Pages allocated but not written yet, from page `pending_from` on: pages are allocated
    /// in order, so they go to the file in large writes.
    pending: Vec<u8>,
    pending_from: u64,
}

/// Bytes of pages written to the file at once.
const WRITE_BATCH: usize = 1 << 20;

/// Elements collected for one page.
#[derive(Debug, Default)]
struct PageBuilder {
    /// (flags, key length, value length) of each element, in order; for a branch, the value
    /// is the child's page ID as 8 bytes LE.
    elements: Vec<(u32, usize, usize)>,
    /// The elements' keys and values, back to back.
    data: Vec<u8>,
    /// Bytes of the page so far: header, elements, keys and values.
    size: usize,
}

impl PageBuilder {
    fn new() -> PageBuilder {
        PageBuilder {
            elements: Vec::new(),
            data: Vec::new(),
            size: HEADER,
        }
    }

    /// Bytes the page would take with one more element.
    fn with(&self, key: usize, value: usize) -> usize {
        self.size + ELEMENT + key + value
    }

    /// The first key on the page (what a branch above it points by).
    fn first_key(&self) -> Vec<u8> {
        let len = self.elements.first().map_or(0, |e| e.1);
        self.data.get(..len).unwrap_or_default().to_vec()
    }

    fn push(&mut self, flags: u32, key: &[u8], value: &[u8]) {
        self.size = self.with(key.len(), value.len());
        self.elements.push((flags, key.len(), value.len()));
        self.data.extend_from_slice(key);
        self.data.extend_from_slice(value);
    }

    /// Appends the page's bytes for page `id` (a whole number of pages) to `out`, as a leaf
    /// or a branch.
    fn encode_into(&self, id: u64, flags: u16, out: &mut Vec<u8>) {
        let pages = self.size.div_ceil(PAGE_SIZE).max(1);
        let start = out.len();
        out.extend_from_slice(&header(id, flags, self.elements.len(), pages - 1));
        // Each element's `pos` counts from the element to its key, which follow the element
        // array in element order.
        let mut pos_of_data = HEADER + ELEMENT * self.elements.len();
        let mut at = 0;
        for (i, &(eflags, klen, vlen)) in self.elements.iter().enumerate() {
            let pos = (pos_of_data - (HEADER + i * ELEMENT)) as u32;
            if flags == LEAF {
                out.extend_from_slice(&eflags.to_le_bytes());
                out.extend_from_slice(&pos.to_le_bytes());
                out.extend_from_slice(&(klen as u32).to_le_bytes());
                out.extend_from_slice(&(vlen as u32).to_le_bytes());
                pos_of_data += klen + vlen;
            } else {
                out.extend_from_slice(&pos.to_le_bytes());
                out.extend_from_slice(&(klen as u32).to_le_bytes());
                // The child's page ID.
                out.extend_from_slice(self.data.get(at + klen..at + klen + vlen).unwrap_or_default());
                pos_of_data += klen;
            }
            at += klen + vlen;
        }
        if flags == LEAF {
            out.extend_from_slice(&self.data);
        } else {
            let mut at = 0;
            for &(_, klen, vlen) in &self.elements {
                out.extend_from_slice(self.data.get(at..at + klen).unwrap_or_default());
                at += klen + vlen;
            }
        }
        out.resize(start + pages * PAGE_SIZE, 0);
    }
}

/// A page header.
fn header(id: u64, flags: u16, count: usize, overflow: usize) -> Vec<u8> {
    let mut h = Vec::with_capacity(HEADER);
    h.extend_from_slice(&id.to_le_bytes());
    h.extend_from_slice(&flags.to_le_bytes());
    h.extend_from_slice(&(count as u16).to_le_bytes());
    h.extend_from_slice(&(overflow as u32).to_le_bytes());
    h
}

/// A meta page naming the root bucket's page and the pages in use.
fn meta_page(id: u64, txid: u64, root: u64, high_water: u64) -> Vec<u8> {
    let mut m = Vec::with_capacity(64);
    m.extend_from_slice(&MAGIC.to_le_bytes());
    m.extend_from_slice(&VERSION.to_le_bytes());
    m.extend_from_slice(&(PAGE_SIZE as u32).to_le_bytes());
    m.extend_from_slice(&0u32.to_le_bytes()); // flags
    m.extend_from_slice(&root.to_le_bytes());
    m.extend_from_slice(&0u64.to_le_bytes()); // the root bucket's sequence
    m.extend_from_slice(&2u64.to_le_bytes()); // the freelist page
    m.extend_from_slice(&high_water.to_le_bytes());
    m.extend_from_slice(&txid.to_le_bytes());
    let sum = super::fnv1a64(&m);
    m.extend_from_slice(&sum.to_le_bytes());
    let mut page = header(id, META, 0, 0);
    page.extend_from_slice(&m);
    page.resize(PAGE_SIZE, 0);
    page
}

/// Elements per page are kept well below the header's 16-bit count.
const MAX_ELEMENTS: usize = 0x8000;

/// The bucket being written: its entries come in strictly increasing key order.
#[derive(Debug)]
struct OpenBucket {
    name: Vec<u8>,
    leaf: PageBuilder,
    /// Each leaf written: its first key and ID.
    leaves: Vec<(Vec<u8>, u64)>,
    last: Option<Vec<u8>>,
}

impl DbWriter {
    /// Starts a database in `file`, which must be empty.
    pub(crate) fn create(file: File) -> io::Result<DbWriter> {
        if file.metadata()?.len() != 0 {
            return Err(invalid("a bbolt database is written into an empty file".into()));
        }
        let mut freelist = header(2, FREELIST, 0, 0);
        freelist.resize(PAGE_SIZE, 0);
        file.write_all_at(&freelist, 2 * PAGE_SIZE as u64)?;
        Ok(DbWriter {
            file,
            next: FIRST_TREE_PAGE,
            buckets: Vec::new(),
            open: None,
            pending: Vec::with_capacity(WRITE_BATCH + PAGE_SIZE),
            pending_from: FIRST_TREE_PAGE,
        })
    }

    /// Starts the next bucket (ending the one open); buckets come in strictly increasing
    /// name order.
    pub(crate) fn bucket(&mut self, name: &[u8]) -> io::Result<()> {
        self.end_bucket()?;
        if name.is_empty() || self.buckets.last().is_some_and(|(last, _)| last.as_slice() >= name) {
            return Err(invalid(format!(
                "bucket {:?} is empty or out of order",
                String::from_utf8_lossy(name)
            )));
        }
        self.open = Some(OpenBucket {
            name: name.to_vec(),
            leaf: PageBuilder::new(),
            leaves: Vec::new(),
            last: None,
        });
        Ok(())
    }

    /// Adds an entry to the open bucket; keys come in strictly increasing order, none empty.
    pub(crate) fn put(&mut self, key: &[u8], value: &[u8]) -> io::Result<()> {
        let Some(b) = self.open.as_ref() else {
            return Err(invalid("an entry with no bucket open".into()));
        };
        if key.is_empty() || key.len() > MAX_KEY || b.last.as_deref().is_some_and(|l| l >= key) {
            return Err(invalid(format!(
                "key {:?} of bucket {:?} is empty, too long or out of order",
                String::from_utf8_lossy(key),
                String::from_utf8_lossy(&b.name)
            )));
        }
        if u32::try_from(value.len()).is_err() {
            return Err(invalid("a value of 4 GiB or more".into()));
        }
        let full = !b.leaf.elements.is_empty()
            && (b.leaf.with(key.len(), value.len()) > PAGE_SIZE || b.leaf.elements.len() >= MAX_ELEMENTS);
        if full {
            let leaf = self
                .open
                .as_mut()
                .map(|b| std::mem::replace(&mut b.leaf, PageBuilder::new()));
            if let Some(leaf) = leaf {
                let id = self.allocate(&leaf, LEAF)?;
                if let Some(b) = self.open.as_mut() {
                    b.leaves.push((leaf.first_key(), id));
                }
            }
        }
        if let Some(b) = self.open.as_mut() {
            b.leaf.push(0, key, value);
            let last = b.last.get_or_insert_with(Vec::new);
            last.clear();
            last.extend_from_slice(key);
        }
        Ok(())
    }

    /// Ends the open bucket, if any: its tree's upper levels, and its entry in the root.
    pub(crate) fn end_bucket(&mut self) -> io::Result<()> {
        let Some(b) = self.open.take() else {
            return Ok(());
        };
        let mut value = vec![0u8; BUCKET_HEADER];
        if b.last.is_none() {
            // Empty: inline, a leaf page with no element, as bbolt makes a new bucket.
            value.extend_from_slice(&header(0, LEAF, 0, 0));
        } else {
            let root = self.close_levels(b.leaf, b.leaves)?;
            value.splice(0..8, root.to_le_bytes());
        }
        self.buckets.push((b.name, value));
        Ok(())
    }

    /// Writes `page` at a newly allocated page (or pages); returns its ID.
    fn allocate(&mut self, page: &PageBuilder, flags: u16) -> io::Result<u64> {
        let id = self.next;
        let before = self.pending.len();
        page.encode_into(id, flags, &mut self.pending);
        self.next += ((self.pending.len() - before) / PAGE_SIZE) as u64;
        if self.pending.len() >= WRITE_BATCH {
            self.flush()?;
        }
        Ok(id)
    }

    /// Writes the pages allocated so far.
    fn flush(&mut self) -> io::Result<()> {
        self.file
            .write_all_at(&self.pending, self.pending_from * PAGE_SIZE as u64)?;
        self.pending.clear();
        self.pending_from = self.next;
        Ok(())
    }

    /// Writes the root bucket and the metas; returns the file and its length. The file is not
    /// synced: a caller that keeps it syncs it.
    pub(crate) fn finish(mut self) -> io::Result<(File, u64)> {
        self.end_bucket()?;
        let mut root = PageBuilder::new();
        let buckets = std::mem::take(&mut self.buckets);
        let mut leaves = Vec::new();
        for (name, value) in buckets {
            if !root.elements.is_empty() && root.with(name.len(), value.len()) > PAGE_SIZE {
                leaves.push((root.first_key(), self.allocate(&root, LEAF)?));
                root = PageBuilder::new();
            }
            root.push(BUCKET_LEAF, &name, &value);
        }
        let root_id = self.close_levels(root, leaves)?;
        self.flush()?;
        let high_water = self.next;
        // Both metas valid, as a fresh bbolt database has them: the newer on page 0.
        for (page_id, txid) in [(0u64, 2u64), (1, 1)] {
            let page = meta_page(page_id, txid, root_id, high_water);
            self.file.write_all_at(&page, page_id * PAGE_SIZE as u64)?;
        }
        let len = high_water * PAGE_SIZE as u64;
        self.file.set_len(len)?;
        Ok((self.file, len))
    }

    /// Writes the last leaf of a tree, then branch levels above the leaves until one page
    /// remains; returns the root's ID.
    fn close_levels(&mut self, last: PageBuilder, mut level: Vec<(Vec<u8>, u64)>) -> io::Result<u64> {
        if !last.elements.is_empty() || level.is_empty() {
            level.push((last.first_key(), self.allocate(&last, LEAF)?));
        }
        while level.len() > 1 {
            let mut above = Vec::new();
            let mut page = PageBuilder::new();
            for (key, child) in level {
                if !page.elements.is_empty()
                    && (page.with(key.len(), 0) > PAGE_SIZE || page.elements.len() >= MAX_ELEMENTS)
                {
                    above.push((page.first_key(), self.allocate(&page, BRANCH)?));
                    page = PageBuilder::new();
                }
                page.push(0, &key, &child.to_le_bytes());
            }
            above.push((page.first_key(), self.allocate(&page, BRANCH)?));
            level = above;
        }
        level
            .first()
            .map(|(_, id)| *id)
            .ok_or_else(|| invalid("a tree with no page".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::super::read::Db;
    use super::super::BucketRoot;
    use super::*;

    type Entries = Vec<(Vec<u8>, Vec<u8>)>;

    fn written(buckets: &[(&str, Entries)]) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let mut db = DbWriter::create(File::create_new(&path).unwrap()).unwrap();
        for (name, entries) in buckets {
            db.bucket(name.as_bytes()).unwrap();
            for (k, v) in entries {
                db.put(k, v).unwrap();
            }
        }
        db.finish().unwrap();
        (dir, path)
    }

    fn read_all(db: &Db, root: &BucketRoot) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut out = Vec::new();
        db.for_each(root, |k, v| {
            out.push((k.to_vec(), v.to_vec()));
            Ok::<_, crate::etcd::bbolt::BoltError>(())
        })
        .unwrap();
        out
    }

    #[test]
    fn what_is_written_reads_back_in_order_across_many_pages_and_levels() {
        let many: Vec<(Vec<u8>, Vec<u8>)> = (0..20_000u64)
            .map(|i| {
                (
                    i.to_be_bytes().to_vec(),
                    format!("value-{i}").repeat(1 + (i % 7) as usize).into_bytes(),
                )
            })
            .collect();
        let big = vec![
            (b"big".to_vec(), vec![7u8; 3 * PAGE_SIZE + 100]),
            (b"small".to_vec(), b"s".to_vec()),
        ];
        let (_dir, path) = written(&[("a-empty", vec![]), ("key", many.clone()), ("meta", big.clone())]);
        let len = std::fs::metadata(&path).unwrap().len();
        assert_eq!(len % PAGE_SIZE as u64, 0);
        let db = Db::open(File::open(&path).unwrap()).unwrap();
        assert_eq!(db.size(), len);
        let names: Vec<Vec<u8>> = db.buckets().unwrap().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, [b"a-empty".to_vec(), b"key".to_vec(), b"meta".to_vec()]);
        assert_eq!(read_all(&db, &db.bucket(b"key").unwrap().unwrap()), many);
        assert_eq!(read_all(&db, &db.bucket(b"meta").unwrap().unwrap()), big);
        assert!(read_all(&db, &db.bucket(b"a-empty").unwrap().unwrap()).is_empty());
        assert!(db.bucket(b"nope").unwrap().is_none());
    }

    #[test]
    fn out_of_order_keys_and_buckets_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut db = DbWriter::create(File::create_new(dir.path().join("db")).unwrap()).unwrap();
        assert!(db.put(b"1", b"x").is_err(), "no bucket open");
        db.bucket(b"b").unwrap();
        db.put(b"2", b"x").unwrap();
        assert!(db.put(b"1", b"x").is_err());
        assert!(db.put(b"", b"x").is_err());
        assert!(db.bucket(b"a").is_err(), "buckets in name order");
    }

    #[test]
    fn damage_is_an_error_never_a_panic() {
        let entries: Vec<(Vec<u8>, Vec<u8>)> = (0..2000u32)
            .map(|i| (i.to_be_bytes().to_vec(), vec![1u8; 40]))
            .collect();
        let (dir, path) = written(&[("key", entries)]);
        let clean = std::fs::read(&path).unwrap();
        let read_everything = |bytes: &[u8]| -> Result<usize, crate::etcd::bbolt::BoltError> {
            let p = dir.path().join("damaged");
            std::fs::write(&p, bytes).unwrap();
            let db = Db::open(File::open(&p).unwrap())?;
            let mut n = 0;
            for (_, root) in db.buckets()? {
                db.for_each(&root, |_, _| {
                    n += 1;
                    Ok::<_, crate::etcd::bbolt::BoltError>(())
                })?;
            }
            Ok(n)
        };
        assert_eq!(read_everything(&clean).unwrap(), 2000);
        // Truncated anywhere: refused.
        for cut in [0, 100, 4096, clean.len() / 2, clean.len() - 1] {
            assert!(read_everything(&clean[..cut]).is_err(), "cut at {cut}");
        }
        // Both metas damaged: not a database.
        let mut bad = clean.clone();
        bad[HEADER + 10] ^= 1;
        bad[PAGE_SIZE + HEADER + 10] ^= 1;
        assert!(matches!(
            read_everything(&bad),
            Err(crate::etcd::bbolt::BoltError::NotBolt(_))
        ));
        // One meta damaged: the other is used.
        let mut one = clean.clone();
        one[HEADER + 10] ^= 1;
        assert_eq!(read_everything(&one).unwrap(), 2000);
        // A tree page pointing at itself: a cycle, refused.
        let db = Db::open(File::open(&path).unwrap()).unwrap();
        let Some(BucketRoot::Page(root)) = db.bucket(b"key").unwrap() else {
            panic!("not a page")
        };
        let mut cyclic = clean.clone();
        let at = root as usize * PAGE_SIZE;
        assert_eq!(u16::from_le_bytes([cyclic[at + 8], cyclic[at + 9]]), BRANCH);
        cyclic[at + HEADER + 8..at + HEADER + 16].copy_from_slice(&root.to_le_bytes());
        assert!(matches!(
            read_everything(&cyclic),
            Err(crate::etcd::bbolt::BoltError::Cycle(_))
        ));
        // Every byte flipped, one at a time, in the first tree pages: an error or a read, never a panic.
        for i in (2 * PAGE_SIZE..(6 * PAGE_SIZE).min(clean.len())).step_by(7) {
            let mut b = clean.clone();
            b[i] ^= 0xff;
            let _ = read_everything(&b);
        }
    }
}
