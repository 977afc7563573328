//! The compressed index: its file format, reading (memory-mapped) and writing, decoding, and
//! search.
//!
//! # File format (version 1, little-endian)
//!
//! ```text
//! offset  size  field
//! 0       8     magic "VLCINDEX"
//! 8       4     version (1)
//! 12      4     number of sections S
//! 16      64    header: n u64, d u32, m u32, pq_bytes u32, codewords u32, assignment_bits u32,
//!               mode u32 (0 fast, 1 exact), seed u64, iterations u32, metric u32 (0 L2,
//!               1 cosine, 2 inner product: see [`crate::Metric`]; 0 in files written before
//!               it existed),
//!               energy f64, reconstruction MSE f64
//! 80      24*S  section table: kind u32, reserved u32, offset u64, length u64
//! ...           sections, each starting on an 8-byte boundary:
//!               1 anchors        m * d f16
//!               2 assignments    n values of assignment_bits bits, packed LSB-first
//!               3 subspaces      pq_bytes + 1 u32 dimension bounds
//!               4 codebooks      codewords * d f32 (subspace j's block: codewords x width_j)
//!               5 codes          n * pq_bytes u8
//!               6 ids            n u64, each at most 2^63 - 1 (optional: without it a
//!                                vector's id is its position)
//!               7 refine         n * d f16: the vectors themselves, as the metric prepares
//!                                them (optional: search re-ranks its candidates with them,
//!                                see [`Index::rerank`])
//! end-8   4     CRC-32 (IEEE) of every byte before it
//! end-4   4     end magic "VLC!"
//! ```
//!
//! Reading checks the magic, version, checksum, every size and bound, and every assignment:
//! a truncated or corrupted file is an [`Error::Format`](crate::Error::Format), never a panic.
//! The checksum guards against damage, not against an adversary, so every count read from the
//! header is bounded by what the file holds before anything is allocated or looped over:
//! `n` is at most [`MAX_VECTORS`] and at most 8 per byte of the file (a vector takes at least
//! one bit of assignment, except in a one-anchor index without residual codes, which stores
//! nothing per vector and so may not claim more vectors than that); `m`, `d` and the codebooks
//! are bounded by their sections' lengths. Reading does work linear in the file's size.

mod batch;
mod device;
mod device_refine;
mod edit;
mod exact;
mod refine;
mod search;

pub use device::DeviceSearch;
pub use exact::{exact_knn, exact_knn_by};
pub use search::{PRECOMPUTED_MAX_BYTES, recall_at, set_threads};

use crate::error::{Result, format_error, io_error};
use crate::pq::ProductQuantizer;
use crate::vectors::Matrix;
use half::f16;
use std::path::Path;
use std::sync::OnceLock;

pub const MAGIC: &[u8; 8] = b"VLCINDEX";

pub const END_MAGIC: &[u8; 4] = b"VLC!";

pub const VERSION: u32 = 1;

/// The most vectors an index holds (assignments and search ids are `u32`).
pub const MAX_VECTORS: usize = 1 << 32;

const HEADER_END: usize = 80;

const ENTRY: usize = 24;

/// Section kinds.
const ANCHORS: u32 = 1;

const ASSIGNMENTS: u32 = 2;

const SUBSPACES: u32 = 3;

const CODEBOOKS: u32 = 4;

const CODES: u32 = 5;

const IDS: u32 = 6;

const REFINE: u32 = 7;

/// The header's scalar fields.
#[derive(Clone, Debug, PartialEq)]
pub struct Header {
    pub n: usize,
    pub d: usize,
    pub m: usize,
    pub pq_bytes: usize,
    pub codewords: usize,
    pub assignment_bits: u32,
    /// True when built in exact (reproducible) mode.
    pub exact: bool,
    pub seed: u64,
    pub iterations: u32,
    pub energy: f64,
    pub mse: f64,
    pub metric: crate::Metric,
}

/// Bits per assignment: `ceil(log2 m)` (0 for one anchor).
pub fn assignment_bits(m: usize) -> u32 {
    if m <= 1 {
        0
    } else {
        usize::BITS - (m - 1).leading_zeros()
    }
}

