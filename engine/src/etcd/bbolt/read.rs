//! Reading a bbolt file, strictly read-only, a page at a time (memory stays bounded whatever
//! the file's size). Every page visited is checked: within the high-water mark and the file,
//! its own ID, a known type, elements inside the page; a page reached twice is a cycle.

use std::cell::RefCell;
use std::collections::HashSet;
use std::fs::File;
use std::os::unix::fs::FileExt;

use super::{BoltError, BucketRoot, BRANCH, BUCKET_HEADER, BUCKET_LEAF, ELEMENT, HEADER, LEAF, MAGIC, META, VERSION};

/// A tree deeper than this is damage: a bbolt tree of 2^32 pages is a handful of levels deep.
const MAX_DEPTH: usize = 64;

/// Pages a sequential walk reads at once.
const WINDOW_PAGES: u64 = 64;

/// An open bbolt file.
#[derive(Debug)]
pub(crate) struct Db {
    file: File,
    page_size: u64,
    /// Pages in use: every page of the tree is below it.
    high_water: u64,
    root: u64,
    window: RefCell<Window>,
}

/// Pages read ahead of a walk. Leaves mostly follow each other in the file: once a page is
/// read right after the one before it, the next [`WINDOW_PAGES`] come in one system call
/// instead of one each.
#[derive(Debug, Default)]
struct Window {
    /// The first page in `bytes`.
    first: u64,
    bytes: Vec<u8>,
    /// The last page read, to tell a sequential walk.
    last: u64,
}

/// The fields of a meta page that reading needs.
#[derive(Clone, Copy, Debug)]
struct Meta {
    page_size: u32,
    root: u64,
    high_water: u64,
    txid: u64,
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// The meta in a meta page's bytes, if it is valid.
fn meta(page: &[u8]) -> Result<Meta, &'static str> {
    let m = page.get(HEADER..HEADER + 64).ok_or("shorter than a meta page")?;
    if u16_at(page, 8) != Some(META) {
        return Err("not a meta page");
    }
    if u32_at(m, 0) != Some(MAGIC) {
        return Err("bad magic");
    }
    if u32_at(m, 4) != Some(VERSION) {
        return Err("unsupported version");
    }
    if u64_at(m, 56) != m.get(..56).map(super::fnv1a64) {
        return Err("meta checksum mismatch");
    }
    let meta = Meta {
        page_size: u32_at(m, 8).unwrap_or(0),
        root: u64_at(m, 16).unwrap_or(0),
        high_water: u64_at(m, 40).unwrap_or(0),
        txid: u64_at(m, 48).unwrap_or(0),
    };
    if !(1024..=1 << 20).contains(&meta.page_size) || !meta.page_size.is_power_of_two() {
        return Err("implausible page size");
    }
    Ok(meta)
}

/// One page (with its overflow), read whole.
struct Page {
    id: u64,
    bytes: Vec<u8>,
}

impl Page {
    fn flags(&self) -> u16 {
        u16_at(&self.bytes, 8).unwrap_or(0)
    }

    fn count(&self) -> usize {
        usize::from(u16_at(&self.bytes, 10).unwrap_or(0))
    }

    fn bad(&self, reason: impl Into<String>) -> BoltError {
        BoltError::BadPage {
            page: self.id,
            reason: reason.into(),
        }
    }
}

/// A leaf element of a page (or of an inline bucket's page).
struct LeafElement<'a> {
    flags: u32,
    key: &'a [u8],
    value: &'a [u8],
}

/// The `i`th leaf element of `page` (a page's or an inline bucket's bytes).
fn leaf_element(page: &[u8], i: usize) -> Option<LeafElement<'_>> {
    let at = HEADER + i * ELEMENT;
    let flags = u32_at(page, at)?;
    let pos = usize::try_from(u32_at(page, at + 4)?).ok()?;
    let ksize = usize::try_from(u32_at(page, at + 8)?).ok()?;
    let vsize = usize::try_from(u32_at(page, at + 12)?).ok()?;
    let start = at.checked_add(pos)?;
    let key = page.get(start..start.checked_add(ksize)?)?;
    let vstart = start + ksize;
    let value = page.get(vstart..vstart.checked_add(vsize)?)?;
    Some(LeafElement { flags, key, value })
}

/// The `i`th branch element: its key and child page.
fn branch_element(page: &[u8], i: usize) -> Option<(&[u8], u64)> {
    let at = HEADER + i * ELEMENT;
    let pos = usize::try_from(u32_at(page, at)?).ok()?;
    let ksize = usize::try_from(u32_at(page, at + 4)?).ok()?;
    let child = u64_at(page, at + 8)?;
    let start = at.checked_add(pos)?;
    Some((page.get(start..start.checked_add(ksize)?)?, child))
}

