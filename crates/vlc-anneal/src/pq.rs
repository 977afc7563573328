//! Product-quantised residual codes: the residual `x - anchor` split into `bytes` subspaces
//! of consecutive dimensions (sizes differing by at most one), each coded by the nearest of
//! up to 256 codewords learned by k-means on the device.

use crate::error::Result;
use hal::ir::Access;
use hal::ir::expr::Scope;
use hal::{Backend, BackendExt, BinaryOp, DType, DeviceBuffer, Layout, View};

/// Codebooks of a product quantiser.
#[derive(Clone, Debug, PartialEq)]
pub struct ProductQuantizer {
    /// Dimension `d` of the vectors.
    pub dim: usize,
    /// Codewords per subspace (256, or fewer when there are fewer vectors).
    pub codewords: usize,
    /// `bounds[j]..bounds[j + 1]` are subspace `j`'s dimensions; `bytes + 1` entries.
    pub bounds: Vec<usize>,
    /// Subspace `j`'s codewords, `codewords x width_j`, one after another.
    pub codebooks: Vec<f32>,
}

impl ProductQuantizer {
    pub fn bytes(&self) -> usize {
        self.bounds.len().saturating_sub(1)
    }

    /// Where subspace `j`'s codebook starts in [`Self::codebooks`].
    pub fn codebook_offset(&self, j: usize) -> usize {
        self.codewords * self.bounds[j]
    }

    /// Adds the decoded residual of `codes` (one per subspace) to `out`.
    pub fn add_decoded(&self, codes: &[u8], out: &mut [f32]) {
        for (j, &c) in codes.iter().enumerate() {
            let (lo, hi) = (self.bounds[j], self.bounds[j + 1]);
            let w = hi - lo;
            let word = &self.codebooks[self.codebook_offset(j) + c as usize * w..][..w];
            for (o, &v) in out[lo..hi].iter_mut().zip(word) {
                *o += v;
            }
        }
    }
}

/// Subspace boundaries: `bytes` runs of consecutive dimensions, the first `d % bytes` one
/// longer than the rest.
pub fn subspace_bounds(d: usize, bytes: usize) -> Vec<usize> {
    let mut bounds = vec![0];
    for j in 0..bytes {
        let w = d / bytes + usize::from(j < d % bytes);
        bounds.push(bounds[j] + w);
    }
    bounds
}

/// `cb = counts > 0 ? sums / counts : cb` over `k * w` elements (`w` baked in).
fn codeword_update(w: usize) -> Result<hal::ir::Program> {
    let s = Scope::new("vlc_codeword_update");
    let sums = s.buffer(DType::F32, Access::Read);
    let counts = s.buffer(DType::F32, Access::Read);
    let cb = s.buffer(DType::F32, Access::ReadWrite);
    let i = s.index();
    let (v, _) = crate::anneal::programs::mean_of_members(&s, [sums, counts, cb], i, w);
    s.store(cb, i, v);
    Ok(s.build()?)
}

/// Every vector's codes (`n * bytes`, vector after vector) and the squared error they leave,
/// summed over the vectors.
pub type CodesAndError = (Vec<u8>, f64);

/// Bytes of residuals one coding pass holds on the device: [`ProductQuantizer::code_all`]
/// codes the vectors in chunks of this many bytes of f32 rows, so its scratch (the chunk's
/// residuals, its gathered anchors, its codes and distances) stays near four times this
/// whatever the number of vectors.
pub const CODE_CHUNK_BYTES: usize = 64 << 20;

/// The vectors whose residuals get coded, where they already are on the device: `x` (`n x d`,
/// row-major), the anchors as stored (`m x d`, f32 values of the f16 anchors) and each
/// vector's anchor (`n` u32).
pub struct Residuals<'a, B: Backend> {
    pub x: &'a B::Buffer,
    pub anchors: &'a B::Buffer,
    pub assign: &'a B::Buffer,
    pub n: usize,
    pub d: usize,
}