/// Packs values of `bits` bits each, LSB-first.
pub fn pack_bits(values: &[u32], bits: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity((values.len() * bits as usize).div_ceil(8));
    // Bits not yet written, lowest first (at most 7 + 32 of them).
    let (mut pending, mut held) = (0u64, 0u32);
    let mask = low_bits(bits);
    for &v in values {
        pending |= (v as u64 & mask) << held;
        held += bits;
        while held >= 8 {
            out.push(pending as u8);
            pending >>= 8;
            held -= 8;
        }
    }
    if held > 0 {
        out.push(pending as u8);
    }
    out
}

/// A mask of the low `bits` bits (at most 32).
fn low_bits(bits: u32) -> u64 {
    (1u64 << bits) - 1
}

/// Value `i` of a packed array.
pub fn unpack_bit(packed: &[u8], bits: u32, i: usize) -> u32 {
    let start = i * bits as usize;
    // The (at most five) bytes holding the value, as one little-endian word.
    let first = start / 8;
    let last = (start + bits as usize).div_ceil(8).min(packed.len());
    let mut word = 0u64;
    for (k, &byte) in packed[first..last].iter().enumerate() {
        word |= (byte as u64) << (8 * k);
    }
    ((word >> (start % 8)) & low_bits(bits)) as u32
}

/// The mean over `n` vectors of the squared distance between `data`'s row `i` and its
/// reconstruction, which `reconstruct(i, row)` writes. Rows are spread over threads, and
/// their errors added in row order, so the result does not depend on the thread count.
fn mean_squared_error(
    data: &Matrix,
    n: usize,
    reconstruct: impl Fn(usize, &mut [f32]) + Sync,
) -> f64 {
    let rows = n.min(data.rows);
    let row_errors = |range: std::ops::Range<usize>| -> Vec<f64> {
        let mut row = vec![0f32; data.cols];
        range
            .map(|i| {
                reconstruct(i, &mut row);
                // Eight running sums in a fixed order: one chain of dependent adds would take
                // most of the time.
                let mut lanes = [0f64; 8];
                for (ca, cb) in data.row(i).chunks(8).zip(row.chunks(8)) {
                    for ((lane, &x), &y) in lanes.iter_mut().zip(ca).zip(cb) {
                        let t = (x - y) as f64;
                        *lane += t * t;
                    }
                }
                lanes.iter().sum::<f64>()
            })
            .collect()
    };
    let threads = std::thread::available_parallelism()
        .map_or(1, |t| t.get())
        .min(rows / 2048)
        .max(1);
    let per = rows.div_ceil(threads).max(1);
    let errors: Vec<f64> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..rows)
            .step_by(per)
            .map(|start| {
                let row_errors = &row_errors;
                s.spawn(move || row_errors(start..(start + per).min(rows)))
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("error threads do not panic"))
            .collect()
    });
    errors.iter().sum::<f64>() / n.max(1) as f64
}

/// Everything an index holds, in memory, before it is written.
#[derive(Clone, Debug)]
pub struct IndexParts {
    pub header: Header,
    pub anchors: Vec<f16>,
    pub assignments: Vec<u32>,
    pub pq: ProductQuantizer,
    pub codes: Vec<u8>,
    /// The vectors' ids; `None`: their positions.
    pub ids: Option<Vec<u64>>,
    /// The vectors themselves (`n x d`, as the metric prepares them) for re-ranking; `None`
    /// where the index keeps only codes.
    pub refine: Option<Vec<f16>>,
}

impl IndexParts {
    /// Mean squared reconstruction error over `data`, as [`Index::reconstruction_mse`] gives
    /// it once the parts are written.
    pub fn reconstruction_mse(&self, data: &Matrix) -> f64 {
        let d = self.header.d;
        // Decoded once: converting f16 per element and row would dominate.
        let anchors: Vec<f32> = self.anchors.iter().map(|v| v.to_f32()).collect();
        mean_squared_error(data, self.header.n, |i, row| {
            let a = self.assignments[i] as usize;
            row.copy_from_slice(&anchors[a * d..(a + 1) * d]);
            self.pq.add_decoded(
                &self.codes[i * self.header.pq_bytes..][..self.header.pq_bytes],
                row,
            );
        })
    }