/// Where a bucket entry's value says its entries are.
fn bucket_root(value: &[u8]) -> Option<BucketRoot> {
    let root = u64_at(value, 0)?;
    if root != 0 {
        return Some(BucketRoot::Page(root));
    }
    Some(BucketRoot::Inline(value.get(BUCKET_HEADER..)?.to_vec()))
}

impl Db {
    /// Opens `file` read-only: finds the valid meta with the higher transaction ID and checks
    /// the file holds every page it names. The page size is the meta's, whatever this
    /// machine's is.
    pub(crate) fn open(file: File) -> Result<Db, BoltError> {
        let len = file.metadata()?.len();
        let mut first = vec![0u8; 4096.min(usize::try_from(len).unwrap_or(4096))];
        file.read_exact_at(&mut first, 0)?;
        let meta0 = meta(&first);
        // Page 1 is at the page size page 0 gives; if page 0 is damaged, try the sizes bbolt
        // tries.
        let sizes: Vec<u64> = match meta0 {
            Ok(m) => vec![u64::from(m.page_size)],
            Err(_) => (0..11).map(|i| 1024u64 << i).collect(),
        };
        let mut meta1 = Err("no second meta page");
        for size in sizes {
            let mut page = vec![0u8; HEADER + 64];
            if size + page.len() as u64 <= len && file.read_exact_at(&mut page, size).is_ok() {
                meta1 = meta(&page);
                if meta1.is_ok() {
                    break;
                }
            }
        }
        let chosen = match (meta0, meta1) {
            (Ok(a), Ok(b)) => {
                if a.txid >= b.txid {
                    a
                } else {
                    b
                }
            }
            (Ok(m), Err(_)) | (Err(_), Ok(m)) => m,
            (Err(why), Err(_)) => return Err(BoltError::NotBolt(why)),
        };
        let page_size = u64::from(chosen.page_size);
        let needed = chosen.high_water.saturating_mul(page_size);
        if needed > len {
            return Err(BoltError::Truncated { needed, len });
        }
        Ok(Db {
            file,
            page_size,
            high_water: chosen.high_water,
            root: chosen.root,
            window: RefCell::default(),
        })
    }

    /// Bytes the database takes: the high-water mark's pages.
    #[cfg(test)]
    pub(crate) fn size(&self) -> u64 {
        self.high_water * self.page_size
    }

    /// Reads page `id` with its overflow pages, checked against the high-water mark, into
    /// `bytes` (a buffer given back to be used again: a walk reads tens of thousands of pages).
    fn page(&self, id: u64, mut bytes: Vec<u8>) -> Result<Page, BoltError> {
        let bad = |reason: String| BoltError::BadPage { page: id, reason };
        if id < 2 || id >= self.high_water {
            return Err(bad(format!("outside the pages in use (2 to {})", self.high_water)));
        }
        self.read_pages(id, 1, &mut bytes)?;
        if u64_at(&bytes, 0) != Some(id) {
            return Err(bad(format!("it says it is page {}", u64_at(&bytes, 0).unwrap_or(0))));
        }
        let overflow = u64::from(u32_at(&bytes, 12).unwrap_or(0));
        let pages = overflow + 1;
        if id.checked_add(pages).is_none_or(|end| end > self.high_water) {
            return Err(bad(format!("its {overflow} overflow pages run past the pages in use")));
        }
        if pages > 1 {
            self.read_pages(id, pages, &mut bytes)?;
        }
        Ok(Page { id, bytes })
    }

    /// Reads `pages` pages from page `id` on (all below the high-water mark) into `out`,
    /// through the read-ahead window.
    fn read_pages(&self, id: u64, pages: u64, out: &mut Vec<u8>) -> std::io::Result<()> {
        let size = self.page_size;
        let too_large = || std::io::Error::other("a page run too large for memory");
        let len = usize::try_from(pages * size).map_err(|_| too_large())?;
        let mut w = self.window.borrow_mut();
        let held = |w: &Window| {
            let start = usize::try_from(id.checked_sub(w.first)? * size).ok()?;
            w.bytes.get(start..start.checked_add(len)?)?;
            Some(start)
        };
        if held(&w).is_none() && id == w.last + 1 {
            let run = WINDOW_PAGES.min(self.high_water - id).max(pages);
            // Resized only when the run's length changes: zeroing it every time costs as much
            // as a copy of the file.
            w.bytes.resize(usize::try_from(run * size).map_err(|_| too_large())?, 0);
            self.file.read_exact_at(&mut w.bytes, id * size)?;
            w.first = id;
        }
        w.last = id + pages - 1;
        out.clear();
        match held(&w).and_then(|start| w.bytes.get(start..start + len)) {
            Some(from_window) => out.extend_from_slice(from_window),
            None => {
                out.resize(len, 0);
                self.file.read_exact_at(out, id * size)?;
            }
        }
        Ok(())
    }

