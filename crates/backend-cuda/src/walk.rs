//! Launch-parameter structs shared with the kernels (`cuda/common.cuh`, `cuda/index.cu`): the
//! strided [`Walk`] over up to four operands and the convolution geometry [`Geo`].

use hal::{Error, Layout, Result};

/// Dimensions a walk holds after merging (`MAXR` in `cuda/common.cuh`).
pub(crate) const MAX_RANK: usize = 8;
/// Operands a walk holds.
pub(crate) const MAX_OPERANDS: usize = 4;

/// `struct Walk` of `cuda/common.cuh`, field for field.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct Walk {
    rank: i32,
    pad: i32,
    pub n: i64,
    shape: [i64; MAX_RANK],
    strides: [[i64; MAX_RANK]; MAX_OPERANDS],
    offsets: [i64; MAX_OPERANDS],
}

impl Walk {
    /// A walk over `shape` in row-major order for operands given by their strides and
    /// offsets (each operand's strides have `shape`'s rank). Size-1 dimensions are dropped and
    /// neighbours that every operand steps through evenly are merged, so contiguous operands
    /// become rank 1 and the kernel's index arithmetic is one division at most per dimension.
    pub fn new(op: &'static str, shape: &[usize], operands: &[(&[isize], usize)]) -> Result<Walk> {
        debug_assert!(operands.len() <= MAX_OPERANDS);
        let k = operands.len();
        let mut dims: Vec<(i64, [i64; MAX_OPERANDS])> = Vec::new();
        for (d, &size) in shape.iter().enumerate() {
            if size == 1 {
                continue;
            }
            let mut st = [0i64; MAX_OPERANDS];
            for (o, (strides, _)) in operands.iter().enumerate() {
                st[o] = strides[d] as i64;
            }
            if let Some((psize, pst)) = dims.last_mut() {
                if (0..k).all(|o| pst[o] == st[o] * size as i64) {
                    *psize *= size as i64;
                    *pst = st;
                    continue;
                }
            }
            dims.push((size as i64, st));
        }
        if dims.len() > MAX_RANK {
            return Err(Error::InvalidArgument {
                op,
                detail: format!(
                    "views with more than {MAX_RANK} dimensions that cannot be merged are not supported by the cuda backend (shape {shape:?}); make an operand contiguous first"
                ),
            });
        }
        let mut w = Walk {
            rank: dims.len() as i32,
            pad: 0,
            n: hal::numel(shape) as i64,
            shape: [1; MAX_RANK],
            strides: [[0; MAX_RANK]; MAX_OPERANDS],
            offsets: [0; MAX_OPERANDS],
        };
        for (d, (size, st)) in dims.iter().enumerate() {
            w.shape[d] = *size;
            for (o, &stride) in st.iter().enumerate().take(k) {
                w.strides[o][d] = stride;
            }
        }
        for (o, (_, offset)) in operands.iter().enumerate() {
            w.offsets[o] = *offset as i64;
        }
        Ok(w)
    }

    /// The merged rank.
    pub fn rank(&self) -> usize {
        self.rank as usize
    }

    /// Operand `o`'s stride along merged dimension `d`.
    pub fn stride(&self, o: usize, d: usize) -> i64 {
        self.strides[o][d]
    }

    /// A walk over `shape` with operands given as layouts (each broadcast to `shape` already).
    pub fn of(op: &'static str, shape: &[usize], layouts: &[&Layout]) -> Result<Walk> {
        let ops: Vec<(&[isize], usize)> = layouts
            .iter()
            .map(|l| (l.strides.as_slice(), l.offset))
            .collect();
        Walk::new(op, shape, &ops)
    }
}

