//! bbolt's file format (the B+tree database etcd keeps its state in, and the format of its
//! snapshots), written and read whole in memory: what backups in etcd's format need, not a
//! database to update in place.
//!
//! The layout, as bbolt defines it (little-endian throughout):
//! - The file is a sequence of pages of one size (4096 here). Every page starts with a 16-byte
//!   header: its id (u64), flags (u16: branch 0x01, leaf 0x02, meta 0x04, freelist 0x10), an
//!   element count (u16) and how many pages after it it spans (`overflow`, u32).
//! - Pages 0 and 1 are meta pages: magic 0xED0CDAED, version 2, page size, flags, the root
//!   bucket (root page id, sequence), the freelist's page id (all ones: none stored), the high
//!   water mark (pages in use), the transaction id and an FNV-1a 64 checksum of the fields
//!   before it. A reader takes the valid one with the higher transaction id.
//! - A leaf page holds `count` elements of 16 bytes (flags, pos, key size, value size; `pos`
//!   counts from the element to its key, the value follows the key); a branch page's elements
//!   (pos, key size, child page id) hold each child's first key.
//! - A bucket is a leaf element with flag 0x01 whose value is the bucket's header (root page id,
//!   sequence); a root of 0 means the bucket's one leaf page follows inline in the value. The
//!   root bucket's elements are the top-level buckets.
//!
//! [`write`] lays a database out compactly (meta pages, an empty freelist, then each bucket's
//! pages bottom-up, small buckets inline as bbolt keeps them), so that bbolt's own consistency
//! check (`tx.Check`, which `etcdctl snapshot status` runs) finds every page in use exactly once.
//! [`read`] checks what it walks — meta checksums, page ids, types and bounds, element bounds,
//! key order, pages referenced twice — and refuses a file that fails any check.

use std::collections::HashSet;

/// The page size of the files [`write`] makes: the OS page size etcd runs with on x86-64 and
/// most arm64 systems.
pub const PAGE_SIZE: usize = 4096;

const MAGIC: u32 = 0xED0C_DAED;
const VERSION: u32 = 2;
const PAGE_HEADER: usize = 16;
const ELEMENT: usize = 16;
/// A bucket's header in its parent: root page id and sequence.
const BUCKET_HEADER: usize = 16;
const BRANCH_PAGE: u16 = 0x01;
const LEAF_PAGE: u16 = 0x02;
const META_PAGE: u16 = 0x04;
const FREELIST_PAGE: u16 = 0x10;
const BUCKET_LEAF: u32 = 0x01;
const NO_FREELIST: u64 = u64::MAX;
/// The meta fields before the checksum.
const META_CHECKED: usize = 56;
/// Deeper nesting than this is a damaged (or hostile) file, not a database.
const MAX_DEPTH: usize = 64;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BoltError {
    #[error("not a bbolt database (no valid meta page)")]
    NotBolt,
    #[error("the database is damaged: {0}")]
    Corrupt(String),
    #[error("cannot write the database: {0}")]
    Invalid(String),
}

fn corrupt(what: impl Into<String>) -> BoltError {
    BoltError::Corrupt(what.into())
}

/// One entry of a bucket: a value, or a nested bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    Value(Vec<u8>),
    Bucket(Bucket),
}

/// A bucket's entries in ascending key order, each key once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bucket {
    pub entries: Vec<(Vec<u8>, Entry)>,
}

impl Bucket {
    /// Appends a value; keys must come in ascending order ([`write`] refuses others).
    pub fn put(&mut self, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) {
        self.entries.push((key.into(), Entry::Value(value.into())));
    }

    /// Appends a nested bucket, in key order like [`Bucket::put`].
    pub fn put_bucket(&mut self, name: impl Into<Vec<u8>>, bucket: Bucket) {
        self.entries.push((name.into(), Entry::Bucket(bucket)));
    }

    fn find(&self, key: &[u8]) -> Option<&Entry> {
        self.entries
            .binary_search_by(|(k, _)| k.as_slice().cmp(key))
            .ok()
            .map(|i| &self.entries[i].1)
    }