    /// The bytes of the file.
    pub fn to_bytes(&self) -> Vec<u8> {
        let h = &self.header;
        let sections: Vec<(u32, Vec<u8>)> = vec![
            (ANCHORS, bytemuck::cast_slice(&self.anchors).to_vec()),
            (ASSIGNMENTS, pack_bits(&self.assignments, h.assignment_bits)),
            (
                SUBSPACES,
                self.pq
                    .bounds
                    .iter()
                    .flat_map(|&b| (b as u32).to_le_bytes())
                    .collect(),
            ),
            (CODEBOOKS, bytemuck::cast_slice(&self.pq.codebooks).to_vec()),
            (CODES, self.codes.clone()),
        ];
        let mut sections = sections;
        if let Some(ids) = &self.ids {
            sections.push((IDS, ids.iter().flat_map(|v| v.to_le_bytes()).collect()));
        }
        if let Some(refine) = &self.refine {
            sections.push((REFINE, bytemuck::cast_slice(refine).to_vec()));
        }
        let mut out = Vec::new();
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&(sections.len() as u32).to_le_bytes());
        out.extend_from_slice(&(h.n as u64).to_le_bytes());
        for v in [
            h.d as u32,
            h.m as u32,
            h.pq_bytes as u32,
            h.codewords as u32,
            h.assignment_bits,
            h.exact as u32,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&h.seed.to_le_bytes());
        out.extend_from_slice(&h.iterations.to_le_bytes());
        out.extend_from_slice(&h.metric.code().to_le_bytes());
        out.extend_from_slice(&h.energy.to_le_bytes());
        out.extend_from_slice(&h.mse.to_le_bytes());
        debug_assert_eq!(out.len(), HEADER_END);
        let mut offset = (HEADER_END + ENTRY * sections.len()).next_multiple_of(8);
        let mut table = Vec::new();
        for (kind, body) in &sections {
            table.extend_from_slice(&kind.to_le_bytes());
            table.extend_from_slice(&0u32.to_le_bytes());
            table.extend_from_slice(&(offset as u64).to_le_bytes());
            table.extend_from_slice(&(body.len() as u64).to_le_bytes());
            offset = (offset + body.len()).next_multiple_of(8);
        }
        out.extend_from_slice(&table);
        for (_, body) in &sections {
            out.resize(out.len().next_multiple_of(8), 0);
            out.extend_from_slice(body);
        }
        out.resize(out.len().next_multiple_of(8), 0);
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(END_MAGIC);
        out
    }
}

enum Storage {
    Owned(Vec<u8>),
    Mapped(memmap2::Mmap),
}

impl std::ops::Deref for Storage {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Storage::Owned(v) => v,
            Storage::Mapped(m) => m,
        }
    }
}

/// A validated index, held in memory or memory-mapped. Assignments and codes are read in
/// place; anchors and codebooks are decoded once.
pub struct Index {
    storage: Storage,
    pub header: Header,
    /// `m x d` anchors, decoded from f16.
    pub anchors: Vec<f32>,
    pub pq: ProductQuantizer,
    assignments: std::ops::Range<usize>,
    codes: std::ops::Range<usize>,
    ids: Option<std::ops::Range<usize>>,
    refine: Option<std::ops::Range<usize>>,
    lists: OnceLock<search::Lists>,
    /// Search's precomputed tables ([`Index::precomputed`]), computed on first use.
    precomputed: OnceLock<Option<Vec<f32>>>,
    /// [`Index::reach`], computed on first use.
    reach: OnceLock<f64>,
}

impl std::fmt::Debug for Index {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Index({:?}, {} bytes)", self.header, self.storage.len())
    }
}

impl Index {
    /// Maps and validates a file.
    pub fn open(path: impl AsRef<Path>) -> Result<Index> {
        let path = path.as_ref();
        let file = std::fs::File::open(path).map_err(|e| io_error(path, e))?;
        // SAFETY: the map is read-only and lives as long as `Storage::Mapped`. Every writer of
        // this project replaces index files by rename (hal::durable), which leaves the mapped
        // file untouched, so a reader keeps its contents while the name is rewritten. A file
        // truncated in place by some other program while mapped is outside what any mmap
        // reader can guard against (the kernel would raise SIGBUS).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| io_error(path, e))?;
        Self::parse(Storage::Mapped(map), &path.display().to_string())
    }

    /// Validates an index held in memory.
    pub fn from_bytes(bytes: Vec<u8>, name: &str) -> Result<Index> {
        Self::parse(Storage::Owned(bytes), name)
    }

