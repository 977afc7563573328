//! Matrix products: routing, split-k, fused epilogues; sparse products.

pub(crate) mod coop;
pub(crate) mod params;
pub(crate) mod route;

use crate::buffer::WgpuBuffer;
use crate::fault::{Guard, guard_slot};
use crate::ops::CHUNK;
use crate::ops::elementwise::{unary_params, unary_scalars};
use crate::ops::matmul::params::GemmParams;
use crate::ops::matmul::route::{
    GemmRoute, SPLIT_DOT_THIN, TileShape, fused_epilogues, gemm_label, gemm_route, unit_k_strides,
};
use crate::pipeline::{Params, Spec};
use crate::wgsl::Access;
use crate::{V, WgpuBackend, wgsl};
use hal::fault::{fault_code, index_fault, offsets_fault_code};
use hal::{
    Backend, BinaryOp, Csr, DType, DeviceBuffer, Epilogue, Layout, Result, UnaryOp, View, validate,
};

/// What a product does besides the product (a [`hal::Epilogue`] as the kernels take it): `a`
/// read through a gate, the sums of `a`'s rows (a column of ones after `b`'s last, stored to
/// this buffer and `[rows]` layout), the bias (its layout broadcast to the output's `[rows,
/// cols]`) and the activation. A split product ([`WgpuBackend::matmul_split_k`]) reads the
/// gate and makes the row sums in its slices and does the rest in its sum pass
/// (gemm_sum.wgsl); a whole dot product does all of it in its one launch; the tile kernel
/// takes the gate alone.
#[derive(Clone, Copy, Default)]
pub(crate) struct Fused<'a> {
    pub(crate) gate: Option<GateRead<'a>>,
    pub(crate) row_sums: Option<(&'a WgpuBuffer, &'a Layout)>,
    pub(crate) bias: Option<(&'a WgpuBuffer, &'a Layout)>,
    pub(crate) activation: Option<UnaryOp>,
}

impl Fused<'_> {
    /// Whether anything besides the gate is asked for: what the tile kernel cannot do.
    pub(crate) fn finishes(&self) -> bool {
        self.bias.is_some() || self.activation.is_some() || self.row_sums.is_some()
    }
}

/// What a product's f32 kernel does besides the plain product ([`WgpuBackend::matmul_f32`]).
#[derive(Clone, Copy, Default)]
pub(crate) struct ProductExtras<'a> {
    /// The f32 fallback of a cooperative-matrix product: it writes only if that product's
    /// range check failed.
    pub(crate) fallback_of: Option<Guard>,
    /// `a` read through a gate (the `a_load` slot of tile.wgsl and gemm_dot_body.wgsl), and
    /// for the dot kernel alone the rest of the epilogue (its `dot_epilogue` slot).
    pub(crate) fused: Fused<'a>,
    /// `b` read with a column of ones after its last (the `ones_column` slot): the output's
    /// last column, one more than `b` has, sums the rows of (the gated) `a` (stored apart
    /// where `fused` has row sums).
    pub(crate) ones_column: bool,
}

/// A [`hal::Gate`] as a product's kernel applies it: the gate's output lies at `a`'s strides,
/// each element `shift` elements from `a`'s in its own buffer (binding 4, scalar 15).
#[derive(Clone, Copy)]
pub(crate) struct GateRead<'a> {
    pub(crate) activation: UnaryOp,
    pub(crate) output: &'a WgpuBuffer,
    pub(crate) shift: i32,
}

impl<'a> GateRead<'a> {
    /// The gate as a kernel reading `am` can apply it: where the gate's output has `am`'s
    /// strides (one matrix; a batch of one) and lies within reach of an i32 shift.
    pub(crate) fn of(gate: hal::Gate<'a, WgpuBuffer>, am: &validate::MatrixView) -> Option<Self> {
        let gm = validate::MatrixView::of(gate.output.layout);
        let same = gm.batch == 1 && am.batch == 1 && gm.strides[1..] == am.strides[1..];
        let shift = i32::try_from(gm.offset as isize - am.offset as isize).ok()?;
        same.then_some(GateRead {
            activation: gate.activation,
            output: gate.output.buffer,
            shift,
        })
    }
}