    /// The value under `key`, if it is a value.
    pub fn get(&self, key: &[u8]) -> Option<&[u8]> {
        match self.find(key)? {
            Entry::Value(v) => Some(v),
            Entry::Bucket(_) => None,
        }
    }

    /// The nested bucket under `name`.
    pub fn bucket(&self, name: &[u8]) -> Option<&Bucket> {
        match self.find(name)? {
            Entry::Bucket(b) => Some(b),
            Entry::Value(_) => None,
        }
    }

    /// The values of this bucket (not of nested ones), in key order.
    pub fn values(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.entries.iter().filter_map(|(k, e)| match e {
            Entry::Value(v) => Some((k.as_slice(), v.as_slice())),
            Entry::Bucket(_) => None,
        })
    }
}

/// A database as [`read`] finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Db {
    pub page_size: usize,
    /// Pages in use (the meta page's high water mark): the database's size is this many pages.
    pub pages: u64,
    pub txid: u64,
    /// The top-level buckets.
    pub root: Bucket,
}

impl Db {
    /// The size of the database proper, as bbolt's `tx.Size()` gives it.
    pub fn size(&self) -> u64 {
        self.pages * self.page_size as u64
    }
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

// ---- writing ----

/// Lays `root`'s buckets out as a bbolt database of [`PAGE_SIZE`] pages.
pub fn write(root: &Bucket) -> Result<Vec<u8>, BoltError> {
    let mut w = Writer {
        out: vec![0; 3 * PAGE_SIZE],
        next: 3,
    };
    let root_page = w.tree(root)?;
    // An empty freelist: every page below the high water mark is in use.
    w.header(2, FREELIST_PAGE, 0, 0);
    for id in 0..2u64 {
        let at = id as usize * PAGE_SIZE;
        w.header(id, META_PAGE, 0, 0);
        let m = &mut w.out[at + PAGE_HEADER..at + PAGE_HEADER + 64];
        m[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        m[4..8].copy_from_slice(&VERSION.to_le_bytes());
        m[8..12].copy_from_slice(&(PAGE_SIZE as u32).to_le_bytes());
        m[12..16].copy_from_slice(&0u32.to_le_bytes());
        m[16..24].copy_from_slice(&root_page.to_le_bytes());
        m[24..32].copy_from_slice(&0u64.to_le_bytes());
        m[32..40].copy_from_slice(&2u64.to_le_bytes());
        m[40..48].copy_from_slice(&w.next.to_le_bytes());
        // bbolt writes meta page `txid % 2`; the two are otherwise the same.
        m[48..56].copy_from_slice(&id.to_le_bytes());
        let sum = fnv1a64(&m[..META_CHECKED]);
        m[56..64].copy_from_slice(&sum.to_le_bytes());
    }
    Ok(w.out)
}

struct Writer {
    out: Vec<u8>,
    /// The next free page id.
    next: u64,
}

/// One element of a node being laid out: flags, key, and the value (leaf) or child page
/// (branch, as its 8 bytes).
type Element = (u32, Vec<u8>, Vec<u8>);

impl Writer {
    fn header(&mut self, id: u64, flags: u16, count: u16, overflow: u32) {
        let at = id as usize * PAGE_SIZE;
        self.out[at..at + 8].copy_from_slice(&id.to_le_bytes());
        self.out[at + 8..at + 10].copy_from_slice(&flags.to_le_bytes());
        self.out[at + 10..at + 12].copy_from_slice(&count.to_le_bytes());
        self.out[at + 12..at + 16].copy_from_slice(&overflow.to_le_bytes());
    }

    /// The elements of `bucket`'s entries, nested buckets written first.
    fn elements(&mut self, bucket: &Bucket) -> Result<Vec<Element>, BoltError> {
        let mut out = Vec::with_capacity(bucket.entries.len());
        for (i, (key, entry)) in bucket.entries.iter().enumerate() {
            if i > 0 && bucket.entries[i - 1].0 >= *key {
                return Err(BoltError::Invalid(format!(
                    "keys out of order or repeated at {}",
                    String::from_utf8_lossy(key)
                )));
            }
            if key.is_empty() {
                return Err(BoltError::Invalid("an empty key".into()));
            }
            match entry {
                Entry::Value(v) => out.push((0, key.clone(), v.clone())),
                Entry::Bucket(b) => {
                    let value = self.bucket_value(b)?;
                    out.push((BUCKET_LEAF, key.clone(), value));
                }
            }
        }
        Ok(out)
    }

    /// A nested bucket's value in its parent: inline when small and flat, as bbolt keeps it.
    fn bucket_value(&mut self, bucket: &Bucket) -> Result<Vec<u8>, BoltError> {
        let flat = bucket
            .entries
            .iter()
            .all(|(_, e)| matches!(e, Entry::Value(_)));
        let size = PAGE_HEADER
            + bucket
                .entries
                .iter()
                .map(|(k, e)| match e {
                    Entry::Value(v) => ELEMENT + k.len() + v.len(),
                    Entry::Bucket(_) => 0,
                })
                .sum::<usize>();
        let mut value = vec![0u8; BUCKET_HEADER];
        if flat && size <= PAGE_SIZE / 4 {
            let elements = self.elements(bucket)?;
            value.extend_from_slice(&node_image(0, LEAF_PAGE, &elements));
        } else {
            let root = self.tree(bucket)?;
            value[..8].copy_from_slice(&root.to_le_bytes());
        }
        Ok(value)
    }

    /// Writes a bucket's B+tree and returns its root page id.
    fn tree(&mut self, bucket: &Bucket) -> Result<u64, BoltError> {
        let elements = self.elements(bucket)?;
        let mut level = self.nodes(LEAF_PAGE, elements)?;
        while level.len() > 1 {
            let branch = level
                .into_iter()
                .map(|(first, id)| (0, first, id.to_le_bytes().to_vec()))
                .collect();
            level = self.nodes(BRANCH_PAGE, branch)?;
        }
        Ok(level[0].1)
    }

    /// Packs elements into nodes of one page each (a node of one large element spans more),
    /// writes them, and returns each node's first key and page id.
    fn nodes(
        &mut self,
        flags: u16,
        elements: Vec<Element>,
    ) -> Result<Vec<(Vec<u8>, u64)>, BoltError> {
        let element_size =
            |(_, k, v): &Element| ELEMENT + k.len() + if flags == LEAF_PAGE { v.len() } else { 0 };
        let mut groups: Vec<Vec<Element>> = vec![Vec::new()];
        let mut size = PAGE_HEADER;
        for e in elements {
            let n = element_size(&e);
            let current = groups.last_mut().expect("one group at least");
            if !current.is_empty()
                && (size + n > PAGE_SIZE || current.len() == usize::from(u16::MAX))
            {
                groups.push(Vec::new());
                size = PAGE_HEADER;
            }
            size += n;
            groups.last_mut().expect("one group at least").push(e);
        }
        let mut out = Vec::with_capacity(groups.len());
        for group in groups {
            let first = group.first().map(|(_, k, _)| k.clone()).unwrap_or_default();
            let id = self.next;
            let mut image = node_image(id, flags, &group);
            let pages = image.len().div_ceil(PAGE_SIZE).max(1);
            let overflow = u32::try_from(pages - 1)
                .map_err(|_| BoltError::Invalid("a value too large for one node".into()))?;
            image[12..16].copy_from_slice(&overflow.to_le_bytes());
            image.resize(pages * PAGE_SIZE, 0);
            self.out.extend_from_slice(&image);
            self.next += pages as u64;
            out.push((first, id));
        }
        Ok(out)
    }
}

/// A node's bytes: the page header, the elements, then their keys (and values).
fn node_image(id: u64, flags: u16, elements: &[Element]) -> Vec<u8> {
    let leaf = flags == LEAF_PAGE;
    let data: usize = elements
        .iter()
        .map(|(_, k, v)| k.len() + if leaf { v.len() } else { 0 })
        .sum();
    let mut out = vec![0u8; PAGE_HEADER + elements.len() * ELEMENT];
    out.reserve(data);
    out[0..8].copy_from_slice(&id.to_le_bytes());
    out[8..10].copy_from_slice(&flags.to_le_bytes());
    out[10..12].copy_from_slice(&(elements.len() as u16).to_le_bytes());
    for (i, (eflags, k, v)) in elements.iter().enumerate() {
        let at = PAGE_HEADER + i * ELEMENT;
        let pos = (out.len() - at) as u32;
        if leaf {
            out[at..at + 4].copy_from_slice(&eflags.to_le_bytes());
            out[at + 4..at + 8].copy_from_slice(&pos.to_le_bytes());
            out[at + 8..at + 12].copy_from_slice(&(k.len() as u32).to_le_bytes());
            out[at + 12..at + 16].copy_from_slice(&(v.len() as u32).to_le_bytes());
            out.extend_from_slice(k);
            out.extend_from_slice(v);
        } else {
            out[at..at + 4].copy_from_slice(&pos.to_le_bytes());
            out[at + 4..at + 8].copy_from_slice(&(k.len() as u32).to_le_bytes());
            out[at + 8..at + 16].copy_from_slice(v);
            out.extend_from_slice(k);
        }
    }
    out
}

// ---- reading ----

struct Meta {
    page_size: usize,
    root: u64,
    freelist: u64,
    pages: u64,
    txid: u64,
}

/// The meta page at `offset`, if it is a valid one.
fn meta_at(bytes: &[u8], offset: usize) -> Option<Meta> {
    let m = bytes.get(offset + PAGE_HEADER..offset + PAGE_HEADER + 64)?;
    if u32_at(m, 0) != MAGIC || u32_at(m, 4) != VERSION {
        return None;
    }
    if u64_at(m, 56) != fnv1a64(&m[..META_CHECKED]) {
        return None;
    }
    Some(Meta {
        page_size: u32_at(m, 8) as usize,
        root: u64_at(m, 16),
        freelist: u64_at(m, 32),
        pages: u64_at(m, 40),
        txid: u64_at(m, 48),
    })
}

/// Parses and checks a whole database. Bytes past its high water mark (etcd's trailing
/// SHA-256, or a file grown ahead of its use) are ignored.
pub fn read(bytes: &[u8]) -> Result<Db, BoltError> {
    let first = meta_at(bytes, 0);
    // The second meta page is found with the first's page size, or else bbolt's default.
    let second_at = first.as_ref().map_or(PAGE_SIZE, |m| m.page_size);
    let second = meta_at(bytes, second_at);
    let meta = match (first, second) {
        (Some(a), Some(b)) => {
            if b.txid > a.txid {
                b
            } else {
                a
            }
        }
        (Some(m), None) | (None, Some(m)) => m,
        (None, None) => return Err(BoltError::NotBolt),
    };
    if !(512..=1 << 20).contains(&meta.page_size) || !meta.page_size.is_power_of_two() {
        return Err(corrupt(format!("page size {}", meta.page_size)));
    }
    let size = meta
        .pages
        .checked_mul(meta.page_size as u64)
        .ok_or_else(|| corrupt("the high water mark is out of range"))?;
    if size > bytes.len() as u64 {
        return Err(corrupt(format!(
            "the file is truncated: the database has {} pages of {} bytes ({size} bytes), the file {} bytes",
            meta.pages,
            meta.page_size,
            bytes.len()
        )));
    }
    let mut r = Reader {
        bytes,
        page_size: meta.page_size,
        pages: meta.pages,
        seen: HashSet::new(),
    };
    if meta.freelist != NO_FREELIST {
        let (flags, _, _) = r.page(meta.freelist)?;
        if flags != FREELIST_PAGE {
            return Err(corrupt(format!(
                "page {} is not the freelist it should be",
                meta.freelist
            )));
        }
    }
    let root = r.tree(meta.root, 0)?;
    Ok(Db {
        page_size: meta.page_size,
        pages: meta.pages,
        txid: meta.txid,
        root,
    })
}

struct Reader<'a> {
    bytes: &'a [u8],
    page_size: usize,
    pages: u64,
    /// Pages already walked: a page referenced twice is damage.
    seen: HashSet<u64>,
}

impl<'a> Reader<'a> {
    /// A page's flags, element count and bytes (with its overflow pages), checked against the
    /// file and marked as seen.
    fn page(&mut self, id: u64) -> Result<(u16, usize, &'a [u8]), BoltError> {
        if id < 2 || id >= self.pages {
            return Err(corrupt(format!(
                "page {id} is out of bounds (the database has {} pages)",
                self.pages
            )));
        }
        let at = id as usize * self.page_size;
        let header = &self.bytes[at..at + PAGE_HEADER];
        if u64_at(header, 0) != id {
            return Err(corrupt(format!(
                "page {id} identifies itself as page {}",
                u64_at(header, 0)
            )));
        }
        let span = 1 + u64::from(u32_at(header, 12));
        if id + span > self.pages {
            return Err(corrupt(format!(
                "page {id} runs past the end of the database"
            )));
        }
        for p in id..id + span {
            if !self.seen.insert(p) {
                return Err(corrupt(format!("page {p} is referenced more than once")));
            }
        }
        let bytes = &self.bytes[at..at + span as usize * self.page_size];
        Ok((u16_at(header, 8), usize::from(u16_at(header, 10)), bytes))
    }

