//! Host-side tensors: random data seen through random views, and reading results back in
//! logical (row-major) order.

use hal::{Backend, BackendExt, DType, Layout, Result, bf16, f16, numel};
use proptest::test_runner::TestRng;
use rand_core_shim::RngCoreExt;

/// A buffer's contents (already rounded to `dtype`) and the view a check passes to a primitive.
#[derive(Clone, Debug)]
pub struct HostTensor {
    pub dtype: DType,
    pub backing: Vec<f32>,
    pub layout: Layout,
}

/// How an input view is laid out over its buffer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ViewKind {
    Contiguous,
    /// A permutation of a contiguous buffer.
    Permuted,
    /// Every other element of a larger buffer, with an offset.
    Strided,
    /// A reversed dimension.
    Flipped,
    /// Some dimensions broadcast (stride 0) from a smaller buffer.
    Broadcast,
}

pub fn round_to(dtype: DType, v: f32) -> f32 {
    match dtype {
        DType::F32 | DType::F64 => v,
        DType::F16 => f16::from_f32(v).to_f32(),
        DType::BF16 => bf16::from_f32(v).to_f32(),
        DType::I32 => v as i32 as f32,
        DType::U32 => v as u32 as f32,
    }
}

pub fn bytes_of(dtype: DType, values: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * dtype.size_in_bytes());
    for &v in values {
        match dtype {
            DType::F32 => out.extend_from_slice(&v.to_le_bytes()),
            DType::F16 => out.extend_from_slice(&f16::from_f32(v).to_le_bytes()),
            DType::BF16 => out.extend_from_slice(&bf16::from_f32(v).to_le_bytes()),
            DType::I32 => out.extend_from_slice(&(v as i32).to_le_bytes()),
            DType::U32 => out.extend_from_slice(&(v as u32).to_le_bytes()),
            DType::F64 => out.extend_from_slice(&(v as f64).to_le_bytes()),
        }
    }
    out
}

/// Row-major multi-index of linear position `p` in `shape`.
pub fn unravel(mut p: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = p % shape[d];
        p /= shape[d];
    }
    idx
}

/// Values of `backing` seen through `layout`, in row-major order.
pub fn logical(backing: &[f32], layout: &Layout) -> Vec<f64> {
    (0..layout.numel())
        .map(|p| backing[layout.index_of(&unravel(p, &layout.shape))] as f64)
        .collect()
}

impl HostTensor {
    pub fn contiguous(dtype: DType, shape: &[usize], values: Vec<f32>) -> Self {
        let backing = values.into_iter().map(|v| round_to(dtype, v)).collect();
        Self {
            dtype,
            backing,
            layout: Layout::contiguous(shape),
        }
    }
    pub fn shape(&self) -> &[usize] {
        &self.layout.shape
    }
    pub fn logical(&self) -> Vec<f64> {
        logical(&self.backing, &self.layout)
    }
    pub fn upload<B: Backend>(&self, b: &B) -> Result<B::Buffer> {
        b.upload_bytes(self.dtype, &bytes_of(self.dtype, &self.backing))
    }
}

/// Reads `buf` through `layout` in row-major order.
pub fn read_view<B: Backend>(b: &B, buf: &B::Buffer, layout: &Layout) -> Result<Vec<f64>> {
    Ok(logical(&b.read_f32(buf)?, layout))
}

/// Small helpers on the proptest RNG (which implements `rand_core::RngCore`).
pub mod rand_core_shim {
    use proptest::prelude::Rng;
    pub trait RngCoreExt {
        fn unit(&mut self) -> f32;
        fn range(&mut self, lo: f32, hi: f32) -> f32;
        fn below(&mut self, n: usize) -> usize;
    }
    impl<R: Rng> RngCoreExt for R {
        fn unit(&mut self) -> f32 {
            (self.next_u32() >> 8) as f32 / 16_777_216.0
        }
        fn range(&mut self, lo: f32, hi: f32) -> f32 {
            lo + (hi - lo) * self.unit()
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next_u64() % n.max(1) as u64) as usize
        }
    }
}

/// A random tensor of `shape` whose values come from `gen`, laid out as `kind`.
pub fn random_tensor(
    rng: &mut TestRng,
    shape: &[usize],
    dtype: DType,
    kind: ViewKind,
    mut values: impl FnMut(&mut TestRng) -> f32,
) -> HostTensor {
    let rank = shape.len();
    let (backing_shape, layout): (Vec<usize>, Layout) = match kind {
        ViewKind::Permuted if rank >= 2 => {
            let mut perm: Vec<usize> = (0..rank).collect();
            perm.reverse();
            let k = rng.below(rank);
            perm.rotate_left(k);
            let stored: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
            let mut inverse = vec![0; rank];
            for (i, &p) in perm.iter().enumerate() {
                inverse[p] = i;
            }
            let l = Layout::contiguous(&stored)
                .permute(&inverse)
                .expect("a permutation");
            (stored, l)
        }
        ViewKind::Strided if rank >= 1 => {
            let stored: Vec<usize> = shape.iter().map(|&d| 2 * d + 1).collect();
            let mut l = Layout::contiguous(&stored);
            for (d, &size) in shape.iter().enumerate() {
                l = l
                    .narrow(d, 1, 2 * size)
                    .expect("inside")
                    .step(d, 2)
                    .expect("step");
            }
            (stored, l)
        }
        ViewKind::Flipped if rank >= 1 => {
            let axis = rng.below(rank);
            (
                shape.to_vec(),
                Layout::contiguous(shape).flip(axis).expect("axis"),
            )
        }
        ViewKind::Broadcast if rank >= 1 => {
            let axis = rng.below(rank);
            let mut stored = shape.to_vec();
            stored[axis] = 1;
            let l = Layout::contiguous(&stored)
                .broadcast_to(shape)
                .expect("broadcast");
            (stored, l)
        }
        _ => (shape.to_vec(), Layout::contiguous(shape)),
    };
    let backing = (0..numel(&backing_shape))
        .map(|_| round_to(dtype, values(rng)))
        .collect();
    HostTensor {
        dtype,
        backing,
        layout,
    }
}

/// An output view: contiguous, permuted or strided (never broadcast: outputs must not overlap).
pub fn output_tensor(rng: &mut TestRng, shape: &[usize], dtype: DType) -> HostTensor {
    let kind = [
        ViewKind::Contiguous,
        ViewKind::Permuted,
        ViewKind::Strided,
        ViewKind::Flipped,
    ][rng.below(4)];
    random_tensor(rng, shape, dtype, kind, |r| r.range(-1.0, 1.0))
}
