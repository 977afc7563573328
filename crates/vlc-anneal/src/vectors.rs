//! Input vectors: the [`Matrix`] type and the `.npy` and `.fvecs` readers and writers.
//!
//! `.npy` (NumPy's format, versions 1, 2 and 3 of the header): two-dimensional, C order,
//! little-endian `f4` or `f2`. `.fvecs` (the TEXMEX corpus format): each vector is its
//! dimension as a little-endian `i32` followed by that many `f32`s; every vector must have the
//! same dimension. Anything else is a clear [`Error::Format`], never a panic.

use crate::error::{Error, Result, format_error, input, io_error};
use std::path::Path;

/// `rows` vectors of `cols` `f32`s, row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct Matrix {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f32>,
}

/// `len` values must form `rows x cols` vectors.
fn check_size(rows: usize, cols: usize, len: usize) -> Result<()> {
    match rows.checked_mul(cols) == Some(len) {
        true => Ok(()),
        false => Err(input(format!(
            "{len} values cannot form {rows} x {cols} vectors"
        ))),
    }
}

/// The error for `data[i]`, the first value that is not finite.
fn non_finite(data: &[f32], i: usize, cols: usize) -> crate::Error {
    input(format!(
        "vector {} has a non-finite value ({}) at dimension {}",
        i / cols.max(1),
        data[i],
        i % cols.max(1)
    ))
}

/// Checks that every value of `data` is finite, on every core in parts of at least a million
/// values, copying each part into `copy` on the way where given (as long as `data`).
fn check_finite(data: &[f32], cols: usize, copy: Option<&mut [f32]>) -> Result<()> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let part = data.len().div_ceil(threads).max(1 << 20);
    let first_bad = std::thread::scope(|s| {
        let check = move |k: usize, src: &[f32]| {
            src.iter()
                .position(|v| !v.is_finite())
                .map(|i| k * part + i)
        };
        let parts: Vec<_> = match copy {
            Some(out) => out
                .chunks_mut(part)
                .zip(data.chunks(part))
                .enumerate()
                .map(|(k, (dst, src))| {
                    s.spawn(move || {
                        dst.copy_from_slice(src);
                        check(k, src)
                    })
                })
                .collect(),
            None => data
                .chunks(part)
                .enumerate()
                .map(|(k, src)| s.spawn(move || check(k, src)))
                .collect(),
        };
        parts
            .into_iter()
            .filter_map(|h| h.join().expect("checking threads do not panic"))
            .min()
    });
    match first_bad {
        Some(i) => Err(non_finite(data, i, cols)),
        None => Ok(()),
    }
}

/// `rows` vectors of `cols` `f32`s, row-major, borrowed: what a compression reads, whoever
/// owns the values (a [`Matrix`], or a caller's array that should not be copied).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MatrixRef<'a> {
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [f32],
}

impl<'a> MatrixRef<'a> {
    /// Checks the size and (on every core) that every value is finite; copies nothing.
    pub fn new(rows: usize, cols: usize, data: &'a [f32]) -> Result<Self> {
        check_size(rows, cols, data.len())?;
        check_finite(data, cols, None)?;
        Ok(Self { rows, cols, data })
    }

    pub fn row(&self, i: usize) -> &'a [f32] {
        &self.data[i * self.cols..(i + 1) * self.cols]
    }

    /// An owned copy.
    pub fn to_matrix(&self) -> Matrix {
        Matrix {
            rows: self.rows,
            cols: self.cols,
            data: self.data.to_vec(),
        }
    }
}

impl Matrix {
    /// Checks the size and that every value is finite.
    pub fn new(rows: usize, cols: usize, data: Vec<f32>) -> Result<Self> {
        check_size(rows, cols, data.len())?;
        if let Some(i) = data.iter().position(|v| !v.is_finite()) {
            return Err(non_finite(&data, i, cols));
        }
        Ok(Self { rows, cols, data })
    }