    /// The entries of the tree rooted at page `id`.
    fn tree(&mut self, id: u64, depth: usize) -> Result<Bucket, BoltError> {
        let mut bucket = Bucket::default();
        self.node(id, depth, &mut bucket)?;
        Ok(bucket)
    }

    fn node(&mut self, id: u64, depth: usize, into: &mut Bucket) -> Result<(), BoltError> {
        if depth > MAX_DEPTH {
            return Err(corrupt("the tree is nested too deep"));
        }
        let (flags, count, page) = self.page(id)?;
        match flags {
            LEAF_PAGE => self.leaf(page, count, depth, into, &format!("page {id}")),
            BRANCH_PAGE => {
                if count == 0 {
                    return Err(corrupt(format!("branch page {id} is empty")));
                }
                for i in 0..count {
                    let at = PAGE_HEADER + i * ELEMENT;
                    let e = page.get(at..at + ELEMENT).ok_or_else(|| {
                        corrupt(format!("branch page {id}: element {i} out of bounds"))
                    })?;
                    let (pos, ksize, child) =
                        (u32_at(e, 0) as usize, u32_at(e, 4) as usize, u64_at(e, 8));
                    let key = page.get(at + pos..at + pos + ksize).ok_or_else(|| {
                        corrupt(format!("branch page {id}: key {i} out of bounds"))
                    })?;
                    let before = into.entries.len();
                    self.node(child, depth + 1, into)?;
                    // A child's first key is the one its parent holds for it.
                    match into.entries.get(before) {
                        Some((first, _)) if first.as_slice() == key => {}
                        _ => {
                            return Err(corrupt(format!(
                                "branch page {id}: element {i} does not match the first key of page {child}"
                            )))
                        }
                    }
                }
                Ok(())
            }
            other => Err(corrupt(format!(
                "page {id} has type {other:#04x} where a branch or leaf page belongs"
            ))),
        }
    }