    /// Writes the index's bytes to `path`, atomically ([`hal::durable::write_atomic`]): the
    /// old file stays whole until the new one is complete, so saving over the file this index
    /// was mapped from, or over one another process is reading, is safe.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        hal::durable::write_bytes_atomic(path, &self.storage).map_err(|e| io_error(path, e))
    }

    /// Size of the file in bytes.
    pub fn file_size(&self) -> usize {
        self.storage.len()
    }

    fn parse(storage: Storage, name: &str) -> Result<Index> {
        let bytes: &[u8] = &storage;
        let bad = |d: String| format_error(name, d);
        check_envelope(bytes, name)?;
        let (header, sections) = read_header(bytes, name)?;
        let h = &header;
        let ranges = section_ranges(bytes, h, sections, name)?;
        let range = |kind: u32| {
            ranges[kind as usize]
                .clone()
                .ok_or_else(|| bad(format!("section {kind} is missing")))
        };
        let anchors: Vec<f32> = bytes[range(ANCHORS)?]
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect();
        if anchors.iter().any(|v| !v.is_finite()) {
            return Err(bad("an anchor is not finite".into()));
        }
        let bounds: Vec<usize> = bytes[range(SUBSPACES)?]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()) as usize)
            .collect();
        let bounds_ok = bounds.first() == Some(&0)
            && (h.pq_bytes == 0 || bounds.last() == Some(&h.d))
            && bounds.windows(2).all(|w| w[0] < w[1]);
        if !bounds_ok {
            return Err(bad(format!(
                "subspace bounds {bounds:?} do not split {} dimensions",
                h.d
            )));
        }
        let codebooks: Vec<f32> = bytes[range(CODEBOOKS)?]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        if codebooks.iter().any(|v| !v.is_finite()) {
            return Err(bad("a codeword is not finite".into()));
        }
        let assignments = range(ASSIGNMENTS)?;
        let packed = &bytes[assignments.clone()];
        // With 0 bits (one anchor) every assignment is 0: nothing to check. Otherwise the
        // section holds n * bits bits, so this loop is linear in the file's size.
        if h.assignment_bits > 0
            && let Some(i) =
                (0..h.n).find(|&i| unpack_bit(packed, h.assignment_bits, i) as usize >= h.m)
        {
            return Err(bad(format!(
                "vector {i} is assigned to anchor {}, beyond the {} anchors",
                unpack_bit(packed, h.assignment_bits, i),
                h.m
            )));
        }
        let codes = range(CODES)?;
        if h.codewords < 256
            && let Some(&c) = bytes[codes.clone()]
                .iter()
                .find(|&&c| c as usize >= h.codewords)
        {
            return Err(bad(format!(
                "a residual code ({c}) exceeds the {} codewords",
                h.codewords
            )));
        }
        let ids = ranges[IDS as usize].clone();
        if let Some(r) = &ids
            && let Some((i, v)) = bytes[r.clone()]
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
                .enumerate()
                .find(|&(_, v)| v > crate::vectors::MAX_ID)
        {
            return Err(bad(format!("vector {i} has id {v}, above 2^63 - 1")));
        }
        let refine = ranges[REFINE as usize].clone();
        if let Some(r) = &refine
            && let Some(at) = bytes[r.clone()]
                .chunks_exact(2)
                .position(|c| !f16::from_le_bytes([c[0], c[1]]).is_finite())
        {
            return Err(bad(format!(
                "refine vector {} holds a non-finite value",
                at / h.d
            )));
        }
        let pq = ProductQuantizer {
            dim: h.d,
            codewords: h.codewords,
            bounds,
            codebooks,
        };
        Ok(Index {
            header,
            anchors,
            pq,
            assignments,
            codes,
            ids,
            refine,
            lists: OnceLock::new(),
            precomputed: OnceLock::new(),
            reach: OnceLock::new(),
            storage,
        })
    }

    /// Vector `i`'s id: the one stored, or its position where the index stores none.
    pub fn id(&self, i: usize) -> u64 {
        match &self.ids {
            Some(r) => u64::from_le_bytes(
                self.storage[r.start + 8 * i..r.start + 8 * i + 8]
                    .try_into()
                    .expect("eight bytes"),
            ),
            None => i as u64,
        }
    }

    /// Whether the index stores ids of its own (otherwise ids are positions).
    pub fn has_ids(&self) -> bool {
        self.ids.is_some()
    }

    /// The anchor of vector `i`.
    pub fn assignment(&self, i: usize) -> u32 {
        unpack_bit(
            &self.storage[self.assignments.clone()],
            self.header.assignment_bits,
            i,
        )
    }

    /// Vector `i`'s residual code (one byte per subspace).
    pub fn code(&self, i: usize) -> &[u8] {
        let b = self.header.pq_bytes;
        &self.storage[self.codes.clone()][i * b..(i + 1) * b]
    }

    pub fn anchor(&self, a: usize) -> &[f32] {
        let d = self.header.d;
        &self.anchors[a * d..(a + 1) * d]
    }

    /// The reconstruction of vector `i`: its anchor plus its decoded residual.
    pub fn reconstruct(&self, i: usize, out: &mut [f32]) {
        out.copy_from_slice(self.anchor(self.assignment(i) as usize));
        self.pq.add_decoded(self.code(i), out);
    }

    /// Every vector reconstructed. Fails, before allocating, when `n x d` f32 values do not
    /// fit in memory (a small file may describe many vectors: that is what compression is).
    pub fn decompress(&self) -> crate::Result<Matrix> {
        let (n, d) = (self.header.n, self.header.d);
        let too_large = || {
            crate::error::input(format!(
                "decompressing {n} x {d} vectors needs {} bytes of f32, more than this machine can allocate",
                n as u128 * d as u128 * 4
            ))
        };
        let len = n
            .checked_mul(d)
            .filter(|l| l.checked_mul(4).is_some_and(|b| b <= isize::MAX as usize))
            .filter(|l| available_memory().is_none_or(|a| (*l as u64).saturating_mul(4) <= a))
            .ok_or_else(too_large)?;
        let mut data = Vec::new();
        data.try_reserve_exact(len).map_err(|_| too_large())?;
        data.resize(len, 0f32);
        for (i, row) in data.chunks_exact_mut(d).enumerate() {
            self.reconstruct(i, row);
        }
        Ok(Matrix {
            rows: n,
            cols: d,
            data,
        })
    }

    /// Mean squared reconstruction error over `data` (the vectors this index was built from).
    /// Mean squared error of the reconstructions against `data` (as the index's metric
    /// prepares it: unit vectors for cosine). Data a cosine index cannot normalise gives NaN.
    pub fn reconstruction_mse(&self, data: &Matrix) -> f64 {
        match self.header.metric.prepare(data) {
            Ok(data) => mean_squared_error(&data, self.header.n, |i, row| self.reconstruct(i, row)),
            Err(_) => f64::NAN,
        }
    }
}
/// Little-endian integers and floats at byte offsets of a file already checked long enough.
fn u32_at(bytes: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(bytes[o..o + 4].try_into().expect("four bytes"))
}
fn u64_at(bytes: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(bytes[o..o + 8].try_into().expect("eight bytes"))
}
fn f64_at(bytes: &[u8], o: usize) -> f64 {
    f64::from_le_bytes(bytes[o..o + 8].try_into().expect("eight bytes"))
}

