//! The GEMM kernels' launch parameters (`shaders/matmul/gemm_params.wgsl`).

use crate::pipeline::launch_params;
use hal::validate::MatrixView;

launch_params! {
    /// What gemm.wgsl and the dot-product kernels read, for one slice of k.
    pub(crate) struct GemmParams {
        rows: u32,
        cols: u32,
        /// The slice of k this dispatch adds.
        k_start: u32,
        k_end: u32,
        alpha: f32,
        /// beta for the first slice, 1 for the later ones.
        beta: f32,
        /// batch x rows x cols.
        outputs: u32,
        a_row_stride: i32,
        a_col_stride: i32,
        /// The f32 fallback of a cooperative-matrix product: its range check's verdict word.
        verdict_word: u32,
        b_row_stride: i32,
        b_col_stride: i32,
        verdict_serial: u32,
        out_row_stride: i32,
        out_col_stride: i32,
        /// A gated read: the gate's output, in elements from A's.
        gate_shift: i32,
    }
}

impl GemmParams {
    /// The product of `a` and `b` into `out` over `k_start..k_end`, `beta` applying to the
    /// first slice alone; no fallback verdict, no gate.
    pub(crate) fn slice(
        [a, b, out]: [&MatrixView; 3],
        [k_start, k_end]: [usize; 2],
        alpha: f32,
        beta: f32,
    ) -> Self {
        let i = |v: isize| v as i32;
        GemmParams {
            rows: out.rows as u32,
            cols: out.cols as u32,
            k_start: k_start as u32,
            k_end: k_end as u32,
            alpha,
            beta: if k_start == 0 { beta } else { 1.0 },
            outputs: (out.batch * out.rows * out.cols) as u32,
            a_row_stride: i(a.strides[1]),
            a_col_stride: i(a.strides[2]),
            b_row_stride: i(b.strides[1]),
            b_col_stride: i(b.strides[2]),
            out_row_stride: i(out.strides[1]),
            out_col_stride: i(out.strides[2]),
            ..Default::default()
        }
    }
}