    /// Reads a leaf page's elements (`page` starts with its header) into `into`.
    fn leaf(
        &mut self,
        page: &'a [u8],
        count: usize,
        depth: usize,
        into: &mut Bucket,
        what: &str,
    ) -> Result<(), BoltError> {
        for i in 0..count {
            let at = PAGE_HEADER + i * ELEMENT;
            let e = page
                .get(at..at + ELEMENT)
                .ok_or_else(|| corrupt(format!("{what}: element {i} out of bounds")))?;
            let (flags, pos, ksize, vsize) = (
                u32_at(e, 0),
                u32_at(e, 4) as usize,
                u32_at(e, 8) as usize,
                u32_at(e, 12) as usize,
            );
            let key = page
                .get(at + pos..at + pos + ksize)
                .ok_or_else(|| corrupt(format!("{what}: key {i} out of bounds")))?;
            let value = page
                .get(at + pos + ksize..at + pos + ksize + vsize)
                .ok_or_else(|| corrupt(format!("{what}: value {i} out of bounds")))?;
            if let Some((last, _)) = into.entries.last() {
                if last.as_slice() >= key {
                    return Err(corrupt(format!("{what}: keys out of order at element {i}")));
                }
            }
            let entry = if flags & BUCKET_LEAF != 0 {
                Entry::Bucket(self.bucket(value, depth + 1, what)?)
            } else {
                Entry::Value(value.to_vec())
            };
            into.entries.push((key.to_vec(), entry));
        }
        Ok(())
    }