impl<B: Backend> Residuals<'_, B> {
    /// The residuals `x[r] - anchors[assign[r]]` of rows `first..first + rows`, on the device.
    pub fn rows(&self, b: &B, first: usize, rows: usize) -> Result<B::Buffer> {
        let d = self.d;
        let chunk = Layout::contiguous(&[rows, d]);
        let gathered = b.alloc_for_write(DType::F32, rows * d)?;
        crate::gather_rows(
            b,
            View::new(
                self.anchors,
                &Layout::contiguous(&[self.anchors.len() / d, d]),
            ),
            self.assign,
            first,
            View::new(&gathered, &chunk),
        )?;
        let x = Layout {
            offset: first * d,
            ..chunk.clone()
        };
        let out = b.alloc_for_write(DType::F32, rows * d)?;
        b.binary(
            BinaryOp::Sub,
            View::new(self.x, &x),
            View::new(&gathered, &chunk),
            View::new(&out, &chunk),
        )?;
        Ok(out)
    }

    /// The residuals of the rows `picked` (row numbers, increasing), given each row's anchor
    /// (`assignments`, all `n`, on the host), on the device: the rows gathered, then
    /// [`Self::rows`] of them with their anchors.
    fn picked(&self, b: &B, picked: &[usize], assignments: &[u32]) -> Result<B::Buffer> {
        let (d, s) = (self.d, picked.len());
        let rows: Vec<u32> = picked.iter().map(|&r| r as u32).collect();
        let assign: Vec<u32> = picked.iter().map(|&r| assignments[r]).collect();
        let xs = b.alloc_for_write(DType::F32, s * d)?;
        crate::gather_rows(
            b,
            View::new(self.x, &Layout::contiguous(&[self.n, d])),
            &b.upload(&rows)?,
            0,
            View::new(&xs, &Layout::contiguous(&[s, d])),
        )?;
        let sample = Residuals {
            x: &xs,
            anchors: self.anchors,
            assign: &b.upload(&assign)?,
            n: s,
            d,
        };
        sample.rows(b, 0, s)
    }
}

/// Learns `bytes`-byte codebooks for the residuals of `src` (`assignments`: each vector's
/// anchor, on the host) on at most `train_rows` of them, a seeded sample (sorted, so the
/// device reads them in order) where there are more. Returns the quantiser and, where every
/// vector trained it, their codes and squared error (the training's last assignment);
/// otherwise [`ProductQuantizer::code_all`] codes them.
#[allow(clippy::too_many_arguments)]
pub fn learn<B: Backend>(
    b: &B,
    src: &Residuals<'_, B>,
    assignments: &[u32],
    bytes: usize,
    iterations: usize,
    train_rows: usize,
    seed: u64,
    on_step: &mut dyn FnMut(usize),
) -> Result<(ProductQuantizer, Option<CodesAndError>)> {
    let (n, d) = (src.n, src.d);
    if n <= train_rows {
        let res = src.rows(b, 0, n)?;
        let e = train_and_encode(b, &res, (n, d), bytes, iterations, seed, on_step)?;
        return Ok((e.pq, Some((e.codes, e.squared_error))));
    }
    let mut picked = crate::partial_shuffle(n, train_rows, seed ^ 0x2545_f491_4f6c_dd1d);
    picked.sort_unstable();
    let res = src.picked(b, &picked, assignments)?;
    let e = train_and_encode(b, &res, (picked.len(), d), bytes, iterations, seed, on_step)?;
    Ok((e.pq, None))
}

impl ProductQuantizer {
    /// [`ProductQuantizer::encode`] of residuals already on the device (`n x dim`): laid out
    /// and searched there, only the codes and the per-vector errors read back.
    pub fn encode_on_device<B: Backend>(
        &self,
        b: &B,
        residuals: &B::Buffer,
        n: usize,
    ) -> Result<(Vec<u8>, f64)> {
        let (bytes, d, k) = (self.bytes(), self.dim, self.codewords);
        if bytes == 0 || n == 0 {
            return self.encode(b, &b.read::<f32>(residuals)?, n);
        }
        let wmax = d.div_ceil(bytes);
        let xa = padded_rows(b, residuals, (n, d), bytes)?;
        let cb = b.upload(&self.padded_codebooks(wmax))?;
        let codes = b.alloc_for_write(DType::U32, n * bytes)?;
        let dist = b.alloc_for_write(DType::F32, n * bytes)?;
        let per_subspace = Layout::contiguous(&[n, bytes]).transpose(0, 1)?;
        b.nearest_centroid(
            View::new(&xa, &by_subspace(n, bytes, wmax)),
            View::new(&cb, &Layout::contiguous(&[bytes, k, wmax])),
            View::new(&codes, &per_subspace),
            View::new(&dist, &per_subspace),
        )?;
        read_codes(b, &codes, &dist, n, bytes)
    }

    /// Codes every vector of `src` with these codebooks, [`CODE_CHUNK_BYTES`] of residuals
    /// at a time: the codes (`n * bytes`, vector after vector) and the squared error they
    /// leave, summed over the vectors.
    pub fn code_all<B: Backend>(&self, b: &B, src: &Residuals<'_, B>) -> Result<CodesAndError> {
        self.code_chunks(b, src, (CODE_CHUNK_BYTES / (4 * src.d.max(1))).max(1))
    }