    /// [`Matrix::new`] of a copy of `data`, copied and checked on every core in parts of at
    /// least a million values: a million 384-d vectors handed over from Python are 1.5 GB,
    /// which one thread copies and scans in about a second.
    pub fn from_slice(rows: usize, cols: usize, data: &[f32]) -> Result<Self> {
        check_size(rows, cols, data.len())?;
        // Zeroed pages come from the system untouched: each thread faults in its own part.
        let mut out = vec![0f32; data.len()];
        check_finite(data, cols, Some(&mut out))?;
        Ok(Self {
            rows,
            cols,
            data: out,
        })
    }

    /// The matrix, borrowed.
    pub fn view(&self) -> MatrixRef<'_> {
        MatrixRef {
            rows: self.rows,
            cols: self.cols,
            data: &self.data,
        }
    }

    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.cols..(i + 1) * self.cols]
    }

    /// The first `rows` vectors (all of them when there are fewer).
    pub fn head(&self, rows: usize) -> Matrix {
        let rows = rows.min(self.rows);
        Matrix {
            rows,
            cols: self.cols,
            data: self.data[..rows * self.cols].to_vec(),
        }
    }

    /// Reads `.npy`, `.fvecs` or `.bvecs`, chosen by the extension.
    pub fn load(path: impl AsRef<Path>) -> Result<Matrix> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|e| io_error(path, e))?;
        let name = path.display().to_string();
        match path.extension().and_then(|e| e.to_str()) {
            Some("npy") => parse_npy(&bytes, &name),
            Some("fvecs") => parse_fvecs(&bytes, &name),
            Some("bvecs") => parse_bvecs(&bytes, &name),
            _ => Err(format_error(
                &name,
                "unknown extension: vectors are read from .npy, .fvecs or .bvecs",
            )),
        }
    }

    /// Writes `.npy` (version 1, `<f4`) or `.fvecs`, chosen by the extension.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let bytes = match path.extension().and_then(|e| e.to_str()) {
            Some("npy") => npy_bytes(self),
            Some("fvecs") => fvecs_bytes(self),
            _ => {
                return Err(format_error(
                    &path.display().to_string(),
                    "unknown extension: vectors are written as .npy or .fvecs",
                ));
            }
        };
        hal::durable::write_bytes_atomic(path, &bytes).map_err(|e| io_error(path, e))
    }
}

/// A two-dimensional `.npy` array as stored: its dtype, order, shape and data.
pub(crate) struct NpyArray<'a> {
    pub descr: &'a str,
    pub fortran: bool,
    pub rows: usize,
    pub cols: usize,
    pub body: &'a [u8],
}

/// Parses a `.npy` file's header (versions 1 to 3) and checks it holds a two-dimensional array
/// (or, with `one_dimensional`, a one-dimensional one, read as a column).
pub(crate) fn npy_array<'a>(
    bytes: &'a [u8],
    name: &str,
    one_dimensional: bool,
) -> Result<NpyArray<'a>> {
    let bad = |d: String| format_error(name, d);
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err(bad("not a .npy file (no \\x93NUMPY magic)".into()));
    }
    let (major, minor) = (bytes[6], bytes[7]);
    let (header_len, start) = match major {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10usize),
        2 | 3 => {
            if bytes.len() < 12 {
                return Err(bad("truncated header".into()));
            }
            (
                u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize,
                12,
            )
        }
        _ => {
            return Err(bad(format!(
                "npy format version {major}.{minor} is not supported (1.0, 2.0 and 3.0 are)"
            )));
        }
    };
    let end = start
        .checked_add(header_len)
        .filter(|&e| e <= bytes.len())
        .ok_or_else(|| bad("truncated header".into()))?;
    let header =
        std::str::from_utf8(&bytes[start..end]).map_err(|_| bad("header is not text".into()))?;
    let field = |key: &str| -> Option<&str> {
        let at = header.find(&format!("'{key}'"))? + key.len() + 2;
        let rest = header[at..].trim_start().strip_prefix(':')?.trim_start();
        Some(rest)
    };
    let descr = field("descr")
        .and_then(|r| r.strip_prefix('\''))
        .and_then(|r| r.split('\'').next())
        .ok_or_else(|| bad("header has no 'descr'".into()))?;
    let fortran = field("fortran_order")
        .ok_or_else(|| bad("header has no 'fortran_order'".into()))?
        .starts_with("True");
    let shape_text = field("shape")
        .and_then(|r| r.strip_prefix('('))
        .and_then(|r| r.split(')').next())
        .ok_or_else(|| bad("header has no 'shape'".into()))?;
    let shape: Vec<usize> = shape_text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>())
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| bad(format!("shape ({shape_text}) is not a list of sizes")))?;
    let (rows, cols) = match shape[..] {
        [rows, cols] => (rows, cols),
        // A vector of values (ids, say) reads as one column.
        [rows] if one_dimensional => (rows, 1),
        _ => {
            return Err(bad(format!(
                "expected a two-dimensional array, found shape {shape:?}"
            )));
        }
    };
    Ok(NpyArray {
        descr,
        fortran,
        rows,
        cols,
        body: &bytes[end..],
    })
}