pub(crate) fn matmul(
    gpu: &WgpuBackend,
    a: V<'_>,
    b: V<'_>,
    out: V<'_>,
    alpha: f32,
    beta: f32,
) -> Result<()> {
    let [am, bm, om] = validate::matmul(a, b, out)?;
    if om.batch == 0 || om.rows == 0 || om.cols == 0 {
        return Ok(());
    }
    gpu.labelled(
        || gemm_label(&am, &om),
        || gpu.matmul_routed([a, b, out], [&am, &bm, &om], alpha, beta, Fused::default()),
    )
}

pub(crate) fn matmul_epilogue(
    gpu: &WgpuBackend,
    a: V<'_>,
    b: V<'_>,
    out: V<'_>,
    alpha: f32,
    beta: f32,
    epilogue: Epilogue<'_, WgpuBuffer>,
) -> Result<()> {
    let ([am, bm, om], bias) = validate::matmul_epilogue([a, b, out], &epilogue)?;
    let GemmRoute { slices, dot, .. } = gemm_route(&am, &bm, &om, beta);
    // A gate fuses where its output has a's strides (the kernels read both at one index).
    let gate = epilogue.a_gate.map(|g| GateRead::of(g, &am));
    let gate_fuses = gate.is_none_or(|g| g.is_some());
    let gate = gate.flatten();
    let empty = om.batch * om.rows * om.cols == 0;
    if empty || !gate_fuses || !fused_epilogues() {
        return gpu.matmul_epilogue_unfused([a, b, out], alpha, beta, epilogue);
    }
    // A rank-3 output has batch 1 where the rest fuses: the bias as the output's [rows,
    // cols].
    let bias = bias.map(|l| {
        let r = l.rank();
        Layout {
            shape: l.shape[r - 2..].to_vec(),
            strides: l.strides[r - 2..].to_vec(),
            offset: l.offset,
        }
    });
    let fused = Fused {
        gate,
        row_sums: epilogue.a_row_sums.map(|v| (v.buffer, v.layout)),
        bias: epilogue.bias.map(|v| v.buffer).zip(bias.as_ref()),
        activation: epilogue.activation,
    };
    // Everything fuses where the product is split over k (its slices read `a` through
    // the gate and sum its rows, its sum pass adds the bias and applies the activation:
    // a Linear layer's forward and backward products in a training step) or runs whole
    // as dot products (an activation without parameters: the kernel's scalars 0 and 1
    // are taken). Other products take a gate alone (their kernels read `a` through it);
    // the rest runs as separate calls.
    let fuses = match (slices > 1, dot) {
        (true, _) => true,
        (false, true) => {
            beta == 0.0
                && om.batch == 1
                && epilogue
                    .activation
                    .is_none_or(|op| unary_scalars(op).is_none())
        }
        (false, false) => fused.gate.is_some() && !fused.finishes(),
    };
    if !fuses {
        return gpu.matmul_epilogue_unfused([a, b, out], alpha, beta, epilogue);
    }
    gpu.labelled(
        || gemm_label(&am, &om),
        || gpu.matmul_routed([a, b, out], [&am, &bm, &om], alpha, beta, fused),
    )
}

