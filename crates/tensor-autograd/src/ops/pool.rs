//! Max and average pooling. Windows that tile the image (stride = kernel, no padding: the
//! usual 2x2 / stride 2) take a direct path of two IR kernels: the forward reads every window
//! once and writes its maximum and the position of its first maximum; the backward writes the
//! whole input gradient in one pass (a position gets its window's gradient where it won, else
//! 0). That replaces im2col, an arg-reduction, a gather, a scatter and col2im. Other windows
//! unfold into columns (im2col) and reduce them.

use crate::error::{Result, invalid};
use crate::tensor::Tensor;
use hal::ir::{Access, IrBinary, IrCmp, ProgramBuilder, Value};
use hal::{Backend, DType, Layout, Precision};

use super::Conv2dOptions;

/// The largest window the direct path unrolls into its kernels (larger ones take im2col).
const MAX_TILED_WINDOW: usize = 64;

impl<B: Backend> Tensor<B> {
    /// Pooling windows of every channel as columns `[N*C, kh*kw, oh*ow]`, padded with `pad`.
    fn pool_columns(
        &self,
        op: &'static str,
        kernel: (usize, usize),
        stride: (usize, usize),
        padding: (usize, usize),
        pad: f32,
    ) -> Result<(Self, [usize; 4])> {
        let options = Conv2dOptions {
            stride,
            padding: (0, 0),
            dilation: (1, 1),
            groups: 1,
            precision: Precision::Exact,
        };
        let s = self.geometry(op, kernel, &options)?;
        let planes = self.reshape(&[s.batch * s.channels, 1, s.height, s.width])?;
        let planes = if padding == (0, 0) {
            planes
        } else {
            planes.pad(
                &[
                    (0, 0),
                    (0, 0),
                    (padding.0, padding.0),
                    (padding.1, padding.1),
                ],
                pad,
            )?
        };
        let g = planes.geometry(op, kernel, &options)?;
        let (oh, ow) = g.output_size().ok_or_else(|| {
            invalid(
                op,
                format!("the window does not fit the padded input: {g:?}"),
            )
        })?;
        Ok((planes.im2col(g)?, [s.batch, s.channels, oh, ow]))
    }

    /// Max pooling over `kernel` windows (padding counts as -infinity).
    pub fn max_pool2d(
        &self,
        kernel: (usize, usize),
        stride: (usize, usize),
        padding: (usize, usize),
    ) -> Result<Self> {
        if let Some(pooled) = self.max_pool_tiled(kernel, stride, padding)? {
            return Ok(pooled);
        }
        let (cols, shape) =
            self.pool_columns("max_pool2d", kernel, stride, padding, f32::NEG_INFINITY)?;
        cols.max(1, false)?.reshape(&shape)
    }

    /// Average pooling over `kernel` windows (padding counts as zeros in the average, PyTorch's
    /// `count_include_pad=True`).
    pub fn avg_pool2d(
        &self,
        kernel: (usize, usize),
        stride: (usize, usize),
        padding: (usize, usize),
    ) -> Result<Self> {
        let (cols, shape) = self.pool_columns("avg_pool2d", kernel, stride, padding, 0.0)?;
        cols.mean(&[1], false)?.reshape(&shape)
    }

