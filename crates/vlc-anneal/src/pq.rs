//! Product-quantised residual codes: the residual `x - anchor` split into `bytes` subspaces
//! of consecutive dimensions (sizes differing by at most one), each coded by the nearest of
//! up to 256 codewords learned by k-means on the device.

use crate::error::Result;
use hal::ir::{Access, ProgramBuilder};
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
    let mut p = ProgramBuilder::new("vlc_codeword_update");
    let sums = p.buffer(DType::F32, Access::Read);
    let counts = p.buffer(DType::F32, Access::Read);
    let cb = p.buffer(DType::F32, Access::ReadWrite);
    let i = p.index();
    let (v, _) = crate::anneal::mean_of_members(&mut p, [sums, counts, cb], i, w);
    p.store(cb, i, v);
    Ok(p.build()?)
}

/// The residuals `x - anchors[assign]` of `n x d` vectors, on the device.
pub fn residuals<B: Backend>(
    b: &B,
    x: &B::Buffer,
    anchors: &B::Buffer,
    assign: &B::Buffer,
    n: usize,
    d: usize,
) -> Result<B::Buffer> {
    let lx = Layout::contiguous(&[n, d]);
    let gathered = b.alloc(DType::F32, n * d)?;
    let m = anchors.len() / d;
    crate::gather_rows(
        b,
        View::new(anchors, &Layout::contiguous(&[m, d])),
        assign,
        0,
        View::new(&gathered, &lx),
    )?;
    let out = b.alloc(DType::F32, n * d)?;
    b.binary(
        BinaryOp::Sub,
        View::new(x, &lx),
        View::new(&gathered, &lx),
        View::new(&out, &lx),
    )?;
    Ok(out)
}

/// Learns the codebooks on `residuals` (`n x d`, on the device) and codes every vector:
/// returns the quantiser and `n * bytes` codes. The first codewords are distinct vectors
/// drawn by a seeded shuffle.
///
/// On a [`hal::Precision::Reproducible`] handle each subspace is trained in turn with the
/// `nearest_centroid` primitive, so every backend gives the same codes; so too on a CPU, where
/// calls cost nothing and the fused search beats materialising scores. On a GPU all subspaces
/// train at once ([`train_all_subspaces`]), a few device calls per iteration instead of a few
/// per subspace.
pub fn train_and_encode<B: Backend>(
    b: &B,
    residuals: &B::Buffer,
    n: usize,
    d: usize,
    bytes: usize,
    iterations: usize,
    seed: u64,
) -> Result<(ProductQuantizer, Vec<u8>)> {
    if b.precision() == hal::Precision::Reproducible || b.info().kind == hal::DeviceKind::Cpu {
        train_each_subspace(b, residuals, n, d, bytes, iterations, seed)
    } else {
        train_all_subspaces(b, residuals, n, d, bytes, iterations, seed)
    }
}

/// The first codewords: `min(n, 256)` distinct vectors by a seeded shuffle.
fn first_codewords(n: usize, seed: u64) -> Vec<u32> {
    crate::partial_shuffle(n, n.min(256), seed ^ 0x5851_f42d_4c95_7f2d)
        .into_iter()
        .map(|i| i as u32)
        .collect()
}