pub(crate) fn spmv_csr(
    gpu: &WgpuBackend,
    a: Csr<'_, WgpuBuffer>,
    x: &WgpuBuffer,
    y: &WgpuBuffer,
    alpha: f32,
    beta: f32,
) -> Result<()> {
    validate::spmv_csr(&a, x, y)?;
    // The structure is checked on the device first; the product reads the verdict.
    let nnz = a.values.len();
    let p = Params::default()
        .scalar(0, a.rows as u32)
        .scalar(1, a.cols.min(u32::MAX as usize) as u32)
        .scalar(2, nnz as u32)
        .scalar(4, offsets_fault_code("spmv_csr"))
        .scalar(5, fault_code("spmv_csr", index_fault(DType::U32)));
    let guard = gpu.run_check(
        Spec::new("check_csr.wgsl"),
        p,
        &[a.row_offsets, a.col_indices],
        (a.rows + 1).max(nnz),
    )?;
    let p = Params::default().f(0, alpha).f(1, beta);
    gpu.run_guarded(
        Spec::new("spmv.wgsl"),
        p,
        &[
            (a.row_offsets, false),
            (a.col_indices, false),
            (a.values, false),
            (x, false),
            (y, true),
        ],
        a.rows,
        Some(guard),
    )
}

/// What a product's kernel binds and is specialised with for its [`ProductExtras`]: the
/// bindings (operands, then the gate's output, then the epilogue's buffers), the slots both
/// kernel files take, the buffers in binding order (with whether each is written) and the
/// epilogue's layouts (blocks 3 and 4).
struct ProductInputs<'a> {
    bindings: Vec<(DType, Access)>,
    slots: Vec<(&'static str, String)>,
    buffers: Vec<(&'a WgpuBuffer, bool)>,
    finish_blocks: Vec<Layout>,
}

impl<'a> ProductInputs<'a> {
    fn of([a, b, out]: [V<'a>; 3], extras: &ProductExtras<'a>) -> Self {
        let Fused {
            gate,
            row_sums,
            bias,
            activation,
        } = extras.fused;
        let mut inputs = ProductInputs {
            bindings: wgsl::io(&[a.dtype(), b.dtype()], out.dtype()),
            slots: Vec::new(),
            buffers: vec![(a.buffer, false), (b.buffer, false), (out.buffer, true)],
            finish_blocks: Vec::new(),
        };
        if let Some(g) = gate {
            inputs.bindings.push((g.output.dtype(), Access::Read));
            inputs.buffers.push((g.output, false));
            inputs.slots.push(wgsl::gate_load_slot(g.activation));
        }
        if extras.ones_column {
            inputs.slots.push(wgsl::ones_column_slot());
        }
        if extras.fused.finishes() {
            let bias_at = bias.map(|(buffer, l)| {
                inputs.finish_blocks.push(l.clone());
                inputs.bind(buffer, Access::Read)
            });
            let sums_at = row_sums.map(|(buffer, l)| {
                // `[rows]` or `[1, rows]` (one matrix): its last axis.
                let r = l.rank();
                inputs.finish_blocks.push(Layout {
                    shape: vec![l.shape[r - 1]],
                    strides: vec![l.strides[r - 1]],
                    offset: l.offset,
                });
                inputs.bind(buffer, Access::Write)
            });
            let slot = wgsl::dot_epilogue_slot(bias_at, activation, sums_at);
            inputs.slots.push(slot);
        }
        inputs
    }

    /// Binds `buffer` next; its binding number.
    fn bind(&mut self, buffer: &'a WgpuBuffer, access: Access) -> usize {
        self.bindings.push((buffer.dtype(), access));
        self.buffers.push((buffer, access == Access::Write));
        self.bindings.len()
    }
}

impl WgpuBackend {
    /// The matrix product on the shader cores (f32 arithmetic): the dot-product kernel when
    /// `dot`, else the shared-memory kernel with `tile` ([`gemm_tile`]), doing the `extras`
    /// as it goes (beyond a gate, an epilogue only in the dot kernel; beta 0 with one). With
    /// a ones column, `om` has one column more than `bm`.
    pub(crate) fn matmul_f32<'a>(
        &'a self,
        [a, b, out]: [V<'a>; 3],
        [am, bm, om]: [&validate::MatrixView; 3],
        alpha: f32,
        beta: f32,
        (dot, tile): (bool, TileShape),
        extras: ProductExtras<'a>,
    ) -> Result<()> {
        let fallback_of = extras.fallback_of;
        let gate = extras.fused.gate;
        debug_assert!(
            fallback_of.is_none() || gate.is_none(),
            "a cooperative-matrix fallback reads no gate (both use scalars past 8)"
        );
        let finishes = extras.fused.finishes();
        debug_assert!(
            !finishes || (dot && beta == 0.0 && om.batch == 1),
            "only the dot kernel applies an epilogue, to one product with beta 0"
        );
        let batch = |mv: &validate::MatrixView| Layout {
            shape: vec![om.batch],
            strides: vec![mv.batch_stride()],
            offset: mv.offset,
        };
        let ProductInputs {
            bindings,
            slots,
            buffers,
            finish_blocks,
        } = ProductInputs::of([a, b, out], &extras);
        let with_slots = |mut spec: Spec| {
            for (name, text) in &slots {
                spec = spec.slot(name, text.clone());
            }
            spec
        };
        // Both kernels take the same parameters (gemm.wgsl) and slice k so that no thread
        // loops past CHUNK steps (lavapipe); later slices accumulate into `out`.
        let (pipeline, k_slice, groups) = if dot {
            // One dot product per output, 32 threads each, 8 outputs per workgroup;
            // subgroup shuffles combine the partial sums where the adapter has them.
            let file = if self.0.features.contains(wgpu::Features::SUBGROUP) {
                "gemm_dot_subgroups.wgsl"
            } else {
                "gemm_dot.wgsl"
            };
            let g = (om.batch * om.rows * om.cols).div_ceil(8);
            (
                self.kernel(&with_slots(Spec::new(file).bindings(bindings)))?,
                32 * CHUNK,
                self.row_groups(g),
            )
        } else {
            let (name, text) = tile.slot();
            let mut spec = with_slots(Spec::new("gemm.wgsl").bindings(bindings).slot(name, text));
            if fallback_of.is_some() {
                // GemmParams' verdict fields hold the verdict word and serial.
                let slot = |offset: usize| (offset / 4) as u32;
                let word = slot(std::mem::offset_of!(GemmParams, verdict_word));
                let serial = slot(std::mem::offset_of!(GemmParams, verdict_serial));
                spec = spec.slot("guard", guard_slot(4, [word, serial], true));
            }
            (
                self.kernel(&spec)?,
                8 * CHUNK,
                [
                    om.cols.div_ceil(tile.cols) as u32,
                    om.rows.div_ceil(tile.rows) as u32,
                    om.batch as u32,
                ],
            )
        };
        // k = 0 still runs once, to apply beta.
        let k = am.cols;
        let mut k0 = 0;
        loop {
            let k1 = (k0 + k_slice).min(k);
            let mut params = GemmParams::slice([am, bm, om], [k0, k1], alpha, beta);
            match (fallback_of, gate) {
                (Some(g), _) => (params.verdict_word, params.verdict_serial) = (g.word, g.serial),
                (None, Some(g)) => params.gate_shift = g.shift,
                (None, None) => {}
            }
            let mut p = Params::default()
                .block(&batch(am))
                .block(&batch(bm))
                .block(&batch(om))
                .typed(&params);
            for l in &finish_blocks {
                p = p.block(l);
            }
            let mut buffers = buffers.clone();
            if fallback_of.is_some() {
                buffers.push((&self.0.verdicts, false));
            }
            debug_assert!(
                !finishes || k1 >= k,
                "an epilogue applies once, to the whole sum"
            );
            self.dispatch_groups(&pipeline, &p, &buffers, groups)?;
            if k1 >= k {
                return Ok(());
            }
            k0 = k1;
        }
    }

    /// The product routed to a kernel ([`gemm_route`]): split k for long products over few
    /// tiles, the cooperative-matrix kernel where it applies (never with a gate), else the f32
    /// tile or dot-product kernel, doing what `fused` asks as it goes (more than a gate only
    /// where `matmul_epilogue` allows it). `om` is the product's own output, without a column
    /// for row sums.
    pub(crate) fn matmul_routed(
        &self,
        [a, b, out]: [V<'_>; 3],
        [am, bm, om]: [&validate::MatrixView; 3],
        alpha: f32,
        beta: f32,
        fused: Fused<'_>,
    ) -> Result<()> {
        let GemmRoute { tile, slices, dot } = gemm_route(am, bm, om, beta);
        // Long products over few tiles go to the split tile kernel even under
        // Precision::Fast: the cooperative-matrix kernel does not split k, and a small CNN's
        // weight gradients (k up to 200704) ran several times slower on it.
        if slices > 1 {
            return self.matmul_split_k([a, b, out], [am, bm, om], alpha, (slices, tile), fused);
        }
        let plain = fused.gate.is_none() && !fused.finishes();
        if plain && !dot && self.matmul_coop([a, b, out], [am, bm, om], alpha, beta)? {
            return Ok(());
        }
        // Row sums are the output's column past its last (the kernels' column of ones).
        let ones_column = fused.row_sums.is_some();
        let with_sums = validate::MatrixView {
            cols: om.cols + usize::from(ones_column),
            ..*om
        };
        let extras = ProductExtras {
            fused,
            ones_column,
            ..Default::default()
        };
        self.matmul_f32(
            [a, b, out],
            [am, bm, &with_sums],
            alpha,
            beta,
            (dot, tile),
            extras,
        )
    }

    /// A product of one `rows x cols` output over a long `k` as `slices` products over
    /// `k / slices` each (a batch, so the tile kernel runs `slices` times as many workgroups),
    /// written to a scratch `[slices, rows, cols]` and summed in slice order into `out`
    /// (beta 0; alpha applied to each slice), each slice's product in `tile`s. The same result
    /// on every run. With row sums the scratch has a column more (`b`'s column of ones), which
    /// the sum pass stores to the row sums; with an epilogue, the sum pass applies it.
    pub(crate) fn matmul_split_k(
        &self,
        [a, b, out]: [V<'_>; 3],
        [am, bm, om]: [&validate::MatrixView; 3],
        alpha: f32,
        (slices, tile): (usize, TileShape),
        fused: Fused<'_>,
    ) -> Result<()> {
        let ks = am.cols / slices;
        let (rows, cols) = (om.rows, om.cols);
        let partial_cols = cols + usize::from(fused.row_sums.is_some());
        let partial = self.scratch(DType::F32, slices * rows * partial_cols)?;
        // Slice s: A's columns and B's rows s ks .. (s + 1) ks.
        let a_slices = validate::MatrixView {
            batch: slices,
            cols: ks,
            strides: [ks as isize * am.strides[2], am.strides[1], am.strides[2]],
            ..*am
        };
        let b_slices = validate::MatrixView {
            batch: slices,
            rows: ks,
            strides: [ks as isize * bm.strides[1], bm.strides[1], bm.strides[2]],
            ..*bm
        };
        let partial_l = Layout::contiguous(&[slices, rows, partial_cols]);
        let p_slices = validate::MatrixView::of(&partial_l);
        // An output narrower than a quarter tile on a side (a convolution's 32 x 9 weight
        // gradient) would leave the tile kernel computing mostly padding: its slices are
        // dot products, where the k strides allow.
        let dot = rows.min(cols) <= SPLIT_DOT_THIN && unit_k_strides(am, bm);
        let extras = ProductExtras {
            fallback_of: None,
            fused: Fused {
                gate: fused.gate,
                ..Default::default()
            },
            ones_column: fused.row_sums.is_some(),
        };
        self.matmul_f32(
            [a, b, View::new(&partial, &partial_l)],
            [&a_slices, &b_slices, &p_slices],
            alpha,
            0.0,
            (dot, tile),
            extras,
        )?;
        // The sum pass: one thread an output element (gemm_sum.wgsl), with or without an
        // epilogue (faster than `reduce` over the slices' axis, the first form).
        self.split_sum(&partial, slices, out.buffer, om, fused)
    }

    /// [`Backend::matmul_epilogue`] as separate calls through f32 scratch buffers (the
    /// default's in-place calls would each copy their operand first here: an elementwise
    /// dispatch may not read and write one buffer). Validated by the caller. With beta, a
    /// gate or row sums, the default's calls.
    pub(crate) fn matmul_epilogue_unfused(
        &self,
        [a, b, out]: [V<'_>; 3],
        alpha: f32,
        beta: f32,
        epilogue: Epilogue<'_, WgpuBuffer>,
    ) -> Result<()> {
        // With beta the product reads `out`: the default's order of calls.
        if beta != 0.0
            || epilogue.is_empty()
            || epilogue.a_gate.is_some()
            || epilogue.a_row_sums.is_some()
        {
            return hal::matmul_epilogue_steps(self, [a, b, out], alpha, beta, epilogue);
        }
        let shape = Layout::contiguous(&out.layout.shape);
        let scratch = || self.scratch(DType::F32, shape.numel().max(1));
        let product = scratch()?;
        let product_view = View::new(&product, &shape);
        self.matmul(a, b, product_view, alpha, 0.0)?;
        match (epilogue.bias, epilogue.activation) {
            (Some(bias), None) => self.binary(BinaryOp::Add, product_view, bias, out),
            (Some(bias), Some(op)) => {
                let sum = scratch()?;
                let sum_view = View::new(&sum, &shape);
                self.binary(BinaryOp::Add, product_view, bias, sum_view)?;
                self.unary(op, sum_view, out)
            }
            (None, Some(op)) => self.unary(op, product_view, out),
            (None, None) => self.copy(product_view, out),
        }
    }

    /// The last pass of a split product (gemm_sum.wgsl): the slices of `partial` (`[slices,
    /// rows, cols]`, contiguous, a column more with row sums) summed in order into `out` and
    /// the row sums, any bias added and activation applied on the way to `out`.
    pub(crate) fn split_sum(
        &self,
        partial: &WgpuBuffer,
        slices: usize,
        out: &WgpuBuffer,
        om: &validate::MatrixView,
        fused: Fused<'_>,
    ) -> Result<()> {
        let (rows, cols) = (om.rows, om.cols);
        let partial_cols = cols + usize::from(fused.row_sums.is_some());
        let out_l = Layout {
            shape: vec![rows, cols],
            strides: vec![om.strides[1], om.strides[2]],
            offset: om.offset,
        };
        // Without a bias, binding 2 is the partials again and the epilogue reads nothing.
        let (bias, bias_l, add_bias) = match fused.bias {
            Some((buffer, layout)) => (buffer, layout, "ld2(off(1u, t))"),
            None => (partial, &out_l, "0.0"),
        };
        let mut p = Params::default().block(&out_l).block(bias_l);
        let expr = match fused.activation {
            Some(op) => {
                p = unary_params(p, op);
                wgsl::unary_expr(op)
            }
            None => "v",
        };
        let mut bindings = wgsl::io(&[DType::F32, bias.dtype()], out.dtype());
        let mut buffers = vec![(partial, false), (bias, false), (out, true)];
        let mut spec = Spec::new("gemm_sum.wgsl").slot(
            "epilogue",
            format!(
                "fn epilogue(sum: f32, t: u32) -> f32 {{\n    let v = sum + {add_bias};\n    return {expr};\n}}"
            ),
        );
        if let Some((sums, sums_l)) = fused.row_sums {
            bindings.push((sums.dtype(), Access::Write));
            buffers.push((sums, true));
            p = p.block(sums_l).scalar(4, partial_cols as u32);
            let (name, text) = wgsl::row_sums_slot();
            spec = spec.slot(name, text);
        }
        let p = p
            .scalar(2, (rows * partial_cols) as u32)
            .scalar(3, slices as u32);
        self.run(spec.bindings(bindings), p, &buffers, rows * partial_cols)
    }
}