    /// [`Self::code_all`] in chunks of `chunk` vectors (at least one).
    pub fn code_chunks<B: Backend>(
        &self,
        b: &B,
        src: &Residuals<'_, B>,
        chunk: usize,
    ) -> Result<CodesAndError> {
        let (n, chunk) = (src.n, chunk.max(1));
        let mut codes = Vec::with_capacity(n * self.bytes());
        let mut squared_error = 0.0;
        for first in (0..n).step_by(chunk) {
            let rows = chunk.min(n - first);
            let res = src.rows(b, first, rows)?;
            let (c, e) = self.encode_on_device(b, &res, rows)?;
            codes.extend_from_slice(&c);
            squared_error += e;
        }
        Ok((codes, squared_error))
    }

    /// The codebooks as `bytes x codewords x wmax`, each codeword zero padded to `wmax`.
    fn padded_codebooks(&self, wmax: usize) -> Vec<f32> {
        let (bytes, k) = (self.bytes(), self.codewords);
        let mut books = vec![0f32; bytes * k * wmax];
        for j in 0..bytes {
            let w = self.bounds[j + 1] - self.bounds[j];
            let book = &self.codebooks[self.codebook_offset(j)..][..k * w];
            for c in 0..k {
                books[(j * k + c) * wmax..][..w].copy_from_slice(&book[c * w..(c + 1) * w]);
            }
        }
        books
    }

    /// Codes `n` residual rows (`residuals`, row-major, `dim` wide) with these codebooks on
    /// `b`, every subspace at once: one byte per subspace per row (point-major), and the
    /// squared error they leave, summed over the rows.
    pub fn encode<B: Backend>(&self, b: &B, residuals: &[f32], n: usize) -> Result<(Vec<u8>, f64)> {
        let (pq, d) = (self, self.dim);
        let bytes = pq.bytes();
        if bytes == 0 || n == 0 {
            let e = residuals.iter().map(|&v| v as f64 * v as f64).sum();
            return Ok((Vec::new(), e));
        }
        // Every subspace at once, zero padded to the widest (zeros add nothing to a
        // distance): `bytes x n x wmax` rows against `bytes x k x wmax` codebooks.
        let k = pq.codewords;
        let wmax = (0..bytes)
            .map(|j| pq.bounds[j + 1] - pq.bounds[j])
            .max()
            .unwrap_or(0);
        let mut rows = vec![0f32; bytes * n * wmax];
        for j in 0..bytes {
            let (lo, hi) = (pq.bounds[j], pq.bounds[j + 1]);
            for i in 0..n {
                rows[(j * n + i) * wmax..][..hi - lo]
                    .copy_from_slice(&residuals[i * d + lo..i * d + hi]);
            }
        }
        let (xs, cb) = (b.upload(&rows)?, b.upload(&pq.padded_codebooks(wmax))?);
        let (code, dist) = (
            b.alloc(DType::U32, bytes * n)?,
            b.alloc(DType::F32, bytes * n)?,
        );
        b.nearest_centroid(
            View::new(&xs, &Layout::contiguous(&[bytes, n, wmax])),
            View::new(&cb, &Layout::contiguous(&[bytes, k, wmax])),
            View::new(&code, &Layout::contiguous(&[bytes, n])),
            View::new(&dist, &Layout::contiguous(&[bytes, n])),
        )?;
        let (code, dist) = (b.read::<u32>(&code)?, b.read::<f32>(&dist)?);
        // Point-major: vector i's byte for subspace j.
        let mut codes = vec![0u8; n * bytes];
        for j in 0..bytes {
            for i in 0..n {
                codes[i * bytes + j] = code[j * n + i] as u8;
            }
        }
        Ok((codes, dist.iter().map(|&e| e as f64).sum()))
    }
}