/// `struct Geo` of `cuda/index.cu`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Geo {
    pub n: i64,
    pub c: i64,
    pub h: i64,
    pub w: i64,
    pub kh: i64,
    pub kw: i64,
    pub sh: i64,
    pub sw: i64,
    pub ph: i64,
    pub pw: i64,
    pub dh: i64,
    pub dw: i64,
    pub oh: i64,
    pub ow: i64,
    pub xs: [i64; 4],
    pub xoff: i64,
    pub cs: [i64; 3],
    pub coff: i64,
}

/// `struct FastDiv` of `cuda/common.cuh`: division by `d` as `(umulhi(n, m) + n) >> s`,
/// exact for every `n < 2^31` (the round-up method: `s = ceil(log2 d)`, `m = floor(2^32 (2^s -
/// d) / d) + 1`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct FastDiv {
    d: u32,
    m: u32,
    s: u32,
    pad: u32,
}

impl FastDiv {
    /// The multiplier and shift for divisor `d` (at least 1, below 2^31).
    pub fn new(d: u32) -> FastDiv {
        let d = d.max(1);
        let s = 32 - (d - 1).leading_zeros();
        let m = ((1u64 << 32) * ((1u64 << s) - d as u64) / d as u64 + 1) as u32;
        FastDiv { d, m, s, pad: 0 }
    }

    /// What the device computes, for tests.
    #[cfg(test)]
    fn divide(&self, n: u32) -> u32 {
        let high = ((n as u64 * self.m as u64) >> 32) as u32;
        (high + n) >> self.s
    }
}

/// `struct Im2colDivs` of `cuda/index.cu`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct Im2colDivs {
    pub ohw: FastDiv,
    pub c: FastDiv,
    pub ow: FastDiv,
}

/// `struct Col2imDivs` of `cuda/index.cu`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct Col2imDivs {
    pub w: FastDiv,
    pub h: FastDiv,
    pub c: FastDiv,
    pub sh: FastDiv,
    pub sw: FastDiv,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_operands_merge_to_rank_one() {
        let a = Layout::contiguous(&[3, 4, 5]);
        let w = Walk::of("t", &[3, 4, 5], &[&a, &a]).unwrap();
        assert_eq!((w.rank, w.n, w.shape[0]), (1, 60, 60));
        assert_eq!(w.strides[0][0], 1);
    }

    #[test]
    fn a_transposed_operand_keeps_its_dimensions() {
        let a = Layout::contiguous(&[3, 4]);
        let t = Layout::contiguous(&[4, 3]).transpose(0, 1).unwrap();
        let w = Walk::of("t", &[3, 4], &[&a, &t]).unwrap();
        assert_eq!(w.rank, 2);
        assert_eq!((w.strides[1][0], w.strides[1][1]), (1, 3));
    }

    #[test]
    fn too_many_unmergeable_dimensions_are_an_error() {
        let shape = [2usize; 10];
        let a = Layout::contiguous(&shape);
        let perm: Vec<usize> = (0..10).rev().collect();
        let t = Layout::contiguous(&shape).permute(&perm).unwrap();
        assert!(Walk::of("t", &shape, &[&a, &t]).is_err());
    }

    /// The multiply-high division agrees with `/` for small, power-of-two, large and random
    /// divisors on the edges of each quotient and up to 2^31 - 1.
    #[test]
    fn fast_division_is_exact_below_two_to_the_31() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut divisors: Vec<u32> = (1..=4100).collect();
        divisors.extend((0..31).map(|k| 1u32 << k));
        divisors.extend((0..2000).map(|_| (next() % (1 << 31)) as u32 + 1));
        for &d in &divisors {
            let f = FastDiv::new(d);
            let mut ns = vec![
                0,
                1,
                d - 1,
                d,
                d.saturating_add(1),
                (1 << 31) - 1,
                (1 << 31) - 2,
            ];
            ns.extend((0..50).map(|_| (next() % (1 << 31)) as u32));
            for n in ns.into_iter().filter(|&n| n < 1 << 31) {
                assert_eq!(f.divide(n), n / d, "{n} / {d}");
            }
        }
    }
}