/// Checks that an array's data is exactly `rows x cols` elements of `width` bytes.
pub(crate) fn check_body(a: &NpyArray<'_>, width: usize, name: &str) -> Result<()> {
    let (rows, cols, descr) = (a.rows, a.cols, a.descr);
    let expected = rows
        .checked_mul(cols)
        .and_then(|count| count.checked_mul(width))
        .ok_or_else(|| format_error(name, format!("shape ({rows}, {cols}) overflows")))?;
    if a.body.len() != expected {
        return Err(format_error(
            name,
            format!(
                "{} bytes of data for shape ({rows}, {cols}) of {descr}: expected {expected} (truncated or padded file)",
                a.body.len(),
            ),
        ));
    }
    Ok(())
}

/// Parses a `.npy` file held in memory: a two-dimensional array of float16, float32 or
/// float64 (either byte order, C or Fortran order), converted to float32 row-major (a float64
/// beyond float32's range is an error naming the vector).
pub fn parse_npy(bytes: &[u8], name: &str) -> Result<Matrix> {
    let bad = |d: String| format_error(name, d);
    let array = npy_array(bytes, name, false)?;
    let NpyArray {
        descr,
        fortran,
        rows,
        cols,
        body,
    } = array;
    // Floats of 2, 4 or 8 bytes in either byte order ('=' is native: little-endian here);
    // converted to f32.
    let (big, width) = match descr.as_bytes() {
        [order @ (b'<' | b'>' | b'='), b'f', w @ (b'2' | b'4' | b'8')] => {
            (*order == b'>', (w - b'0') as usize)
        }
        _ => {
            return Err(bad(format!(
                "dtype {descr} is not supported: vectors must be floats (float16, float32 or \
                 float64, either byte order)"
            )));
        }
    };
    check_body(&array, width, name)?;
    let word = |c: &[u8]| -> [u8; 8] {
        let mut w = [0u8; 8];
        w[..c.len()].copy_from_slice(c);
        if big {
            w[..c.len()].reverse();
        }
        w
    };
    let mut data: Vec<f32> = Vec::with_capacity(rows * cols);
    for (i, c) in body.chunks_exact(width).enumerate() {
        let w = word(c);
        data.push(match width {
            2 => half::f16::from_le_bytes([w[0], w[1]]).to_f32(),
            4 => f32::from_le_bytes([w[0], w[1], w[2], w[3]]),
            _ => {
                let v = f64::from_le_bytes(w);
                let narrow = v as f32;
                if v.is_finite() && !narrow.is_finite() {
                    // The stored order: Fortran files hold columns one after another.
                    let (r, c) = if fortran {
                        (i % rows.max(1), i / rows.max(1))
                    } else {
                        (i / cols.max(1), i % cols.max(1))
                    };
                    return Err(bad(format!(
                        "vector {r} has {v:e} at dimension {c}, outside float32's range"
                    )));
                }
                narrow
            }
        });
    }
    if fortran {
        // Column-major: element (r, c) is at c * rows + r.
        let mut rowwise = vec![0.0f32; data.len()];
        for c in 0..cols {
            for r in 0..rows {
                rowwise[r * cols + c] = data[c * rows + r];
            }
        }
        data = rowwise;
    }
    Matrix::new(rows, cols, data).map_err(|e| match e {
        Error::Input(d) => bad(d),
        other => other,
    })
}