    /// The top-level buckets: their names and roots, in name order.
    pub(crate) fn buckets(&self) -> Result<Vec<(Vec<u8>, BucketRoot)>, BoltError> {
        let mut out = Vec::new();
        self.walk(&BucketRoot::Page(self.root), &mut |flags,
                                                      key,
                                                      value|
         -> Result<(), BoltError> {
            if flags & BUCKET_LEAF != 0 {
                let root = bucket_root(value).ok_or_else(|| BoltError::BadPage {
                    page: 0,
                    reason: format!("bucket {:?} has a short header", String::from_utf8_lossy(key)),
                })?;
                out.push((key.to_vec(), root));
            }
            Ok(())
        })?;
        Ok(out)
    }

    /// The top-level bucket `name`, if there is one.
    #[cfg(test)]
    pub(crate) fn bucket(&self, name: &[u8]) -> Result<Option<BucketRoot>, BoltError> {
        Ok(self.buckets()?.into_iter().find(|(n, _)| n == name).map(|(_, r)| r))
    }

    /// Calls `each(key, value)` for every entry of `bucket`, in key order; nested buckets are
    /// skipped (etcd has none).
    pub(crate) fn for_each<E: From<BoltError>>(
        &self,
        bucket: &BucketRoot,
        mut each: impl FnMut(&[u8], &[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        self.walk(bucket, &mut |flags, key, value| {
            if flags & BUCKET_LEAF == 0 {
                each(key, value)?;
            }
            Ok(())
        })
    }

    /// Calls `each(flags, key, value)` for every leaf element under `root`, in key order.
    fn walk<E: From<BoltError>>(
        &self,
        root: &BucketRoot,
        each: &mut impl FnMut(u32, &[u8], &[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        match root {
            BucketRoot::Inline(page) => {
                let inline = Page {
                    id: 0,
                    bytes: page.clone(),
                };
                if inline.flags() != LEAF {
                    return Err(inline.bad("an inline bucket that is not a leaf").into());
                }
                leaf_entries(&inline, each)
            }
            BucketRoot::Page(id) => self.walk_page(*id, 0, &mut Walk::default(), each),
        }
    }

    fn walk_page<E: From<BoltError>>(
        &self,
        id: u64,
        depth: usize,
        walk: &mut Walk,
        each: &mut impl FnMut(u32, &[u8], &[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        if !walk.seen.insert(id) {
            return Err(BoltError::Cycle(id).into());
        }
        let page = self.page(id, walk.buffers.pop().unwrap_or_default())?;
        if depth > MAX_DEPTH {
            return Err(page.bad("the tree is implausibly deep").into());
        }
        match page.flags() {
            LEAF => leaf_entries(&page, each)?,
            BRANCH => {
                for i in 0..page.count() {
                    let (_, child) = branch_element(&page.bytes, i)
                        .ok_or_else(|| page.bad(format!("branch element {i} runs past the page")))?;
                    self.walk_page(child, depth + 1, walk, each)?;
                }
            }
            other => return Err(page.bad(format!("a tree page with flags {other:#x}")).into()),
        }
        walk.buffers.push(page.bytes);
        Ok(())
    }
}

/// A walk down one bucket's tree: the pages seen (a page seen twice is a cycle), and page
/// buffers to reuse.
#[derive(Default)]
struct Walk {
    seen: HashSet<u64>,
    buffers: Vec<Vec<u8>>,
}

fn leaf_entries<E: From<BoltError>>(
    page: &Page,
    each: &mut impl FnMut(u32, &[u8], &[u8]) -> Result<(), E>,
) -> Result<(), E> {
    let mut last: Option<&[u8]> = None;
    for i in 0..page.count() {
        let e = leaf_element(&page.bytes, i).ok_or_else(|| page.bad(format!("leaf element {i} runs past the page")))?;
        if e.key.is_empty() || last.is_some_and(|l| l >= e.key) {
            return Err(page
                .bad(format!("leaf element {i}'s key is empty or out of order"))
                .into());
        }
        last = Some(e.key);
        each(e.flags, e.key, e.value)?;
    }
    Ok(())
}
