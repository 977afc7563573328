//! Batched matrix multiplication (through `faer`'s SIMD kernels, AVX-512 where the CPU has it)
//! and CSR mat-vec, in `f32`, or in `f64` where any operand is `f64`.

use crate::ops::elementwise;
use crate::storage::{CpuBuffer, Dst, Src};
use hal::validate::MatrixView;
use hal::{Csr, DType, DeviceBuffer, Layout, Result, validate};
use rayon::prelude::*;

/// `out = alpha * a @ b + beta * out`; shapes were checked by the caller.
pub(crate) fn matmul(
    a: &CpuBuffer,
    am: MatrixView,
    b: &CpuBuffer,
    bm: MatrixView,
    out: &CpuBuffer,
    om: MatrixView,
    alpha: f32,
    beta: f32,
) {
    let dtypes = [a.0.dtype, b.0.dtype, out.0.dtype];
    if dtypes.contains(&DType::F64) {
        return matmul_via::<f64>(a, am, b, bm, out, om, alpha, beta);
    }
    if dtypes == [DType::F32; 3] {
        gemm(
            a.typed::<f32>(),
            am,
            b.typed::<f32>(),
            bm,
            out.typed::<f32>(),
            om,
            alpha,
            beta,
        );
        return;
    }
    matmul_via::<f32>(a, am, b, bm, out, om, alpha, beta)
}

/// The product through contiguous copies of the operands in `T` (`f32` for 16-bit operands,
/// `f64` where any is `f64`, or all are without being contiguous), rounded once on store.
fn matmul_via<T: Real>(
    a: &CpuBuffer,
    am: MatrixView,
    b: &CpuBuffer,
    bm: MatrixView,
    out: &CpuBuffer,
    om: MatrixView,
    alpha: f32,
    beta: f32,
) {
    let all = [a, b, out].iter().all(|x| x.0.dtype == T::DTYPE);
    if all {
        return gemm(
            a.typed::<T>(),
            am,
            b.typed::<T>(),
            bm,
            out.typed::<T>(),
            om,
            alpha,
            beta,
        );
    }
    let to_t = |src: Src, m: MatrixView| -> Vec<T> {
        let mut v = vec![T::default(); m.batch * m.rows * m.cols];
        let dst = Dst {
            ptr: v.as_mut_ptr() as *mut u8,
            dtype: T::DTYPE,
        };
        elementwise::copy(
            src,
            &m.layout(),
            dst,
            &Layout::contiguous(&[m.batch, m.rows, m.cols]),
        );
        v
    };
    let (av, bv) = (to_t(a.src(), am), to_t(b.src(), bm));
    let mut ov = if beta != 0.0 {
        to_t(out.src(), om)
    } else {
        vec![T::default(); om.batch * om.rows * om.cols]
    };
    let contig = |m: MatrixView| MatrixView {
        strides: [(m.rows * m.cols) as isize, m.cols as isize, 1],
        offset: 0,
        ..m
    };
    gemm(
        av.as_ptr() as *mut T,
        contig(am),
        bv.as_ptr() as *mut T,
        contig(bm),
        ov.as_mut_ptr(),
        contig(om),
        alpha,
        beta,
    );
    let src = Src {
        ptr: ov.as_ptr() as *const u8,
        dtype: T::DTYPE,
    };
    elementwise::copy(src, &contig(om).layout(), out.dst(), &om.layout());
}

/// The element types faer multiplies here.
pub(crate) trait Real:
    faer::traits::ComplexField
    + hal::Element
    + Default
    + Copy
    + PartialEq
    + std::ops::Mul<Output = Self>
    + std::ops::MulAssign
{
    fn of(v: f32) -> Self;
}

impl Real for f32 {
    fn of(v: f32) -> f32 {
        v
    }
}

impl Real for f64 {
    fn of(v: f32) -> f64 {
        v as f64
    }
}