/// The records of a texmex file (`.fvecs`, `.bvecs`, `.ivecs`: each a little-endian int32
/// dimension, then that many elements of `width` bytes), all of one dimension: the dimension
/// and the records' elements.
fn vecs_records<'a>(
    bytes: &'a [u8],
    name: &str,
    width: usize,
) -> Result<(usize, impl Iterator<Item = &'a [u8]>)> {
    let bad = |d: String| format_error(name, d);
    if bytes.is_empty() {
        return Err(bad("empty file: no vectors".into()));
    }
    if bytes.len() < 4 {
        return Err(bad("truncated: no dimension word".into()));
    }
    let d = i32::from_le_bytes(bytes[..4].try_into().unwrap());
    if d <= 0 {
        return Err(bad(format!(
            "dimension {d} in the first record: must be positive"
        )));
    }
    let d = d as usize;
    let record = 4 + width * d;
    if bytes.len() % record != 0 {
        return Err(bad(format!(
            "{} bytes is not a whole number of {record}-byte records of dimension {d} (truncated?)",
            bytes.len()
        )));
    }
    for (r, rec) in bytes.chunks_exact(record).enumerate() {
        let di = i32::from_le_bytes(rec[..4].try_into().unwrap());
        if di as i64 != d as i64 {
            return Err(bad(format!(
                "record {r} has dimension {di}, the first had {d}"
            )));
        }
    }
    Ok((d, bytes.chunks_exact(record).map(|rec| &rec[4..])))
}

/// Parses an `.fvecs` file (float32 vectors) held in memory.
pub fn parse_fvecs(bytes: &[u8], name: &str) -> Result<Matrix> {
    let (d, records) = vecs_records(bytes, name, 4)?;
    let data: Vec<f32> = records
        .flat_map(|r| r.chunks_exact(4))
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    Matrix::new(data.len() / d, d, data).map_err(|e| match e {
        Error::Input(detail) => format_error(name, detail),
        other => other,
    })
}

/// Parses a `.bvecs` file (unsigned byte vectors, as SIFT1B's) held in memory, as float32.
pub fn parse_bvecs(bytes: &[u8], name: &str) -> Result<Matrix> {
    let (d, records) = vecs_records(bytes, name, 1)?;
    let data: Vec<f32> = records.flatten().map(|&b| b as f32).collect();
    Matrix::new(data.len() / d, d, data).map_err(|e| match e {
        Error::Input(detail) => format_error(name, detail),
        other => other,
    })
}

/// Neighbour lists by query (ground truth): `.ivecs` (FAISS's and texmex's format) or a
/// two-dimensional `.npy` of int32, int64, uint32 or uint64 (C or Fortran order). Ids must be
/// indices of the data: non-negative and below `2^32`.
pub fn load_neighbors(path: impl AsRef<Path>) -> Result<Vec<Vec<u32>>> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|e| io_error(path, e))?;
    let name = path.display().to_string();
    let id = |v: i128, q: usize, j: usize| -> Result<u32> {
        u32::try_from(v).map_err(|_| {
            format_error(
                &name,
                format!("query {q} has neighbour id {v} at rank {j}: not an index of the data"),
            )
        })
    };
    match path.extension().and_then(|e| e.to_str()) {
        Some("ivecs") => {
            let (_, records) = vecs_records(&bytes, &name, 4)?;
            records
                .enumerate()
                .map(|(q, r)| {
                    r.chunks_exact(4)
                        .enumerate()
                        .map(|(j, c)| id(i32::from_le_bytes(c.try_into().unwrap()) as i128, q, j))
                        .collect()
                })
                .collect()
        }
        Some("npy") => {
            let a = npy_array(&bytes, &name, false)?;
            let values = npy_integers(&a, &name)?;
            (0..a.rows)
                .map(|q| {
                    (0..a.cols)
                        .map(|j| {
                            let k = if a.fortran {
                                j * a.rows + q
                            } else {
                                q * a.cols + j
                            };
                            id(values[k], q, j)
                        })
                        .collect()
                })
                .collect()
        }
        _ => Err(format_error(
            &name,
            "unknown extension: neighbour ids are read from .ivecs or .npy",
        )),
    }
}