    /// Max pooling over windows that tile the image (see the module doc), or `None` where the
    /// direct path does not apply (overlapping or padded windows, negative strides, a window
    /// past [`MAX_TILED_WINDOW`], addresses past `u32`).
    fn max_pool_tiled(
        &self,
        kernel: (usize, usize),
        stride: (usize, usize),
        padding: (usize, usize),
    ) -> Result<Option<Self>> {
        if stride != kernel || padding != (0, 0) || self.rank() != 4 || !self.dtype().is_float() {
            return Ok(None);
        }
        let (kh, kw) = kernel;
        let s = self.shape();
        let (oh, ow) = (s[2] / kh.max(1), s[3] / kw.max(1));
        let out_shape = [s[0], s[1], oh, ow];
        if kh == 0
            || kw == 0
            || kh * kw > MAX_TILED_WINDOW
            || oh == 0
            || ow == 0
            || !fits_u32(self.layout())
            || hal::numel(s) >= u32::MAX as usize
        {
            return Ok(None);
        }
        let dtype = self.dtype();
        let program = tiled_max_program(dtype, self.layout(), kernel, out_shape)?;
        let backend = self.backend().clone();
        let kernel_fn = backend.compile(&program)?;
        let out = self.new_output(&out_shape, dtype)?;
        let arg = self.new_output(&out_shape, DType::U32)?;
        backend.launch(
            &kernel_fn,
            &[self.buffer(), out.buffer(), arg.buffer()],
            hal::numel(&out_shape),
        )?;
        let in_shape: [usize; 4] = [s[0], s[1], s[2], s[3]];
        // The input's gradient is stored in the input's own memory order (a convolution's
        // channel-major output stays so through ReLU and back; see `Tensor::new_output_like`).
        let grad_layout = self
            .dense_layout()
            .unwrap_or_else(|| Layout::contiguous(&in_shape));
        Ok(Some(Tensor::from_op(
            out,
            "max_pool2d",
            &[self],
            move |g| {
                let g = if fits_u32(g.layout()) {
                    g.clone()
                } else {
                    g.contiguous()?
                };
                let program =
                    tiled_max_backward_program(g.dtype(), g.layout(), kernel, &grad_layout)?;
                let kernel_fn = g.backend().compile(&program)?;
                let dx = Tensor::for_write_as(g.backend(), grad_layout.clone(), g.dtype())?;
                g.backend().launch(
                    &kernel_fn,
                    &[g.buffer(), arg.buffer(), dx.buffer()],
                    hal::numel(&in_shape),
                )?;
                Ok(vec![Some(dx)])
            },
        )))
    }
}

/// Whether every address of `layout` is a non-negative `u32` (the direct kernels index in
/// `u32` and step by the strides).
fn fits_u32(layout: &Layout) -> bool {
    let mut last = layout.offset as isize;
    for (&d, &st) in layout.shape.iter().zip(&layout.strides) {
        if st < 0 {
            return false;
        }
        last = last.saturating_add((d.saturating_sub(1) as isize).saturating_mul(st));
    }
    last < u32::MAX as isize
}

/// The coordinates of the row-major launch index `i` in `shape` (one value per dimension).
fn coordinates(b: &mut ProgramBuilder, i: Value, shape: &[usize]) -> Vec<Value> {
    let mut coords = vec![i; shape.len()];
    let mut rest = i;
    for d in (1..shape.len()).rev() {
        let size = b.const_u32(shape[d] as u32);
        coords[d] = b.binary(IrBinary::Rem, rest, size);
        rest = b.div(rest, size);
    }
    coords[0] = rest;
    coords
}

/// `offset + sum(coordinate * stride)` in `u32` (terms with stride 0 left out).
fn address(b: &mut ProgramBuilder, offset: usize, terms: &[(Value, usize)]) -> Value {
    let mut acc = b.const_u32(offset as u32);
    for &(c, stride) in terms {
        if stride != 0 {
            let s = b.const_u32(stride as u32);
            let t = b.mul(c, s);
            acc = b.add(acc, t);
        }
    }
    acc
}