/// Every subspace's k-means at once. The residuals are laid out as `n x bytes` rows of
/// `wmax + 1` values (a subspace's dimensions, zeros up to the widest subspace's width
/// `wmax`, then a 1), and each codeword as `-2 c` and `|c|^2` alongside, so that one batched
/// matrix product over the subspaces gives every row's `|c|^2 - 2 x.c` for every codeword of
/// its subspace, and an argmin over the codewords its code (the codeword nearest in f32,
/// up to the product's rounding). Member sums are one `segment_sum` over the `n x bytes`
/// rows with segment `subspace * k + code`.
fn train_all_subspaces<B: Backend>(
    b: &B,
    residuals: &B::Buffer,
    n: usize,
    d: usize,
    bytes: usize,
    iterations: usize,
    seed: u64,
) -> Result<(ProductQuantizer, Vec<u8>)> {
    let bounds = subspace_bounds(d, bytes);
    let k = n.min(256);
    let wmax = d.div_ceil(bytes);
    let row = wmax + 1;
    // The residual rows, padded and with their 1.
    let xa = b.alloc(DType::F32, n * bytes * row)?;
    let wide = d % bytes;
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
            strides: vec![(bytes * row) as isize, row as isize, 1],
            offset: first * row,
        };
        b.copy(View::new(residuals, &src), View::new(&xa, &dst))?;
    }
    let ones = Layout {
        shape: vec![n * bytes],
        strides: vec![row as isize],
        offset: wmax,
    };
    b.fill(View::new(&xa, &ones), 1.0)?;
    // Codebooks `bytes x k x wmax` (zero padded) and their augmented form `bytes x k x row`.
    let cb = b.alloc(DType::F32, bytes * k * wmax)?;
    let aug = b.alloc(DType::F32, bytes * k * row)?;
    let starts = b.upload(&first_codewords(n, seed))?;
    crate::gather_rows(
        b,
        View::new(
            &xa,
            &Layout {
                shape: vec![n, bytes, wmax],
                strides: vec![(bytes * row) as isize, row as isize, 1],
                offset: 0,
            },
        ),
        &starts,
        0,
        View::new(
            &cb,
            &Layout {
                shape: vec![k, bytes, wmax],
                strides: vec![wmax as isize, (k * wmax) as isize, 1],
                offset: 0,
            },
        ),
    )?;
    let segments = bytes * k;
    let sums = b.alloc(DType::F32, segments * row)?;
    // Zero counts at first: the update then only writes the augmented codebook.
    let counts = b.alloc(DType::F32, segments)?;
    let update = b.compile(&augmented_update(wmax)?)?;
    let label = b.compile(&segment_labels(bytes, k)?)?;
    b.launch(&update, &[&sums, &counts, &cb, &aug], segments)?;
    // Scores in chunks of points of at most 32 MiB (within an H100's or H200's L2, and few
    // calls), and never beyond the largest buffer.
    let cap = b.capabilities().max_buffer_bytes.min(32 << 20) as usize;
    let chunk = (cap / (4 * bytes * k)).clamp(1, n);
    let scores = b.alloc(DType::F32, bytes * chunk * k)?;
    let codes = b.alloc(DType::U32, n * bytes)?;
    let seg = b.alloc(DType::U32, n * bytes)?;
    // The products in plain f32 (no reduced-precision matrix units), whatever the handle.
    let exact = b.with_precision(hal::Precision::Exact);
    for it in 0..=iterations {
        for start in (0..n).step_by(chunk) {
            let rows = chunk.min(n - start);
            let a = Layout {
                shape: vec![bytes, rows, row],
                strides: vec![row as isize, (bytes * row) as isize, 1],
                offset: start * bytes * row,
            };
            let words = Layout {
                shape: vec![bytes, row, k],
                strides: vec![(k * row) as isize, 1, row as isize],
                offset: 0,
            };
            let out = Layout::contiguous(&[bytes, rows, k]);
            exact.matmul(
                View::new(&xa, &a),
                View::new(&aug, &words),
                View::new(&scores, &out),
                1.0,
                0.0,
            )?;
            let code_view = Layout {
                shape: vec![bytes, rows, 1],
                strides: vec![1, bytes as isize, 1],
                offset: start * bytes,
            };
            b.arg_reduce(
                hal::ArgReduceOp::ArgMin,
                View::new(&scores, &out),
                2,
                View::new(&codes, &code_view),
            )?;
        }
        if it == iterations {
            break;
        }
        b.launch(&label, &[&codes, &seg], n * bytes)?;
        b.segment_sum(
            View::new(&xa, &Layout::contiguous(&[n * bytes, row])),
            View::new(&seg, &Layout::contiguous(&[n * bytes])),
            None,
            View::new(&sums, &Layout::contiguous(&[segments, row])),
            View::new(&counts, &Layout::contiguous(&[segments])),
        )?;
        b.launch(&update, &[&sums, &counts, &cb, &aug], segments)?;
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
    quantizer(b, &codes, d, k, bounds, codebooks)
}

/// The trained quantiser, with the codes (`u32` on the device) read back as bytes.
fn quantizer<B: Backend>(
    b: &B,
    codes: &B::Buffer,
    dim: usize,
    codewords: usize,
    bounds: Vec<usize>,
    codebooks: Vec<f32>,
) -> Result<(ProductQuantizer, Vec<u8>)> {
    let codes = b.read::<u32>(codes)?.into_iter().map(|c| c as u8).collect();
    let pq = ProductQuantizer {
        dim,
        codewords,
        bounds,
        codebooks,
    };
    Ok((pq, codes))
}

/// `seg[t] = codes[t] + k * (t mod bytes)`: row `t`'s segment (subspace, code).
fn segment_labels(bytes: usize, k: usize) -> Result<hal::ir::Program> {
    let mut p = ProgramBuilder::new("vlc_pq_segments");
    let codes = p.buffer(DType::U32, Access::Read);
    let seg = p.buffer(DType::U32, Access::Write);
    let t = p.index();
    let code = p.load(codes, t);
    let bytes = p.const_u32(bytes as u32);
    let k = p.const_u32(k as u32);
    let sub = p.binary(hal::ir::IrBinary::Rem, t, bytes);
    let base = p.mul(sub, k);
    let v = p.add(code, base);
    p.store(seg, t, v);
    Ok(p.build()?)
}

