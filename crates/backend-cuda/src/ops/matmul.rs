//! Matrix products (cuBLAS and the small-product kernels) and sparse products.

use crate::buffer::CudaBuffer;
use crate::device::Args;
use crate::{CudaBackend, V, device};
use cudarc::cublas::{result as blas, sys as blas_sys};
use hal::fault::{fault_code, index_fault, offsets_fault_code};
use hal::validate::MatrixView;
use hal::{
    Backend, Csr, DType, DeviceBuffer, Error, Layout, Precision, Result, UnaryOp, View, validate,
};
use std::ffi::c_void;
use std::sync::atomic::Ordering;

/// Products with at most this many multiply-adds (`batch * m * n * k`) run as our
/// `small_gemm_*` kernels rather than cuBLAS, whose launch and tile set-up dominate there (a
/// training step's 10 x 128 x 256 weight gradient, say).
pub(crate) const SMALL_GEMM_WORK: usize = 1 << 22;

/// The longest inner length of a small product: a warp walks it alone, so longer sums over
/// few outputs go to cuBLAS, which splits them.
pub(crate) const SMALL_GEMM_MAX_K: usize = 4096;

/// From this inner length on, a small product gives each output a warp (`small_gemm_warp`);
/// below it, a thread (`small_gemm_thread`).
pub(crate) const SMALL_GEMM_WARP_FROM_K: usize = 64;

/// A strided matrix operand of the `small_gemm_*` kernels (`SmallMat` in `cuda/reduce.cu`):
/// element offset, then batch, row and column strides.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct SmallMat {
    pub(crate) offset: i64,
    pub(crate) batch_stride: i64,
    pub(crate) row_stride: i64,
    pub(crate) col_stride: i64,
}

impl SmallMat {
    pub(crate) fn of(m: &MatrixView) -> Self {
        Self {
            offset: m.offset as i64,
            batch_stride: m.batch_stride() as i64,
            row_stride: m.strides[1] as i64,
            col_stride: m.strides[2] as i64,
        }
    }
}

pub(crate) fn matmul(
    gpu: &CudaBackend,
    a: V<'_>,
    b: V<'_>,
    out: V<'_>,
    alpha: f32,
    beta: f32,
) -> Result<()> {
    gpu.dev.bind()?;
    gpu.gemm(a, b, out, alpha, beta)
}

pub(crate) fn spmv_csr(
    gpu: &CudaBackend,
    a: Csr<'_, CudaBuffer>,
    x: &CudaBuffer,
    y: &CudaBuffer,
    alpha: f32,
    beta: f32,
) -> Result<()> {
    validate::spmv_csr(&a, x, y)?;
    gpu.dev.bind()?;
    let verdict = gpu.scratch(DType::U32, 1)?;
    let nnz = a.col_indices.len();
    gpu.dev.launch(
        "check_csr",
        (a.rows + 1).max(nnz),
        Args::new()
            .arg(a.row_offsets.ptr())
            .arg(a.rows as i64)
            .arg(a.col_indices.ptr())
            .arg(nnz as i64)
            .arg(a.cols as i64)
            .arg(offsets_fault_code("spmv_csr"))
            .arg(fault_code("spmv_csr", index_fault(DType::U32)))
            .arg(gpu.dev.fault.ptr)
            .arg(verdict.ptr()),
    )?;
    gpu.dev.fault_pending.store(true, Ordering::Release);
    // validate::spmv_csr: values, x and y all f32 or all f64.
    let kernel = match a.values.dtype() {
        DType::F64 => "spmv_wide_kernel",
        _ => "spmv_kernel",
    };
    gpu.dev.launch(
        kernel,
        a.rows * 32,
        Args::new()
            .arg(a.rows as i64)
            .arg(a.row_offsets.ptr())
            .arg(a.col_indices.ptr())
            .arg(a.values.ptr())
            .arg(x.ptr())
            .arg(y.ptr())
            .arg(alpha)
            .arg(beta)
            .arg(verdict.ptr()),
    )
}

impl CudaBackend {
    /// cuBLAS's view of a matrix operand: `(transpose, leading dimension)` such that the
    /// column-major matrix it describes is the row-major matrix's transpose, or `None` when the
    /// strides fit neither form (or are negative).
    pub(crate) fn blas_form(rows: usize, cols: usize, rs: isize, cs: isize) -> Option<(bool, i64)> {
        let (rs, cs) = (
            if rows == 1 { cols.max(1) as isize } else { rs },
            if cols == 1 { 1 } else { cs },
        );
        if cs == 1 && rs >= cols.max(1) as isize {
            Some((false, rs as i64))
        } else if rs == 1 && cs >= rows.max(1) as isize {
            Some((true, cs as i64))
        } else {
            None
        }
    }