/// Learns the codebooks on `residuals` (`n x d`, on the device) and codes every vector:
/// returns the quantiser, `n * bytes` codes and the squared error they leave. The first
/// codewords are distinct vectors drawn by a seeded shuffle. `on_step` hears each finished
/// iteration's count.
///
/// Every subspace trains at once: the residuals are laid out as `n x bytes` rows of `wmax`
/// values (a subspace's dimensions, then zeros up to the widest subspace's width `wmax`,
/// which add nothing to a distance or a sum), so that each iteration is one batched
/// `nearest_centroid` (each subspace's rows against its own codebook), one `segment_sum` over
/// the `n x bytes` rows with segment `subspace * k + code`, and one update: a few device calls
/// per iteration, whatever the number of subspaces. On a [`hal::Precision::Reproducible`]
/// handle the searches and sums follow the reference order, so every backend gives the same
/// codes.
pub fn train_and_encode<B: Backend>(
    b: &B,
    residuals: &B::Buffer,
    (n, d): (usize, usize),
    bytes: usize,
    iterations: usize,
    seed: u64,
    on_step: &mut dyn FnMut(usize),
) -> Result<Encoded> {
    let bounds = subspace_bounds(d, bytes);
    let k = n.min(256);
    let wmax = d.div_ceil(bytes);
    let xa = padded_rows(b, residuals, (n, d), bytes)?;
    let by_subspace = by_subspace(n, bytes, wmax);
    let books = Layout::contiguous(&[bytes, k, wmax]);
    let cb = b.alloc_for_write(DType::F32, bytes * k * wmax)?;
    let starts = b.upload(&first_codewords(n, seed))?;
    crate::gather_rows(
        b,
        View::new(&xa, &by_subspace.transpose(0, 1)?),
        &starts,
        0,
        View::new(&cb, &books.transpose(0, 1)?),
    )?;
    let segments = bytes * k;
    let sums = b.alloc_for_write(DType::F32, segments * wmax)?;
    let counts = b.alloc_for_write(DType::F32, segments)?;
    let update = b.compile(&codeword_update(wmax)?)?;
    let label = b.compile(&segment_labels(bytes, k)?)?;
    // Codes (and distances) point-major, `n x bytes`, seen per subspace.
    let codes = b.alloc_for_write(DType::U32, n * bytes)?;
    let dist = b.alloc_for_write(DType::F32, n * bytes)?;
    let seg = b.alloc_for_write(DType::U32, n * bytes)?;
    let step = std::sync::Arc::new(PqIteration::<B> {
        xa,
        cb: cb.clone(),
        codes: codes.clone(),
        dist: dist.clone(),
        seg,
        sums,
        counts,
        update,
        label,
        by_subspace,
        books,
    });
    // `iterations` updates, each followed by an assignment; the first assignment before them
    // and the last one gives the codes. The iteration is recorded once and replayed: on a
    // capturing backend one launch an iteration instead of about ten.
    step.assign(b)?;
    if iterations > 0 {
        let recorded = step.clone();
        let graph = b.record(std::sync::Arc::new(move |b: &B| recorded.iterate(b)))?;
        // A step reported is a step finished: one wait an iteration (tens of microseconds
        // against the iteration's milliseconds).
        for done in 1..=iterations {
            b.replay(&graph)?;
            b.synchronize()?;
            on_step(done);
        }
    }
    // Each subspace's codebook without its padding.
    let padded = b.read::<f32>(&cb)?;
    let mut codebooks = Vec::with_capacity(k * d);
    for j in 0..bytes {
        let w = bounds[j + 1] - bounds[j];
        for c in 0..k {
            codebooks.extend_from_slice(&padded[(j * k + c) * wmax..][..w]);
        }
    }
    let (codes, squared_error) = read_codes(b, &codes, &dist, n, bytes)?;
    Ok(Encoded {
        pq: ProductQuantizer {
            dim: d,
            codewords: k,
            bounds,
            codebooks,
        },
        codes,
        squared_error,
    })
}

/// The `n x d` residual rows laid out as `n x bytes` rows of `wmax = ceil(d / bytes)` values
/// (a subspace's dimensions, then zeros up to `wmax`: they add nothing to a distance or a
/// sum), on the device.
fn padded_rows<B: Backend>(
    b: &B,
    residuals: &B::Buffer,
    (n, d): (usize, usize),
    bytes: usize,
) -> Result<B::Buffer> {
    let bounds = subspace_bounds(d, bytes);
    let wmax = d.div_ceil(bytes);
    // Where every subspace is as wide, the rows are already laid out so.
    let wide = d % bytes;
    if wide == 0 {
        return Ok(residuals.clone());
    }
    let xa = b.alloc(DType::F32, n * bytes * wmax)?;
    for (first, count, w) in [(0, wide, wmax), (wide, bytes - wide, d / bytes)] {
        if count == 0 || w == 0 {
            continue;
        }
        let src = Layout {
            shape: vec![n, count, w],
            strides: vec![d as isize, w as isize, 1],
            offset: bounds[first],
        };
        let dst = Layout {
            shape: vec![n, count, w],
            strides: vec![(bytes * wmax) as isize, wmax as isize, 1],
            offset: first * wmax,
        };
        b.copy(View::new(residuals, &src), View::new(&xa, &dst))?;
    }
    Ok(xa)
}

