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
    let idx = Layout {
        shape: vec![n, d],
        strides: vec![1, 0],
        offset: 0,
    };
    b.gather(
        View::new(anchors, &Layout::contiguous(&[m, d])),
        0,
        View::new(assign, &idx),
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
pub fn train_and_encode<B: Backend>(
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
    let starts: Vec<u32> = crate::partial_shuffle(n, k, seed ^ 0x5851_f42d_4c95_7f2d)
        .into_iter()
        .map(|i| i as u32)
        .collect();
    let starts = b.upload(&starts)?;
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
        let pick = Layout {
            shape: vec![k, w],
            strides: vec![1, 0],
            offset: 0,
        };
        b.gather(
            View::new(residuals, &sub),
            0,
            View::new(&starts, &pick),
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
    let codes: Vec<u8> = b
        .read::<u32>(&all_codes)?
        .into_iter()
        .map(|c| c as u8)
        .collect();
    let codebooks = b.read::<f32>(&all_books)?;
    Ok((
        ProductQuantizer {
            dim: d,
            codewords: k,
            bounds,
            codebooks,
        },
        codes,
    ))
}