    /// A product of at most `SMALL_GEMM_WORK` multiply-adds and k up to `SMALL_GEMM_MAX_K`:
    /// a thread or a warp per output, where cuBLAS's set-up would cost more than the work.
    fn small_gemm(
        &self,
        [a, b, out]: [V<'_>; 3],
        [am, bm, om]: [&MatrixView; 3],
        alpha: f32,
        beta: f32,
    ) -> Result<()> {
        let outputs = om.batch * om.rows * om.cols;
        let (name, threads) = if am.cols >= SMALL_GEMM_WARP_FROM_K {
            ("small_gemm_warp", outputs * 32)
        } else {
            ("small_gemm_thread", outputs)
        };
        let args = Args::new()
            .arg(om.batch as i64)
            .arg(om.rows as i64)
            .arg(om.cols as i64)
            .arg(am.cols as i64)
            .operand(a.buffer)
            .arg(SmallMat::of(am))
            .operand(b.buffer)
            .arg(SmallMat::of(bm))
            .operand(out.buffer)
            .arg(SmallMat::of(om))
            .arg(alpha)
            .arg(beta);
        self.dev.launch(name, threads, args)
    }

    /// An operand as cuBLAS can read it: itself where its strides have a [`Self::blas_form`]
    /// (and its batch stride is not negative), else a contiguous copy.
    fn blas_operand(&self, v: V<'_>, m: MatrixView) -> Result<(CudaBuffer, MatrixView)> {
        let ok = Self::blas_form(m.rows, m.cols, m.strides[1], m.strides[2]).is_some()
            && m.strides[0] >= 0;
        if ok {
            return Ok((v.buffer.clone(), m));
        }
        let l = m.layout();
        let c = self.contiguous(View::new(v.buffer, &l), v.dtype())?;
        Ok((
            c,
            MatrixView::of(&Layout::contiguous(&[m.batch, m.rows, m.cols])),
        ))
    }

    /// `gemm` into a contiguous temporary of `tmp_dt` (holding `out`'s values first where
    /// beta is not 0), then copied into `out`: for an output cuBLAS cannot write in place.
    fn gemm_via_temporary(
        &self,
        [a, b, out]: [V<'_>; 3],
        om: &MatrixView,
        tmp_dt: DType,
        alpha: f32,
        beta: f32,
    ) -> Result<()> {
        let tl = Layout::contiguous(&[om.batch, om.rows, om.cols]);
        let tmp = self.new_buffer(tmp_dt, tl.numel())?;
        let ol = om.layout();
        if beta != 0.0 {
            self.copy_view(View::new(out.buffer, &ol), View::new(&tmp, &tl))?;
        }
        self.gemm(a, b, View::new(&tmp, &tl), alpha, beta)?;
        self.copy_view(View::new(&tmp, &tl), View::new(out.buffer, &ol))
    }

    pub(crate) fn gemm(&self, a: V<'_>, b: V<'_>, out: V<'_>, alpha: f32, beta: f32) -> Result<()> {
        let [am, bm, om] = validate::matmul(a, b, out)?;
        if om.batch * om.rows * om.cols == 0 {
            return Ok(());
        }
        if am.cols == 0 {
            // No products: out = beta * out (beta == 0 ignores old contents).
            return if beta == 0.0 {
                self.fill(out, 0.0)
            } else {
                self.unary(
                    UnaryOp::Affine {
                        scale: beta,
                        shift: 0.0,
                    },
                    out,
                    out,
                )
            };
        }
        let wide = [a, b, out].iter().any(|v| v.dtype() == DType::F64);
        if wide && (a.dtype() != DType::F64 || b.dtype() != DType::F64) {
            // f64 products take f64 operands: the others widened (exactly) first.
            let widen = |v: V<'_>| -> Result<(CudaBuffer, Layout)> {
                if v.dtype() == DType::F64 {
                    return Ok((v.buffer.clone(), v.layout.clone()));
                }
                Ok((
                    self.contiguous(v, DType::F64)?,
                    Layout::contiguous(&v.layout.shape),
                ))
            };
            let ((ab, al), (bb, bl)) = (widen(a)?, widen(b)?);
            return self.gemm(View::new(&ab, &al), View::new(&bb, &bl), out, alpha, beta);
        }
        if !wide
            && om.batch * om.rows * om.cols * am.cols <= SMALL_GEMM_WORK
            && am.cols <= SMALL_GEMM_MAX_K
        {
            return self.small_gemm([a, b, out], [&am, &bm, &om], alpha, beta);
        }
        let in_dt = a.dtype();
        let out_ok = match in_dt {
            DType::F32 | DType::F64 => out.dtype() == in_dt,
            _ => out.dtype() == in_dt || out.dtype() == DType::F32,
        };
        let out_form = Self::blas_form(om.rows, om.cols, om.strides[1], om.strides[2])
            .filter(|&(t, _)| !t)
            .filter(|_| om.batch == 1 || om.strides[0] > 0);
        if !out_ok || out_form.is_none() {
            // Into a contiguous f32 (f64, or input-dtype) temporary, then copied into place.
            let tmp_dt = match (out_ok, wide) {
                (true, _) => out.dtype(),
                (false, true) => DType::F64,
                (false, false) => DType::F32,
            };
            return self.gemm_via_temporary([a, b, out], &om, tmp_dt, alpha, beta);
        }
        let ldc = out_form.expect("checked").1;
        self.cublas_product([a, b, out], [am, bm, om], ldc, alpha, beta)
    }

    /// The product on cuBLAS (`gemm`'s last step): operands made readable, sizes checked
    /// against cuBLAS's 32-bit ints, the data and compute types of `a`'s dtype.
    fn cublas_product(
        &self,
        [a, b, out]: [V<'_>; 3],
        [am, bm, om]: [MatrixView; 3],
        ldc: i64,
        alpha: f32,
        beta: f32,
    ) -> Result<()> {
        let in_dt = a.dtype();
        let (abuf, am) = self.blas_operand(a, am)?;
        let (bbuf, bm) = self.blas_operand(b, bm)?;
        let (ta, lda) =
            Self::blas_form(am.rows, am.cols, am.strides[1], am.strides[2]).expect("checked");
        let (tb, ldb) =
            Self::blas_form(bm.rows, bm.cols, bm.strides[1], bm.strides[2]).expect("checked");
        // cuBLAS takes sizes and leading dimensions as 32-bit ints: a larger one would be
        // truncated into a product over other memory.
        let dims = [om.rows, om.cols, am.cols, om.batch].map(|v| v as i64);
        let sizes = [dims[0], dims[1], dims[2], dims[3], lda, ldb, ldc];
        if sizes.iter().any(|&v| !(0..=i32::MAX as i64).contains(&v)) {
            return Err(Error::Unsupported {
                op: "matmul",
                detail: format!(
                    "cuBLAS indexes sizes and leading dimensions in 32 bits; got {sizes:?} \
                     (rows, cols, k, batch, lda, ldb, ldc)"
                ),
            });
        }
        let dt = |d: DType| match d {
            DType::F16 => blas_sys::cudaDataType::CUDA_R_16F,
            DType::BF16 => blas_sys::cudaDataType::CUDA_R_16BF,
            DType::F64 => blas_sys::cudaDataType::CUDA_R_64F,
            _ => blas_sys::cudaDataType::CUDA_R_32F,
        };
        let compute = if in_dt == DType::F64 {
            blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_64F
        } else if in_dt == DType::F32 && self.precision == Precision::Fast {
            blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32
        } else {
            blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F
        };
        // The scalars' type is the compute type's: double for 64F.
        let (alpha64, beta64) = (alpha as f64, beta as f64);
        let (alpha_ptr, beta_ptr) = if in_dt == DType::F64 {
            (
                &alpha64 as *const f64 as *const c_void,
                &beta64 as *const f64 as *const c_void,
            )
        } else {
            (
                &alpha as *const f32 as *const c_void,
                &beta as *const f32 as *const c_void,
            )
        };
        let op = |t: bool| {
            if t {
                blas_sys::cublasOperation_t::CUBLAS_OP_T
            } else {
                blas_sys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        let es = in_dt.size_in_bytes() as u64;
        let oes = out.dtype().size_in_bytes() as u64;
        // Row-major out = a @ b is column-major out^T = b^T @ a^T: cuBLAS's "A" is b.
        let handle = self.dev.cublas.lock().unwrap_or_else(|e| e.into_inner());
        // Profiles name each product's shape (the formatting only when profiling).
        let name = match self.dev.profiler {
            Some(_) => format!(
                "cublas gemm {}x{}x{} batch {}",
                om.rows, om.cols, am.cols, om.batch
            ),
            None => String::new(),
        };
        // SAFETY: the pointers are live blocks; validate::matmul proved every operand's extent
        // inside its buffer with checked arithmetic, and the sizes fit cuBLAS's ints (above).
        self.dev.timed(&name, || unsafe {
            blas::gemm_strided_batched_ex(
                *handle,
                op(tb),
                op(ta),
                om.cols as i32,
                om.rows as i32,
                am.cols as i32,
                alpha_ptr,
                (bbuf.ptr() + bm.offset as u64 * es) as *const c_void,
                dt(in_dt),
                ldb as i32,
                bm.batch_stride() as i64,
                (abuf.ptr() + am.offset as u64 * es) as *const c_void,
                dt(in_dt),
                lda as i32,
                am.batch_stride() as i64,
                beta_ptr,
                (out.buffer.ptr() + om.offset as u64 * oes) as *mut c_void,
                dt(out.dtype()),
                ldc as i32,
                om.strides[0] as i64,
                om.batch as i32,
                compute,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
            .map_err(|e| device::blas_error("cublasGemmStridedBatchedEx", e))
        })
    }
}