/// [`padded_rows`]' rows seen as a batch over the subspaces, `bytes x n x wmax`.
fn by_subspace(n: usize, bytes: usize, wmax: usize) -> Layout {
    Layout {
        shape: vec![bytes, n, wmax],
        strides: vec![wmax as isize, (bytes * wmax) as isize, 1],
        offset: 0,
    }
}

/// The codes (`n x bytes`, point-major, one u32 each) as bytes, and the squared
/// reconstruction error: the search's distances, summed per vector on the device and over
/// vectors in f64 here (reading n sums, not n x bytes distances).
fn read_codes<B: Backend>(
    b: &B,
    codes: &B::Buffer,
    dist: &B::Buffer,
    n: usize,
    bytes: usize,
) -> Result<(Vec<u8>, f64)> {
    let per_vector = b.alloc(DType::F32, n)?;
    b.reduce(
        hal::ReduceOp::Sum,
        View::new(dist, &Layout::contiguous(&[n, bytes])),
        &[1],
        View::new(&per_vector, &Layout::contiguous(&[n, 1])),
    )?;
    let squared_error = b.read::<f32>(&per_vector)?.iter().map(|&e| e as f64).sum();
    let codes = b.read::<u32>(codes)?.into_iter().map(|c| c as u8).collect();
    Ok((codes, squared_error))
}

/// The device state of [`train_and_encode`]'s iterations.
struct PqIteration<B: Backend> {
    /// The residual rows, zero padded to `wmax`.
    xa: B::Buffer,
    /// The codebooks, `bytes x k x wmax`.
    cb: B::Buffer,
    codes: B::Buffer,
    dist: B::Buffer,
    /// Each row's segment (subspace, code).
    seg: B::Buffer,
    sums: B::Buffer,
    counts: B::Buffer,
    update: B::Kernel,
    label: B::Kernel,
    /// The rows as `bytes x n x wmax`, and the codebooks as `bytes x k x wmax`.
    by_subspace: Layout,
    books: Layout,
}

impl<B: Backend> PqIteration<B> {
    /// Codes every row against its subspace's codebook.
    fn assign(&self, b: &B) -> hal::Result<()> {
        let [bytes, n, _] = self.by_subspace.shape[..] else {
            unreachable!("by_subspace is rank 3")
        };
        let per_subspace = Layout::contiguous(&[n, bytes]).transpose(0, 1)?;
        b.nearest_centroid(
            View::new(&self.xa, &self.by_subspace),
            View::new(&self.cb, &self.books),
            View::new(&self.codes, &per_subspace),
            View::new(&self.dist, &per_subspace),
        )
    }

    /// Moves every codeword to the mean of its rows, then assigns again.
    fn iterate(&self, b: &B) -> hal::Result<()> {
        let [bytes, k, wmax] = self.books.shape[..] else {
            unreachable!("books is rank 3")
        };
        let (rows, segments) = (self.by_subspace.shape[1] * bytes, bytes * k);
        b.launch(&self.label, &[&self.codes, &self.seg], rows)?;
        b.segment_sum(
            View::new(&self.xa, &Layout::contiguous(&[rows, wmax])),
            View::new(&self.seg, &Layout::contiguous(&[rows])),
            None,
            View::new(&self.sums, &Layout::contiguous(&[segments, wmax])),
            View::new(&self.counts, &Layout::contiguous(&[segments])),
        )?;
        b.launch(
            &self.update,
            &[&self.sums, &self.counts, &self.cb],
            segments * wmax,
        )?;
        self.assign(b)
    }
}

/// What [`train_and_encode`] gives.
pub struct Encoded {
    pub pq: ProductQuantizer,
    /// `n * bytes` codes, vector after vector.
    pub codes: Vec<u8>,
    /// The sum over vectors of the squared distance between residual and decoded residual
    /// (each subspace's distance in f32, as the search computed it).
    pub squared_error: f64,
}

/// The first codewords: `min(n, 256)` distinct vectors by a seeded shuffle.
fn first_codewords(n: usize, seed: u64) -> Vec<u32> {
    crate::partial_shuffle(n, n.min(256), seed ^ 0x5851_f42d_4c95_7f2d)
        .into_iter()
        .map(|i| i as u32)
        .collect()
}

/// `seg[t] = codes[t] + k * (t mod bytes)`: row `t`'s segment (subspace, code).
fn segment_labels(bytes: usize, k: usize) -> Result<hal::ir::Program> {
    let s = Scope::new("vlc_pq_segments");
    let codes = s.buffer(DType::U32, Access::Read);
    let seg = s.buffer(DType::U32, Access::Write);
    let t = s.index();
    let label = s.load(codes, t) + t % s.u32(bytes as u32) * s.u32(k as u32);
    s.store(seg, t, label);
    Ok(s.build()?)
}