/// The forward kernel, one launch index per output element of `out_shape` (`[N, C, oh, ow]`):
/// the window's maximum (NaN wins, as in PyTorch; ties keep the first) and its row-major
/// position in the window (`U32`).
fn tiled_max_program(
    dtype: DType,
    input: &Layout,
    (kh, kw): (usize, usize),
    out_shape: [usize; 4],
) -> Result<hal::ir::Program> {
    let st: Vec<usize> = input.strides.iter().map(|&s| s as usize).collect();
    let mut b = ProgramBuilder::new("max_pool_tiled");
    let x = b.buffer(dtype, Access::Read);
    let out = b.buffer(dtype, Access::Write);
    let arg = b.buffer(DType::U32, Access::Write);
    let i = b.index();
    let c = coordinates(&mut b, i, &out_shape);
    let base = address(
        &mut b,
        input.offset,
        &[
            (c[0], st[0]),
            (c[1], st[1]),
            (c[2], kh * st[2]),
            (c[3], kw * st[3]),
        ],
    );
    let mut best: Option<(Value, Value)> = None;
    for r in 0..kh {
        for q in 0..kw {
            let step = b.const_u32((r * st[2] + q * st[3]) as u32);
            let at = b.add(base, step);
            let v = b.load(x, at);
            let k = b.const_u32((r * kw + q) as u32);
            best = Some(match best {
                None => (v, k),
                Some((m, mk)) => {
                    let greater = b.cmp(IrCmp::Gt, v, m);
                    let nan = b.cmp(IrCmp::Ne, v, v);
                    let take = b.binary(IrBinary::Or, greater, nan);
                    (b.select(take, v, m), b.select(take, k, mk))
                }
            });
        }
    }
    let (m, mk) = best.expect("the window has at least one element");
    b.store(out, i, m);
    b.store(arg, i, mk);
    b.build().map_err(Into::into)
}

/// The backward kernel, one launch index per element of the input, stored through `dx` (a
/// dense layout of the input's shape): the window's gradient (read through `grad`'s layout) where this position holds the
/// window's recorded maximum, else 0; rows and columns past the last whole window get 0.
fn tiled_max_backward_program(
    dtype: DType,
    grad: &Layout,
    (kh, kw): (usize, usize),
    dx_layout: &Layout,
) -> Result<hal::ir::Program> {
    let in_shape = &dx_layout.shape;
    let ds: Vec<usize> = dx_layout.strides.iter().map(|&s| s as usize).collect();
    let gs: Vec<usize> = grad.strides.iter().map(|&s| s as usize).collect();
    let (oh, ow) = (grad.shape[2], grad.shape[3]);
    let mut b = ProgramBuilder::new("max_pool_tiled_backward");
    let g = b.buffer(dtype, Access::Read);
    let arg = b.buffer(DType::U32, Access::Read);
    let dx = b.buffer(dtype, Access::Write);
    let i = b.index();
    let c = coordinates(&mut b, i, in_shape);
    let (kh_v, kw_v) = (b.const_u32(kh as u32), b.const_u32(kw as u32));
    let (wy, wx) = (b.div(c[2], kh_v), b.div(c[3], kw_v));
    let (ry, rx) = (
        b.binary(IrBinary::Rem, c[2], kh_v),
        b.binary(IrBinary::Rem, c[3], kw_v),
    );
    let row = b.mul(ry, kw_v);
    let position = b.add(row, rx);
    let (oh_v, ow_v) = (b.const_u32(oh as u32), b.const_u32(ow as u32));
    let (in_y, in_x) = (b.cmp(IrCmp::Lt, wy, oh_v), b.cmp(IrCmp::Lt, wx, ow_v));
    let inside = b.binary(IrBinary::And, in_y, in_x);
    // Clamped so that the loads stay in bounds; `inside` discards what they read.
    let (last_y, last_x) = (b.const_u32(oh as u32 - 1), b.const_u32(ow as u32 - 1));
    let (wy, wx) = (
        b.binary(IrBinary::Min, wy, last_y),
        b.binary(IrBinary::Min, wx, last_x),
    );
    let window = address(
        &mut b,
        0,
        &[
            (c[0], in_shape[1] * oh * ow),
            (c[1], oh * ow),
            (wy, ow),
            (wx, 1),
        ],
    );
    let won_at = b.load(arg, window);
    let won = b.cmp(IrCmp::Eq, won_at, position);
    let take = b.binary(IrBinary::And, won, inside);
    let g_at = address(
        &mut b,
        grad.offset,
        &[(c[0], gs[0]), (c[1], gs[1]), (wy, gs[2]), (wx, gs[3])],
    );
    let gv = b.load(g, g_at);
    let ty = b.type_of(gv).unwrap_or(hal::ir::ScalarType::F32);
    let zero = b.const_float(ty, 0.0);
    let v = b.select(take, gv, zero);
    let at = address(
        &mut b,
        0,
        &[(c[0], ds[0]), (c[1], ds[1]), (c[2], ds[2]), (c[3], ds[3])],
    );
    b.store(dx, at, v);
    b.build().map_err(Into::into)
}