/// The magic, the version, the end marker and the checksum of index file `name`.
fn check_envelope(bytes: &[u8], name: &str) -> Result<()> {
    let bad = |d: String| format_error(name, d);
    if bytes.len() < 8 || &bytes[..8] != MAGIC {
        return Err(bad("not a vlc index (no VLCINDEX magic)".into()));
    }
    if bytes.len() < HEADER_END + 8 {
        return Err(bad(format!("truncated: {} bytes", bytes.len())));
    }
    let version = u32_at(bytes, 8);
    if version != VERSION {
        return Err(bad(format!(
            "format version {version}; this reader knows version {VERSION}"
        )));
    }
    let end = bytes.len();
    if &bytes[end - 4..] != END_MAGIC {
        return Err(bad("truncated: the end marker is missing".into()));
    }
    let stored = u32_at(bytes, end - 8);
    let crc = crc32fast::hash(&bytes[..end - 8]);
    if stored != crc {
        return Err(bad(format!(
            "checksum mismatch (stored {stored:08x}, computed {crc:08x}): the file is corrupted"
        )));
    }
    Ok(())
}

/// The header of a file whose envelope checked out, and its count of sections; sizes the
/// file cannot hold, or that contradict each other, are refused.
fn read_header(bytes: &[u8], name: &str) -> Result<(Header, usize)> {
    let bad = |d: String| format_error(name, d);
    let end = bytes.len();
    let sections = u32_at(bytes, 12) as usize;
    let header = Header {
        n: u64_at(bytes, 16) as usize,
        d: u32_at(bytes, 24) as usize,
        m: u32_at(bytes, 28) as usize,
        pq_bytes: u32_at(bytes, 32) as usize,
        codewords: u32_at(bytes, 36) as usize,
        assignment_bits: u32_at(bytes, 40),
        exact: u32_at(bytes, 44) == 1,
        seed: u64_at(bytes, 48),
        iterations: u32_at(bytes, 56),
        energy: f64_at(bytes, 64),
        mse: f64_at(bytes, 72),
        metric: crate::Metric::from_code(u32_at(bytes, 60)).ok_or_else(|| {
            bad(format!(
                "unknown metric {} (0 is L2, 1 cosine, 2 inner product)",
                u32_at(bytes, 60)
            ))
        })?,
    };
    let h = &header;
    if h.d == 0 || h.m == 0 || h.n == 0 || h.m > h.n {
        return Err(bad(format!(
            "impossible sizes: n = {}, d = {}, m = {}",
            h.n, h.d, h.m
        )));
    }
    if u64_at(bytes, 16) > MAX_VECTORS as u64 || h.n > end.saturating_mul(8) {
        return Err(bad(format!(
            "{} vectors claimed: more than the format's {MAX_VECTORS} or than a file of {end} bytes can account for (8 per byte)",
            u64_at(bytes, 16)
        )));
    }
    if h.assignment_bits != assignment_bits(h.m) {
        return Err(bad(format!(
            "{} bits per assignment for {} anchors (expected {})",
            h.assignment_bits,
            h.m,
            assignment_bits(h.m)
        )));
    }
    if h.pq_bytes > h.d || h.codewords > 256 || (h.pq_bytes > 0) != (h.codewords > 0) {
        return Err(bad(format!(
            "impossible residual code: {} bytes, {} codewords for dimension {}",
            h.pq_bytes, h.codewords, h.d
        )));
    }
    if sections > 64 || HEADER_END + ENTRY * sections > end - 8 {
        return Err(bad(format!("{sections} sections do not fit the file")));
    }
    Ok((header, sections))
}

