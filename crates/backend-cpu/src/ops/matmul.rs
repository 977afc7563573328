//! Batched matrix multiplication (through `faer`'s SIMD kernels, AVX-512 where the CPU has it)
//! and CSR mat-vec.

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
    let all_f32 = a.0.dtype == DType::F32 && b.0.dtype == DType::F32 && out.0.dtype == DType::F32;
    if all_f32 {
        gemm_f32(
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
    // Other dtypes: convert the operands to contiguous f32, multiply, round once on store.
    let to_f32 = |src: Src, m: MatrixView| -> Vec<f32> {
        let mut v = vec![0f32; m.batch * m.rows * m.cols];
        let dst = Dst {
            ptr: v.as_mut_ptr() as *mut u8,
            dtype: DType::F32,
        };
        elementwise::copy(
            src,
            &m.layout(),
            dst,
            &Layout::contiguous(&[m.batch, m.rows, m.cols]),
        );
        v
    };
    let (av, bv) = (to_f32(a.src(), am), to_f32(b.src(), bm));
    let mut ov = if beta != 0.0 {
        to_f32(out.src(), om)
    } else {
        vec![0f32; om.batch * om.rows * om.cols]
    };
    let contig = |m: MatrixView| MatrixView {
        strides: [(m.rows * m.cols) as isize, m.cols as isize, 1],
        offset: 0,
        ..m
    };
    gemm_f32(
        av.as_ptr() as *mut f32,
        contig(am),
        bv.as_ptr() as *mut f32,
        contig(bm),
        ov.as_mut_ptr(),
        contig(om),
        alpha,
        beta,
    );
    let src = Src {
        ptr: ov.as_ptr() as *const u8,
        dtype: DType::F32,
    };
    elementwise::copy(src, &contig(om).layout(), out.dst(), &om.layout());
}

fn gemm_f32(
    a: *mut f32,
    am: MatrixView,
    b: *mut f32,
    bm: MatrixView,
    out: *mut f32,
    om: MatrixView,
    alpha: f32,
    beta: f32,
) {
    let (m, k, n) = (om.rows, am.cols, om.cols);
    if m == 0 || n == 0 || om.batch == 0 {
        return;
    }
    struct P(*mut f32);
    // SAFETY: batches write disjoint output matrices (validate::matmul: the output is inside
    // its buffer, free of self-overlap, and shares memory with no operand); inputs are only
    // read.
    unsafe impl Sync for P {}
    unsafe impl Send for P {}
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
                        *d = if beta == 0.0 { 0.0 } else { beta * *d };
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
                            *dst.offset(i * om.strides[1] + j * om.strides[2]) *= beta;
                        }
                    }
                }
                faer::Accum::Add
            };
            faer::linalg::matmul::matmul(
                faer::MatMut::from_raw_parts_mut(dst, m, n, om.strides[1], om.strides[2]),
                accum,
                faer::MatRef::from_raw_parts(
                    pa.0.offset(am.batch_offset(bi)) as *const f32,
                    m,
                    k,
                    am.strides[1],
                    am.strides[2],
                ),
                faer::MatRef::from_raw_parts(
                    pb.0.offset(bm.batch_offset(bi)) as *const f32,
                    k,
                    n,
                    bm.strides[1],
                    bm.strides[2],
                ),
                alpha,
                par,
            );
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
            faer::Par::rayon(0)
        };
        for bi in 0..om.batch {
            one(bi, par);
        }
    }
}

/// `y = alpha * A x + beta * y`; structure and indices were validated by the caller.
pub(crate) fn spmv(
    rows: usize,
    offsets: &[u32],
    cols: &[u32],
    values: &[f32],
    x: &[f32],
    y: *mut f32,
    alpha: f32,
    beta: f32,
) {
    struct P(*mut f32);
    // SAFETY: each row `r` writes only y[r] (validate::spmv_csr: y has `rows` elements and
    // shares memory with no operand), so threads write disjoint elements.
    unsafe impl Sync for P {}
    unsafe impl Send for P {}
    let py = P(y);
    (0..rows).into_par_iter().with_min_len(256).for_each(|r| {
        let py = &py;
        let (lo, hi) = (offsets[r] as usize, offsets[r + 1] as usize);
        let mut acc = 0f64;
        for k in lo..hi {
            acc += values[k] as f64 * x[cols[k] as usize] as f64;
        }
        // SAFETY: each row writes its own element.
        unsafe {
            let d = py.0.add(r);
            *d = if beta == 0.0 {
                alpha * acc as f32
            } else {
                alpha * acc as f32 + beta * *d
            };
        }
    });
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