    /// A nested bucket from its value in the parent: inline, or a tree of its own.
    fn bucket(&mut self, value: &'a [u8], depth: usize, what: &str) -> Result<Bucket, BoltError> {
        if depth > MAX_DEPTH {
            return Err(corrupt("buckets are nested too deep"));
        }
        if value.len() < BUCKET_HEADER {
            return Err(corrupt(format!("{what}: a bucket header is cut short")));
        }
        let root = u64_at(value, 0);
        if root != 0 {
            return self.tree(root, depth);
        }
        let page = &value[BUCKET_HEADER..];
        if page.len() < PAGE_HEADER || u16_at(page, 8) != LEAF_PAGE {
            return Err(corrupt(format!(
                "{what}: an inline bucket without its leaf page"
            )));
        }
        let mut bucket = Bucket::default();
        let count = usize::from(u16_at(page, 10));
        self.leaf(
            page,
            count,
            depth,
            &mut bucket,
            &format!("{what} (inline bucket)"),
        )?;
        Ok(bucket)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(n: usize, value_len: usize) -> Bucket {
        let mut b = Bucket::default();
        for i in 0..n {
            b.put(format!("key-{i:08}"), vec![(i % 251) as u8; value_len]);
        }
        b
    }

    fn db(buckets: Vec<(impl Into<Vec<u8>>, Bucket)>) -> Bucket {
        let mut root = Bucket::default();
        for (name, b) in buckets {
            root.put_bucket(name, b);
        }
        root
    }

    #[test]
    fn round_trips_small_large_nested_and_empty_buckets() {
        let mut nested = bucket(3, 5);
        nested.put_bucket("zz-inner", bucket(2000, 40));
        let cases: Vec<(&str, Bucket)> = vec![
            ("empty database", Bucket::default()),
            ("one empty bucket", db(vec![("a", Bucket::default())])),
            (
                "inline buckets",
                db(vec![("a", bucket(3, 8)), ("b", bucket(1, 0))]),
            ),
            (
                "a bucket of many pages",
                db(vec![("key", bucket(50_000, 60))]),
            ),
            (
                "values larger than a page",
                db(vec![("big", bucket(5, 3 * PAGE_SIZE + 17))]),
            ),
            ("nested buckets", db(vec![("outer", nested)])),
            (
                "many top-level buckets",
                db((0..300)
                    .map(|i| (format!("b{i:04}"), bucket(i % 7, 9)))
                    .collect()),
            ),
        ];
        for (what, root) in cases {
            let bytes = write(&root).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(bytes.len() % PAGE_SIZE, 0, "{what}");
            let back = read(&bytes).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(back.root, root, "{what}");
            assert_eq!(back.size(), bytes.len() as u64, "{what}");
            // Every page below the high water mark is walked exactly once (bbolt's check).
            let mut r = Reader {
                bytes: &bytes,
                page_size: PAGE_SIZE,
                pages: back.pages,
                seen: HashSet::new(),
            };
            r.page(2).expect("freelist");
            let meta = meta_at(&bytes, 0).expect("meta");
            r.tree(meta.root, 0).expect("walk");
            assert_eq!(
                r.seen.len() as u64,
                back.pages - 2,
                "{what}: unreachable pages"
            );
        }
    }

    #[test]
    fn lookups_find_values_and_buckets() {
        let root = db(vec![("key", bucket(10, 3)), ("meta", bucket(2, 4))]);
        let back = read(&write(&root).expect("write")).expect("read");
        let key = back.root.bucket(b"key").expect("bucket");
        assert_eq!(key.get(b"key-00000003"), Some(&[3u8, 3, 3][..]));
        assert_eq!(key.get(b"nope"), None);
        assert_eq!(back.root.get(b"key"), None, "a bucket is not a value");
        assert_eq!(key.values().count(), 10);
    }

    #[test]
    fn refuses_unsorted_input() {
        let mut b = Bucket::default();
        b.put("b", "1");
        b.put("a", "2");
        assert!(matches!(
            write(&db(vec![("x", b)])),
            Err(BoltError::Invalid(_))
        ));
        let mut b = Bucket::default();
        b.put("a", "1");
        b.put("a", "2");
        assert!(matches!(
            write(&db(vec![("x", b)])),
            Err(BoltError::Invalid(_))
        ));
    }

    #[test]
    fn refuses_damage() {
        let bytes = write(&db(vec![
            ("key", bucket(5_000, 30)),
            ("meta", bucket(2, 8)),
        ]))
        .expect("write");
        assert_eq!(read(b"not a database at all"), Err(BoltError::NotBolt));
        assert_eq!(read(&vec![0u8; 3 * PAGE_SIZE]), Err(BoltError::NotBolt));
        let truncated = &bytes[..bytes.len() - PAGE_SIZE];
        assert!(matches!(read(truncated), Err(BoltError::Corrupt(e)) if e.contains("truncated")));
        // One meta page damaged: bbolt falls back to the other, and so does this reader.
        let mut one_meta = bytes.clone();
        one_meta[PAGE_HEADER + 20] ^= 1;
        assert_eq!(
            read(&one_meta).map(|d| d.root),
            read(&bytes).map(|d| d.root)
        );
        // Headers and elements of data pages are checked as they are walked. (Not every flipped
        // byte: bbolt's pages carry no checksum, which is what a snapshot's SHA-256 is for. The
        // root bucket's page, written last, has no parent to check its first key against.)
        let pages = bytes.len() / PAGE_SIZE;
        let mut refused = 0;
        for page in 3..pages - 1 {
            for (offset, what) in [
                (0, "page id"),
                (8, "page type"),
                (PAGE_HEADER + 4, "first element"),
            ] {
                let mut bad = bytes.clone();
                bad[page * PAGE_SIZE + offset] ^= 0x40;
                match read(&bad) {
                    Err(BoltError::Corrupt(_)) => refused += 1,
                    other => panic!("page {page}, {what}: {:?}", other.map(|d| d.pages)),
                }
            }
        }
        assert!(refused > 0);
    }

    #[test]
    fn writes_what_bbolt_expects_in_its_meta_pages() {
        let bytes = write(&db(vec![("a", bucket(1, 1))])).expect("write");
        for id in 0..2 {
            let page = &bytes[id * PAGE_SIZE..];
            assert_eq!(u64_at(page, 0), id as u64);
            assert_eq!(u16_at(page, 8), META_PAGE);
            let meta = meta_at(&bytes, id * PAGE_SIZE).expect("valid meta");
            assert_eq!(
                (meta.page_size, meta.freelist, meta.txid),
                (PAGE_SIZE, 2, id as u64)
            );
            assert_eq!(meta.pages as usize, bytes.len() / PAGE_SIZE);
        }
        assert_eq!(u16_at(&bytes[2 * PAGE_SIZE..], 8), FREELIST_PAGE);
    }
}
