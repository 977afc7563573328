//! Products on cooperative matrices (tensor cores): packing and the f32 fallback.

use crate::buffer::WgpuBuffer;
use crate::fault::Guard;
use crate::ops::matmul::ProductExtras;
use crate::ops::matmul::route::gemm_tile;
use crate::pipeline::{Params, Spec};
use crate::wgsl::{Access, Entry};
use crate::{V, WgpuBackend, coop, lock, wgsl};
use hal::{DType, Precision, Result, validate};

/// f32 products take the cooperative-matrix kernels only where each packed operand element
/// is used at least this often on average (`m n / (m + n)`, half the harmonic mean of the
/// output's sides; 4096 for an 8192^3 product): see `matmul_coop`. Below it the packing and
/// the epilogue cost more than the product saves (a convolution's 288 x 50176 input
/// gradient, reuse 286, ran three times slower on them; docs/PERF.md, tuning evidence).
pub(crate) const COOP_F32_MIN_REUSE: usize = 512;

/// What a cooperative-matrix product checks of its operands while packing them (scalar 6
/// of gemm_pack.wgsl).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RangeCheck {
    /// f16 operands: nothing to check.
    None = 0,
    /// bf16 operands: each value must be exactly an f16.
    ExactlyF16 = 1,
    /// f32 operands: each value finite and within f16's range.
    F16Range = 2,
}

/// An operand as gemm_coop.wgsl reads it (all in halves).
pub(crate) struct CoopOperand {
    pub(crate) buffer: WgpuBuffer,
    pub(crate) offset: usize,
    pub(crate) row_stride: usize,
    pub(crate) batch_stride: usize,
    /// Where the low parts start, past `offset` (the split mode).
    pub(crate) low: usize,
}

/// Whether the cooperative kernel can store an f32 product straight into `om`: whole tiles
/// (`[mp, np]`, the padded shape, is its own), rows contiguous and 16-byte aligned, batches
/// back to back.
fn stores_whole_tiles(om: &validate::MatrixView, [mp, np]: [usize; 2]) -> bool {
    let (m, n) = (om.rows, om.cols);
    (m, n) == (mp, np)
        && om.strides[1] == n as isize
        && om.strides[2] == 1
        && om.offset % 4 == 0
        && (om.batch == 1 || om.strides[0] == (m * n) as isize)
}

impl WgpuBackend {
    /// Whether `halves` f16 elements fit one storage binding and the cooperative kernels' u32
    /// element offsets (which also address f32 products of half as many elements).
    pub(crate) fn coop_fits(&self, halves: usize) -> bool {
        (halves as u64 * 2) <= self.max_binding_bytes() && halves < (1 << 31)
    }