/// Each section kind's byte range, from the section table: every section of a known kind,
/// once, of the length the header implies, inside the file past the table.
fn section_ranges(
    bytes: &[u8],
    h: &Header,
    sections: usize,
    name: &str,
) -> Result<[Option<std::ops::Range<usize>>; 8]> {
    let bad = |d: String| format_error(name, d);
    let end = bytes.len();
    let expected = |kind: u32| -> Option<usize> {
        Some(match kind {
            ANCHORS => h.m.checked_mul(h.d)?.checked_mul(2)?,
            ASSIGNMENTS => h.n.checked_mul(h.assignment_bits as usize)?.div_ceil(8),
            SUBSPACES => (h.pq_bytes + 1) * 4,
            CODEBOOKS => h.codewords.checked_mul(h.d)?.checked_mul(4)?,
            CODES => h.n.checked_mul(h.pq_bytes)?,
            IDS => h.n.checked_mul(8)?,
            REFINE => h.n.checked_mul(h.d)?.checked_mul(2)?,
            _ => return None,
        })
    };
    let mut ranges: [Option<std::ops::Range<usize>>; 8] = Default::default();
    for s in 0..sections {
        let at = HEADER_END + ENTRY * s;
        let kind = u32_at(bytes, at);
        let (offset, len) = (
            u64_at(bytes, at + 8) as usize,
            u64_at(bytes, at + 16) as usize,
        );
        let want = expected(kind).ok_or_else(|| bad(format!("unknown section kind {kind}")))?;
        if len != want {
            return Err(bad(format!(
                "section {kind} holds {len} bytes; the header implies {want}"
            )));
        }
        let stop = offset
            .checked_add(len)
            .filter(|&e| e <= end - 8 && offset >= HEADER_END + ENTRY * sections)
            .ok_or_else(|| bad(format!("section {kind} lies outside the file")))?;
        if ranges[kind as usize].replace(offset..stop).is_some() {
            return Err(bad(format!("section {kind} appears twice")));
        }
    }
    Ok(ranges)
}

/// Bytes of memory available now (Linux's `MemAvailable`), or `None` where unknown.
/// The memory the system says is available (`MemAvailable` in `/proc/meminfo`; `None` where
/// there is no such file): a bound that callers check large allocations against, since an
/// allocation beyond it is not refused by an overcommitting kernel but killed later.
pub fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib.saturating_mul(1024))
}