#[cfg(test)]
mod tests {
    use super::*;
    use backend_cpu::CpuBackend;

    /// Values that differ by at least 1/64 within any window, so that both paths pick the
    /// same winner; a permuted (non-contiguous) view of them.
    fn spaced_input(dev: &CpuBackend, shape: [usize; 4], seed: u64) -> Tensor<CpuBackend> {
        let n = hal::numel(&shape);
        let mut order: Vec<usize> = (0..n).collect();
        let mut state = seed | 1;
        for i in (1..n).rev() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            order.swap(i, (state % (i as u64 + 1)) as usize);
        }
        let values: Vec<f32> = order.iter().map(|&k| k as f32 / 64.0 - 3.0).collect();
        let [a, b, c, d] = shape;
        Tensor::from_slice(dev, &values, &[b, a, c, d])
            .unwrap()
            .permute(&[1, 0, 2, 3])
            .unwrap()
            .requires_grad()
    }

    #[test]
    fn direct_path_matches_the_columns_path() {
        let dev = CpuBackend::new();
        for (shape, kernel) in [
            ([3, 5, 9, 7], (2, 2)),
            ([2, 3, 8, 8], (2, 2)),
            ([2, 4, 7, 10], (3, 2)),
            ([1, 2, 5, 5], (1, 1)),
        ] {
            let x = spaced_input(&dev, shape, 7 + shape[3] as u64);
            let direct = x.max_pool_tiled(kernel, kernel, (0, 0)).unwrap().unwrap();
            let (cols, out_shape) = x
                .pool_columns("max_pool2d", kernel, kernel, (0, 0), f32::NEG_INFINITY)
                .unwrap();
            let by_columns = cols.max(1, false).unwrap().reshape(&out_shape).unwrap();
            assert_eq!(direct.shape(), by_columns.shape());
            assert_eq!(direct.to_vec().unwrap(), by_columns.to_vec().unwrap());

            let weights: Vec<f32> = (0..direct.numel()).map(|k| (k % 11) as f32 - 5.0).collect();
            let w = Tensor::from_slice(&dev, &weights, direct.shape()).unwrap();
            let grad_of = |y: &Tensor<CpuBackend>| {
                x.zero_grad();
                y.mul(&w).unwrap().sum_all().unwrap().backward().unwrap();
                x.grad().unwrap().to_vec().unwrap()
            };
            assert_eq!(
                grad_of(&direct),
                grad_of(&by_columns),
                "{shape:?} {kernel:?}"
            );
        }
    }

    #[test]
    fn a_nan_wins_its_window_and_takes_the_gradient() {
        let dev = CpuBackend::new();
        let mut values: Vec<f32> = (0..16).map(|k| k as f32).collect();
        values[4] = f32::NAN; // row 1, column 0: the top-left window
        let x = Tensor::from_slice(&dev, &values, &[1, 1, 4, 4])
            .unwrap()
            .requires_grad();
        let y = x.max_pool2d((2, 2), (2, 2), (0, 0)).unwrap();
        let out = y.to_vec().unwrap();
        assert!(out[0].is_nan());
        assert_eq!(&out[1..], &[7.0, 13.0, 15.0]);
        y.sum_all().unwrap().backward().unwrap();
        let g = x.grad().unwrap().to_vec().unwrap();
        let winners: Vec<usize> = (0..16).filter(|&k| g[k] == 1.0).collect();
        assert_eq!(winners, vec![4, 7, 13, 15]);
    }
}