/// Over the `bytes * k` codewords: each codeword of `cb` (`wmax` wide) becomes its members'
/// mean where it has members (`sums` rows are `wmax + 1` wide, `counts` per codeword), and
/// its augmented form `aug` gets `-2 c` and `|c|^2` (the squares summed in order).
fn augmented_update(wmax: usize) -> Result<hal::ir::Program> {
    let mut p = ProgramBuilder::new("vlc_pq_update");
    let sums = p.buffer(DType::F32, Access::Read);
    let counts = p.buffer(DType::F32, Access::Read);
    let cb = p.buffer(DType::F32, Access::ReadWrite);
    let aug = p.buffer(DType::F32, Access::Write);
    let t = p.index();
    let cnt = p.load(counts, t);
    let zero = p.const_f32(0.0);
    let has = p.cmp(hal::ir::IrCmp::Gt, cnt, zero);
    let minus_two = p.const_f32(-2.0);
    let w = p.const_u32(wmax as u32);
    let r = p.const_u32(wmax as u32 + 1);
    let cb_base = p.mul(t, w);
    let aug_base = p.mul(t, r);
    let mut norm = zero;
    for q in 0..wmax {
        let q = p.const_u32(q as u32);
        let at_cb = p.add(cb_base, q);
        let at_aug = p.add(aug_base, q);
        let sum = p.load(sums, at_aug);
        let old = p.load(cb, at_cb);
        let mean = p.div(sum, cnt);
        let v = p.select(has, mean, old);
        p.store(cb, at_cb, v);
        let scaled = p.mul(minus_two, v);
        p.store(aug, at_aug, scaled);
        let sq = p.mul(v, v);
        norm = p.add(norm, sq);
    }
    let last = p.add(aug_base, w);
    p.store(aug, last, norm);
    Ok(p.build()?)
}

/// [`train_and_encode`] one subspace after another, with the `nearest_centroid` primitive.
fn train_each_subspace<B: Backend>(
    b: &B,
    residuals: &B::Buffer,
    n: usize,
    d: usize,
    bytes: usize,
    iterations: usize,
    seed: u64,
) -> Result<(ProductQuantizer, Vec<u8>)> {
    let bounds = subspace_bounds(d, bytes);
    let k = n.min(256);
    let starts = b.upload(&first_codewords(n, seed))?;
    // Codes land in the columns of one n x bytes buffer and codebooks in one k x d buffer, so
    // both are read back once, after every subspace is done.
    let all_codes = b.alloc(DType::U32, n * bytes)?;
    let all_books = b.alloc(DType::F32, k * d)?;
    let dist = b.alloc(DType::F32, n)?;
    let counts = b.alloc(DType::F32, k)?;
    for j in 0..bytes {
        let (lo, hi) = (bounds[j], bounds[j + 1]);
        let w = hi - lo;
        let sub = Layout {
            shape: vec![n, w],
            strides: vec![d as isize, 1],
            offset: lo,
        };
        let codes_j = Layout {
            shape: vec![n],
            strides: vec![bytes as isize],
            offset: j,
        };
        let lk = Layout::contiguous(&[k, w]);
        let cb = b.alloc(DType::F32, k * w)?;
        crate::gather_rows(
            b,
            View::new(residuals, &sub),
            &starts,
            0,
            View::new(&cb, &lk),
        )?;
        let sums = b.alloc(DType::F32, k * w)?;
        let update = b.compile(&codeword_update(w)?)?;
        // `iterations` updates, each after an assignment, and a last assignment: the codes.
        for it in 0..=iterations {
            b.nearest_centroid(
                View::new(residuals, &sub),
                View::new(&cb, &lk),
                View::new(&all_codes, &codes_j),
                View::new(&dist, &Layout::contiguous(&[n])),
            )?;
            if it == iterations {
                break;
            }
            b.segment_sum(
                View::new(residuals, &sub),
                View::new(&all_codes, &codes_j),
                None,
                View::new(&sums, &lk),
                View::new(&counts, &Layout::contiguous(&[k])),
            )?;
            b.launch(&update, &[&sums, &counts, &cb], k * w)?;
        }
        let book_j = Layout {
            shape: vec![k, w],
            strides: vec![w as isize, 1],
            offset: k * lo,
        };
        b.copy(View::new(&cb, &lk), View::new(&all_books, &book_j))?;
    }
    let codebooks = b.read::<f32>(&all_books)?;
    quantizer(b, &all_codes, d, k, bounds, codebooks)
}