fn gemm<T: Real>(
    a: *mut T,
    am: MatrixView,
    b: *mut T,
    bm: MatrixView,
    out: *mut T,
    om: MatrixView,
    alpha: f32,
    beta: f32,
) {
    let (alpha, zero) = (T::of(alpha), T::of(0.0));
    let (m, k, n) = (om.rows, am.cols, om.cols);
    if m == 0 || n == 0 || om.batch == 0 {
        return;
    }
    struct P<T>(*mut T);
    // SAFETY: batches write disjoint output matrices (validate::matmul: the output is inside
    // its buffer, free of self-overlap, and shares memory with no operand); inputs are only
    // read.
    unsafe impl<T> Sync for P<T> {}
    unsafe impl<T> Send for P<T> {}
    let (pa, pb, po) = (P(a), P(b), P(out));
    let one = |bi: usize, par: faer::Par| {
        let (pa, pb, po) = (&pa, &pb, &po);
        // SAFETY: every view was checked to lie inside its buffer.
        unsafe {
            let dst = po.0.offset(om.batch_offset(bi));
            if k == 0 {
                for i in 0..m as isize {
                    for j in 0..n as isize {
                        let d = dst.offset(i * om.strides[1] + j * om.strides[2]);
                        *d = if beta == 0.0 { zero } else { T::of(beta) * *d };
                    }
                }
                return;
            }
            // out = beta * out + alpha * a b, as faer's `matmul` (which replaces or adds).
            let accum = if beta == 0.0 {
                faer::Accum::Replace
            } else {
                if beta != 1.0 {
                    for i in 0..m as isize {
                        for j in 0..n as isize {
                            *dst.offset(i * om.strides[1] + j * om.strides[2]) *= T::of(beta);
                        }
                    }
                }
                faer::Accum::Add
            };
            faer::linalg::matmul::matmul(
                faer::MatMut::from_raw_parts_mut(dst, m, n, om.strides[1], om.strides[2]),
                accum,
                faer::MatRef::from_raw_parts(
                    pa.0.offset(am.batch_offset(bi)) as *const T,
                    m,
                    k,
                    am.strides[1],
                    am.strides[2],
                ),
                faer::MatRef::from_raw_parts(
                    pb.0.offset(bm.batch_offset(bi)) as *const T,
                    k,
                    n,
                    bm.strides[1],
                    bm.strides[2],
                ),
                alpha,
                par,
            );
            crate::math::clear_upper();
        }
    };
    let small = m * n * k < (1 << 18);
    if om.batch > 1 && small {
        (0..om.batch)
            .into_par_iter()
            .for_each(|bi| one(bi, faer::Par::Seq));
    } else {
        let par = if small {
            faer::Par::Seq
        } else {
            crate::all_cores()
        };
        for bi in 0..om.batch {
            one(bi, par);
        }
        if !small {
            // faer's kernels ran on the pool's threads too.
            crate::math::clear_upper_everywhere();
        }
    }
}

/// `y = alpha * A x + beta * y`; structure and indices were validated by the caller. Sums in
/// `f64`; the `f32` result is `alpha * (sum as f32) + beta * y` in `f32`, the `f64` one all in
/// `f64`.
pub(crate) fn spmv<T: Spmv>(
    rows: usize,
    offsets: &[u32],
    cols: &[u32],
    values: &[T],
    x: &[T],
    y: *mut T,
    alpha: f32,
    beta: f32,
) {
    struct P<T>(*mut T);
    // SAFETY: each row `r` writes only y[r] (validate::spmv_csr: y has `rows` elements and
    // shares memory with no operand), so threads write disjoint elements.
    unsafe impl<T> Sync for P<T> {}
    unsafe impl<T> Send for P<T> {}
    let py = P(y);
    (0..rows).into_par_iter().with_min_len(256).for_each(|r| {
        let py = &py;
        let (lo, hi) = (offsets[r] as usize, offsets[r + 1] as usize);
        let mut acc = 0f64;
        for k in lo..hi {
            acc += values[k].to_f64() * x[cols[k] as usize].to_f64();
        }
        // SAFETY: each row writes its own element.
        unsafe {
            let d = py.0.add(r);
            *d = T::finish(acc, alpha, beta, *d);
        }
    });
}

/// How `spmv` rounds its row sums.
pub(crate) trait Spmv: hal::Element + Copy {
    /// `alpha * sum + beta * y` (`y` not read where `beta` is 0).
    fn finish(sum: f64, alpha: f32, beta: f32, y: Self) -> Self;
}

impl Spmv for f32 {
    fn finish(sum: f64, alpha: f32, beta: f32, y: f32) -> f32 {
        if beta == 0.0 {
            alpha * sum as f32
        } else {
            alpha * sum as f32 + beta * y
        }
    }
}

impl Spmv for f64 {
    fn finish(sum: f64, alpha: f32, beta: f32, y: f64) -> f64 {
        if beta == 0.0 {
            alpha as f64 * sum
        } else {
            alpha as f64 * sum + beta as f64 * y
        }
    }
}

/// `y = alpha A x + beta y` for a validated CSR matrix `a`, once its structure is checked
/// (offsets start at 0, never decrease, end at the values' count; columns in range).
pub(crate) fn spmv_csr(
    a: Csr<'_, CpuBuffer>,
    x: &CpuBuffer,
    y: &CpuBuffer,
    alpha: f32,
    beta: f32,
) -> Result<()> {
    let (offsets, cols) = (
        crate::u32_slice(a.row_offsets),
        crate::u32_slice(a.col_indices),
    );
    validate::csr_structure(offsets, cols, a.cols, a.values.len())?;
    if a.values.dtype() == DType::F64 {
        // validate::spmv_csr: values, x and y of one float dtype.
        let slice =
            |b: &CpuBuffer| unsafe { std::slice::from_raw_parts(b.typed::<f64>(), b.len()) };
        spmv(
            a.rows,
            offsets,
            cols,
            slice(a.values),
            slice(x),
            y.typed::<f64>(),
            alpha,
            beta,
        );
        return Ok(());
    }
    spmv(
        a.rows,
        offsets,
        cols,
        crate::f32_slice(a.values),
        crate::f32_slice(x),
        y.typed::<f32>(),
        alpha,
        beta,
    );
    Ok(())
}