/// An integer array's elements in stored order, widened: int32, int64, uint32 or uint64,
/// little-endian.
fn npy_integers(a: &NpyArray<'_>, name: &str) -> Result<Vec<i128>> {
    let (signed, width) = match a.descr {
        "<i4" => (true, 4),
        "<i8" => (true, 8),
        "<u4" => (false, 4),
        "<u8" => (false, 8),
        other => {
            return Err(format_error(
                name,
                format!(
                    "dtype {other} is not supported for ids: int32, int64, uint32 or uint64, \
                     little-endian"
                ),
            ));
        }
    };
    check_body(a, width, name)?;
    Ok(a.body
        .chunks_exact(width)
        .map(|c| match (signed, width) {
            (true, 4) => i32::from_le_bytes(c.try_into().unwrap()) as i128,
            (true, _) => i64::from_le_bytes(c.try_into().unwrap()) as i128,
            (false, 4) => u32::from_le_bytes(c.try_into().unwrap()) as i128,
            (false, _) => u64::from_le_bytes(c.try_into().unwrap()) as i128,
        })
        .collect())
}

/// The largest id an index holds (ids are int64 in files others read: FAISS's `idx_t`, with
/// -1 meaning none).
pub const MAX_ID: u64 = i64::MAX as u64;

/// User ids, one a vector: a one-dimensional (or one-column) integer `.npy`; each from 0 to
/// [`MAX_ID`].
pub fn load_ids(path: impl AsRef<Path>) -> Result<Vec<u64>> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|e| io_error(path, e))?;
    let name = path.display().to_string();
    if path.extension().and_then(|e| e.to_str()) != Some("npy") {
        return Err(format_error(&name, "ids are read from a .npy file"));
    }
    let a = npy_array(&bytes, &name, true)?;
    if a.cols != 1 {
        return Err(format_error(
            &name,
            format!("ids must be one column; found ({}, {})", a.rows, a.cols),
        ));
    }
    npy_integers(&a, &name)?
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            u64::try_from(v)
                .ok()
                .filter(|&v| v <= MAX_ID)
                .ok_or_else(|| format_error(&name, format!("id {v} at {i} is outside 0..=2^63-1")))
        })
        .collect()
}

/// The bytes of a version-1 `.npy` file of `<f4`.
pub fn npy_bytes(m: &Matrix) -> Vec<u8> {
    npy_array_bytes("<f4", m.rows, m.cols, bytemuck::cast_slice(&m.data))
}

/// A C-order `rows x cols` `.npy` file of dtype `descr` (`<f4`, `<i8`, ...) whose elements
/// are `body`, little-endian (version 1.0; the data starts on a 64-byte boundary).
pub fn npy_array_bytes(descr: &str, rows: usize, cols: usize, body: &[u8]) -> Vec<u8> {
    let mut header =
        format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': ({rows}, {cols}), }}");
    // Pad so that the data starts on a 64-byte boundary, ending the header with a newline.
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + body.len());
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(body);
    out
}

fn fvecs_bytes(m: &Matrix) -> Vec<u8> {
    let mut out = Vec::with_capacity(m.rows * (4 + 4 * m.cols));
    for r in 0..m.rows {
        out.extend_from_slice(&(m.cols as i32).to_le_bytes());
        out.extend_from_slice(bytemuck::cast_slice(m.row(r)));
    }
    out
}