    /// The matrix product on cooperative matrices (gemm_coop.wgsl), where this device has
    /// them and the call suits: f16 operands; bf16 operands (exactly f16 where every value
    /// is one, else the f32 kernels); f32 operands under [`Precision::Fast`] (rounded to f16)
    /// or [`Precision::Compensated`] (split into f16 high and low parts). A value outside
    /// f16's range sends the product to the f32 kernels, decided on the device: a range check
    /// while packing the operands, the cooperative kernel and the f32 fallback each guarded
    /// by its verdict. `false`: not taken (the caller runs the f32 kernels).
    pub(crate) fn matmul_coop(
        &self,
        [a, b, out]: [V<'_>; 3],
        [am, bm, om]: [&validate::MatrixView; 3],
        alpha: f32,
        beta: f32,
    ) -> Result<bool> {
        let Some(tiling) = &self.0.coop else {
            return Ok(false);
        };
        let split = a.dtype() == DType::F32 && self.1 == Precision::Compensated;
        let check = match (a.dtype(), self.1) {
            (DType::F16, _) => RangeCheck::None,
            (DType::BF16, _) => RangeCheck::ExactlyF16,
            (DType::F32, Precision::Fast | Precision::Compensated) => RangeCheck::F16Range,
            _ => return Ok(false),
        };
        let tiles = if split {
            coop::CoopTiles::SPLIT
        } else {
            *lock(tiling)
        };
        let (m, n, k) = (om.rows, om.cols, am.cols);
        if a.dtype() == DType::F32 && m * n < COOP_F32_MIN_REUSE * (m + n) {
            // f32 operands are packed to halves first, a pass over both: with a thin output
            // (a convolution's 64 x 50176, say) the packing and the epilogue alone cost more
            // than the f32 kernels' whole product.
            return Ok(false);
        }
        let mp = m.next_multiple_of(tiles.rows());
        let np = n.next_multiple_of(tiles.cols());
        let kp = k.next_multiple_of(coop::STEP_K);
        let direct = out.dtype() == DType::F32
            && alpha == 1.0
            && beta == 0.0
            && stores_whole_tiles(om, [mp, np]);
        let parts = if split { 2 } else { 1 };
        // The padded product as f32 takes as many bytes as twice its elements in halves.
        if !self.coop_fits(parts * am.batch * mp * kp)
            || !self.coop_fits(parts * bm.batch * kp * np)
            || (!direct && !self.coop_fits(2 * om.batch * mp * np))
        {
            return Ok(false);
        }
        let guard = (check != RangeCheck::None).then(|| self.next_guard());
        let pa = self.coop_operand(a, am, [mp, kp], split, check, guard)?;
        let pb = self.coop_operand(b, bm, [kp, np], split, check, guard)?;
        let (product, c_offset, ldc) = if direct {
            (out.buffer.clone(), om.offset, n)
        } else {
            (self.scratch(DType::F32, om.batch * mp * np)?, 0, np)
        };
        let kernel = self.kernel(&Spec {
            file: "gemm_coop.wgsl",
            bindings: None,
            slots: coop::gemm_slots(tiles, split),
            entry: Entry::Strided,
        })?;
        let g = guard.unwrap_or(Guard { word: 0, serial: 0 });
        let p = Params::default()
            .scalar(0, kp as u32)
            .scalar(1, pa.row_stride as u32)
            .scalar(2, pb.row_stride as u32)
            .scalar(3, ldc as u32)
            .scalar(4, pa.batch_stride as u32)
            .scalar(5, pb.batch_stride as u32)
            .scalar(6, (mp * ldc) as u32)
            .scalar(7, pa.low as u32)
            .scalar(8, pb.low as u32)
            .scalar(9, c_offset as u32)
            .scalar(10, g.word)
            .scalar(11, g.serial)
            .scalar(12, pa.offset as u32)
            .scalar(13, pb.offset as u32);
        self.dispatch_groups(
            &kernel,
            &p,
            &[
                (&pa.buffer, false),
                (&pb.buffer, false),
                (&product, true),
                (&self.0.verdicts, false),
            ],
            [
                (np / tiles.cols()) as u32,
                (mp / tiles.rows()) as u32,
                om.batch as u32,
            ],
        )?;
        if !direct {
            self.coop_epilogue(&product, out, om, [mp, np], [alpha, beta], guard)?;
        }
        if let Some(g) = guard {
            let tile = gemm_tile(om.rows, om.cols, om.batch);
            let extras = ProductExtras {
                fallback_of: Some(g),
                ..Default::default()
            };
            self.matmul_f32(
                [a, b, out],
                [am, bm, om],
                alpha,
                beta,
                (false, tile),
                extras,
            )?;
        }
        Ok(true)
    }

    /// `out = alpha product + beta out` from the padded f32 product of a cooperative-matrix
    /// product that could not store into `out` directly (gemm_epilogue.wgsl), standing down
    /// where `guard`'s range check failed.
    fn coop_epilogue(
        &self,
        product: &WgpuBuffer,
        out: V<'_>,
        om: &validate::MatrixView,
        [mp, np]: [usize; 2],
        [alpha, beta]: [f32; 2],
        guard: Option<Guard>,
    ) -> Result<()> {
        let (m, n) = (om.rows, om.cols);
        let p = Params::default()
            .block(&om.layout())
            .scalar(0, m as u32)
            .scalar(1, n as u32)
            .scalar(2, np as u32)
            .scalar(3, (mp * np) as u32)
            .f(4, alpha)
            .f(5, beta);
        self.run_guarded(
            Spec::new("gemm_epilogue.wgsl").bindings(wgsl::io(&[DType::F32], out.dtype())),
            p,
            &[(product, false), (out.buffer, true)],
            om.batch * m * n,
            guard,
        )
    }

    /// One operand of [`Self::matmul_coop`] as the kernel reads it: `v` itself where it is
    /// already f16, row major and whole tiles (`[rows, cols]` padded), else a packed copy
    /// (gemm_pack.wgsl) with the range check's verdict written under `guard`.
    pub(crate) fn coop_operand(
        &self,
        v: V<'_>,
        mv: &validate::MatrixView,
        [rows, cols]: [usize; 2],
        split: bool,
        check: RangeCheck,
        guard: Option<Guard>,
    ) -> Result<CoopOperand> {
        let batch_stride = mv.batch_stride();
        if v.dtype() == DType::F16
            && !split
            && (mv.rows, mv.cols) == (rows, cols)
            && mv.strides[1] == cols as isize
            && mv.strides[2] == 1
            && (batch_stride == 0 || batch_stride == (rows * cols) as isize)
            && mv.offset % 8 == 0
        {
            return Ok(CoopOperand {
                buffer: v.buffer.clone(),
                offset: mv.offset,
                row_stride: cols,
                batch_stride: batch_stride as usize,
                low: 0,
            });
        }
        // A broadcast batch is packed once.
        let batches = if batch_stride == 0 { 1 } else { mv.batch };
        let layout = mv.layout();
        let words = batches * rows * cols / 2;
        let parts = if split { 2 } else { 1 };
        let packed = self.scratch(DType::U32, parts * words)?;
        let g = guard.unwrap_or(Guard { word: 0, serial: 0 });
        let i32s = |v: isize| v as i32 as u32;
        let p = Params::default()
            .scalar(7, layout.offset as u32)
            .scalar(8, i32s(if batches == 1 { 0 } else { layout.strides[0] }))
            .scalar(9, i32s(layout.strides[1]))
            .scalar(10, i32s(layout.strides[2]))
            .scalar(0, mv.rows as u32)
            .scalar(1, mv.cols as u32)
            .scalar(2, rows as u32)
            .scalar(3, cols as u32)
            .scalar(4, split as u32)
            .scalar(5, words as u32)
            .scalar(6, check as u32)
            .scalar(14, g.word)
            .scalar(15, g.serial);
        let bindings = vec![
            (v.dtype(), Access::Read),
            (DType::U32, Access::Write),
            (DType::U32, Access::Write),
        ];
        self.run(
            Spec::new("gemm_pack.wgsl").bindings(bindings),
            p,
            &[(v.buffer, false), (&packed, true), (&self.0.verdicts, true)],
            words,
        )?;
        Ok(CoopOperand {
            buffer: packed,
            offset: 0,
            row_stride: cols,
            batch_stride: if batches == 1 { 0 } else { rows * cols },
            low: 2 * words,
        })
    }
}
