//! Batched matrix products and 2-D convolution by im2col + matmul (pooling is in `pool.rs`).
//! Transposes in the backward passes are views: the backends' matmul
//! takes any strides, so no operand is copied to be transposed.

use super::elementwise::{gradient_from_output, unary_backward};
use crate::error::{Result, invalid, shape_error};
use crate::tensor::Tensor;
use hal::{Backend, Conv2dGeometry, DType, Epilogue, Gate, Layout, Precision, UnaryOp, View};

/// Stride, padding, dilation and groups of a 2-D convolution (PyTorch's defaults: 1, 0, 1, 1),
/// and the precision policy of its matrix products.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dOptions {
    pub stride: (usize, usize),
    pub padding: (usize, usize),
    pub dilation: (usize, usize),
    pub groups: usize,
    /// The products' policy, forward and backward ([`hal::Precision`]). The default,
    /// [`Precision::Fast`], puts them on the device's matrix units where it has them (TF32 on
    /// CUDA, f16 cooperative matrices on wgpu; exact elsewhere), as PyTorch does by default
    /// for convolutions (`torch.backends.cudnn.allow_tf32 = True`; its plain matrix products
    /// stay f32, as `Tensor::matmul` does here). [`Precision::Exact`] keeps them f32.
    pub precision: Precision,
}

impl Default for Conv2dOptions {
    fn default() -> Self {
        Self {
            stride: (1, 1),
            padding: (0, 0),
            dilation: (1, 1),
            groups: 1,
            precision: Precision::Fast,
        }
    }
}

/// `a @ b` without history for rank-2 or rank-3 operands (a rank-2 operand against a rank-3
/// one, or a batch of 1, broadcasts with a zero batch stride), under `precision` where given
/// (else the handle's own policy).
fn product<B: Backend>(
    a: &Tensor<B>,
    b: &Tensor<B>,
    precision: Option<Precision>,
) -> Result<Tensor<B>> {
    let dev = match precision {
        Some(p) if p != a.backend().precision() => a.backend().with_precision(p),
        _ => a.backend().clone(),
    };
    let (ra, rb) = (a.rank(), b.rank());
    let (m, k) = (a.shape()[ra - 2], a.shape()[ra - 1]);
    let (k2, n) = (b.shape()[rb - 2], b.shape()[rb - 1]);
    if k != k2 {
        return Err(shape_error(
            "matmul",
            a.shape(),
            b.shape(),
            format!("inner dimensions {k} and {k2} differ"),
        ));
    }
    if ra == 2 && rb == 2 {
        let out = product_output(a, &[m, n], k)?;
        dev.matmul(a.view(), b.view(), out.view(), 1.0, 0.0)?;
        return Ok(out);
    }
    let batch_of = |t: &Tensor<B>| if t.rank() == 3 { t.shape()[0] } else { 1 };
    let (ba, bb) = (batch_of(a), batch_of(b));
    if ba != bb && ba != 1 && bb != 1 {
        return Err(shape_error(
            "matmul",
            a.shape(),
            b.shape(),
            format!("batch sizes {ba} and {bb} do not broadcast"),
        ));
    }
    let batch = ba.max(bb);
    let as3 = |t: &Tensor<B>, rows: usize, cols: usize| -> Result<Layout> {
        let l = if t.rank() == 2 {
            t.layout().unsqueeze(0)?
        } else {
            t.layout().clone()
        };
        Ok(l.broadcast_to(&[batch, rows, cols])?)
    };
    let (la, lb) = (as3(a, m, k)?, as3(b, k, n)?);
    let out = product_output(a, &[batch, m, n], k)?;
    dev.matmul(
        View::new(a.buffer(), &la),
        View::new(b.buffer(), &lb),
        out.view(),
        1.0,
        0.0,
    )?;
    Ok(out)
}

impl<B: Backend> Tensor<B> {
    /// The matrix product over the last two dimensions. Rank 2 and 3 operands combine with
    /// batch broadcasting; a rank-2 right operand multiplies any number of leading dimensions
    /// (`[.., k] @ [k, n]`); higher ranks need equal leading dimensions.
    /// Under [`crate::autocast`], f32 operands are cast to the autocast dtype and the result
    /// is stored in it.
    pub fn matmul(&self, other: &Tensor<B>) -> Result<Self> {
        if crate::autocast_dtype().is_some() {
            let (a, b) = (self.autocast_narrow()?, other.autocast_narrow()?);
            return crate::autocast::outside(|| a.matmul_under(&b, None));
        }
        self.matmul_under(other, None)
    }

    /// [`Tensor::matmul`] under `precision` (forward and backward) where given.
    fn matmul_under(&self, other: &Tensor<B>, precision: Option<Precision>) -> Result<Self> {
        let (ra, rb) = (self.rank(), other.rank());
        if ra < 2 || rb < 2 {
            return Err(shape_error(
                "matmul",
                self.shape(),
                other.shape(),
                "both operands need at least 2 dimensions (unsqueeze vectors)",
            ));
        }
        if rb == 2 && (ra > 3 || (ra == 3 && self.is_contiguous())) {
            let lead = &self.shape()[..ra - 1];
            let flat = self.reshape(&[lead.iter().product(), self.shape()[ra - 1]])?;
            let mut shape = lead.to_vec();
            shape.push(other.shape()[1]);
            return flat.matmul_under(other, precision)?.reshape(&shape);
        }
        if ra > 3 || rb > 3 {
            if ra != rb || self.shape()[..ra - 2] != other.shape()[..rb - 2] {
                return Err(shape_error(
                    "matmul",
                    self.shape(),
                    other.shape(),
                    "operands of rank above 3 need equal leading dimensions",
                ));
            }
            let lead = &self.shape()[..ra - 2];
            let batch: usize = lead.iter().product();
            let a = self.reshape(&[batch, self.shape()[ra - 2], self.shape()[ra - 1]])?;
            let b = other.reshape(&[batch, other.shape()[rb - 2], other.shape()[rb - 1]])?;
            let mut shape = lead.to_vec();
            shape.extend_from_slice(&[self.shape()[ra - 2], other.shape()[rb - 1]]);
            return a.matmul_under(&b, precision)?.reshape(&shape);
        }
        let out = product(self, other, precision)?;
        let (a, b) = (self.clone(), other.clone());
        Ok(Tensor::from_op(out, "matmul", &[self, other], move |g| {
            let needs = [a.requires_grad_flag(), b.requires_grad_flag()];
            Ok(matmul_gradients(&a, &b, g, precision, needs)?.into())
        }))
    }

    /// `x @ weight^T + bias`, PyTorch's `F.linear` (`weight: [out, in]`).
    pub fn linear(&self, weight: &Tensor<B>, bias: Option<&Tensor<B>>) -> Result<Self> {
        self.linear_activation(weight, bias, None)
    }

    /// `activation(x @ weight^T + bias)`: a Linear layer and the activation after it. For a
    /// matrix input, where the activation's derivative is a function of its output (ReLU,
    /// sigmoid, tanh, ...: see `gradient_from_output`), it is one call of the backend's
    /// [`hal::Backend::matmul_epilogue`], which may fuse the bias and the activation into the
    /// product's kernel (the wgpu backend does for products it splits over k, in the sum
    /// pass, and for small thin ones it runs whole: a training step's forward pass then
    /// launches one or two kernels a layer instead of four); the pre-activation values are
    /// never stored. Otherwise the same as the separate operations. Under
    /// [`crate::autocast`], as `matmul` (the bias is cast too).
    pub fn linear_activation(
        &self,
        weight: &Tensor<B>,
        bias: Option<&Tensor<B>>,
        activation: Option<UnaryOp>,
    ) -> Result<Self> {
        if let Some(dt) = crate::autocast_dtype() {
            let plain = |t: &Tensor<B>| matches!(t.dtype(), DType::F32 | DType::F16 | DType::BF16);
            if activation.is_none()
                && weight.rank() == 2
                && self.rank() >= 2
                && self.shape()[self.rank() - 1] == weight.shape()[1]
                && plain(self)
                && plain(weight)
                && bias.is_none_or(|b| plain(b) && b.shape() == [weight.shape()[0]])
            {
                return autocast_linear(self, weight, bias, dt);
            }
            let (x, w) = (self.autocast_narrow()?, weight.autocast_narrow()?);
            let b = bias.map(|b| b.autocast_narrow()).transpose()?;
            return crate::autocast::outside(|| x.linear_activation(&w, b.as_ref(), activation));
        }
        let fusable = self.rank() == 2
            && weight.rank() == 2
            && self.shape()[1] == weight.shape()[1]
            && self.dtype().is_float()
            // The backends' fused epilogues have no f64 form: f64 takes the separate calls.
            && self.dtype() != hal::DType::F64
            && weight.dtype() == self.dtype()
            && bias.is_none_or(|b| {
                b.rank() == 1 && b.shape()[0] == weight.shape()[0] && b.dtype() == self.dtype()
            })
            && activation.is_none_or(gradient_from_output);
        if !fusable {
            let y = self.matmul(&weight.t()?)?;
            let y = match bias {
                Some(b) => y.add(b)?,
                None => y,
            };
            return match activation {
                Some(op) => y.unary(op),
                None => Ok(y),
            };
        }
        let (m, k, n) = (self.shape()[0], self.shape()[1], weight.shape()[0]);
        let wt = weight.t()?;
        let out = product_output(self, &[m, n], k)?;
        self.backend().matmul_epilogue(
            self.view(),
            wt.view(),
            out.view(),
            1.0,
            0.0,
            Epilogue {
                bias: bias.map(|b| b.view()),
                activation,
                ..Default::default()
            },
        )?;
        let (x, w, b) = (self.clone(), weight.clone(), bias.cloned());
        let y = out.detach();
        // Where the backend gates an operand as its product reads it, the backward pass
        // makes no gradient at the product: see `fused_linear_gradients`.
        let gated_backward = self.backend().capabilities().fused_gradient_products
            && activation.is_none_or(|op| Gate::<B::Buffer>::ACTIVATIONS.contains(&op));
        let mut inputs = vec![self, weight];
        inputs.extend(bias);
        Ok(Tensor::from_op(out, "linear", &inputs, move |g| {
            if gated_backward && w.requires_grad_flag() {
                let needs = [x.requires_grad_flag(), w.requires_grad_flag()];
                let bias_needs = b.as_ref().map(|b| b.requires_grad_flag());
                return fused_linear_gradients(&x, &w, (&y, activation), g, needs, bias_needs);
            }
            // The gradient at the product: through the activation (from its output), then as
            // a product's and a broadcast add's.
            let dz = match activation {
                Some(op) => unary_backward(op, &y, &y, g)?,
                None => g.clone(),
            };
            let needs = [x.requires_grad_flag(), w.requires_grad_flag()];
            let [gx, gwt] = matmul_gradients(&x, &w.detach().t()?, &dz, None, needs)?;
            let mut grads = vec![gx, gwt.map(|t| t.t()).transpose()?];
            if let Some(b) = &b {
                grads.push(match b.requires_grad_flag() {
                    true => Some(dz.sum_to(b.shape())?),
                    false => None,
                });
            }
            Ok(grads)
        }))
    }

    /// NCHW patches unfolded into columns `[N, C*kh*kw, oh*ow]` (the backend's `im2col`); the
    /// backward folds them back with `col2im`.
    pub fn im2col(&self, geometry: Conv2dGeometry) -> Result<Self> {
        let cols = cols_shape(&geometry)?;
        let out = self.new_output(&cols, self.dtype())?;
        self.backend().im2col(self.view(), &geometry, out.view())?;
        Ok(Tensor::from_op(out, "im2col", &[self], move |g| {
            let img = g.new_output(&geometry.image_shape(), g.dtype())?;
            g.backend().col2im(g.view(), &geometry, img.view())?;
            Ok(vec![Some(img)])
        }))
    }

    /// The columns of [`Tensor::im2col`] stored channel-major, as one `[C*kh*kw, N*oh*ow]`
    /// matrix (the backend's `im2col` writing through a permuted view): a convolution of the
    /// whole batch is then one matrix product, and so is its weight gradient, where the
    /// `[N, C*kh*kw, oh*ow]` columns need a product per image and a sum over the batch.
    fn im2col_matrix(&self, geometry: Conv2dGeometry) -> Result<Self> {
        let [n, k, l] = cols_shape(&geometry)?;
        // The `[N, C*kh*kw, oh*ow]` view of a `[C*kh*kw, N, oh*ow]` matrix at `offset`.
        let as_cols = move |offset: usize| Layout {
            shape: vec![n, k, l],
            strides: vec![l as isize, (n * l) as isize, 1],
            offset,
        };
        let out = self.new_output(&[k, n * l], self.dtype())?;
        self.backend()
            .im2col(self.view(), &geometry, View::new(out.buffer(), &as_cols(0)))?;
        Ok(Tensor::from_op(out, "im2col", &[self], move |g| {
            let g = g.contiguous()?;
            let img = g.new_output(&geometry.image_shape(), g.dtype())?;
            let cols = as_cols(g.layout().offset);
            g.backend()
                .col2im(View::new(g.buffer(), &cols), &geometry, img.view())?;
            Ok(vec![Some(img)])
        }))
    }

    pub(super) fn geometry(
        &self,
        op: &'static str,
        kernel: (usize, usize),
        o: &Conv2dOptions,
    ) -> Result<Conv2dGeometry> {
        if self.rank() != 4 {
            return Err(invalid(
                op,
                format!("needs an NCHW input, got shape {:?}", self.shape()),
            ));
        }
        let s = self.shape();
        Ok(Conv2dGeometry {
            batch: s[0],
            channels: s[1],
            height: s[2],
            width: s[3],
            kernel,
            stride: o.stride,
            padding: o.padding,
            dilation: o.dilation,
        })
    }

    /// 2-D convolution (cross-correlation, as PyTorch) of NCHW `self` with
    /// `weight: [out, in / groups, kh, kw]`, plus `bias: [out]`. Under [`crate::autocast`],
    /// as `matmul`.
    pub fn conv2d(
        &self,
        weight: &Tensor<B>,
        bias: Option<&Tensor<B>>,
        options: Conv2dOptions,
    ) -> Result<Self> {
        if crate::autocast_dtype().is_some() {
            let (x, w) = (self.autocast_narrow()?, weight.autocast_narrow()?);
            let b = bias.map(|b| b.autocast_narrow()).transpose()?;
            return crate::autocast::outside(|| x.conv2d(&w, b.as_ref(), options));
        }
        if weight.rank() != 4 {
            return Err(invalid(
                "conv2d",
                format!(
                    "weight must be [out, in/groups, kh, kw], got {:?}",
                    weight.shape()
                ),
            ));
        }
        let groups = options.groups;
        let (o, cg, kh, kw) = (
            weight.shape()[0],
            weight.shape()[1],
            weight.shape()[2],
            weight.shape()[3],
        );
        let geometry = self.geometry("conv2d", (kh, kw), &options)?;
        if groups == 0 || geometry.channels != cg * groups || o % groups != 0 {
            return Err(shape_error(
                "conv2d",
                self.shape(),
                weight.shape(),
                format!(
                    "input channels must be weight.shape[1] * groups ({groups}) and output channels divisible by groups"
                ),
            ));
        }
        let (oh, ow) = geometry.output_size().ok_or_else(|| {
            invalid(
                "conv2d",
                format!("the kernel does not fit the padded input: {geometry:?}"),
            )
        })?;
        // [C*kh*kw, N*oh*ow]: one product for the whole batch gives [O, N*oh*ow].
        let cols = self.im2col_matrix(geometry)?;
        let per_group = cg * kh * kw;
        let og = o / groups;
        let y = if groups == 1 {
            weight
                .reshape(&[o, per_group])?
                .matmul_under(&cols, Some(options.precision))?
        } else {
            let w = weight.reshape(&[o, per_group])?;
            let parts = (0..groups)
                .map(|g| {
                    w.narrow(0, g * og, og)?.matmul_under(
                        &cols.narrow(0, g * per_group, per_group)?,
                        Some(options.precision),
                    )
                })
                .collect::<Result<Vec<_>>>()?;
            Tensor::cat(&parts.iter().collect::<Vec<_>>(), 0)?
        };
        // NCHW as a view of the channel-major result.
        let y = y
            .reshape(&[o, geometry.batch, oh, ow])?
            .permute(&[1, 0, 2, 3])?;
        match bias {
            Some(b) => y.add(&b.reshape(&[1, o, 1, 1])?),
            None => Ok(y),
        }
    }
}

/// The gradients of `y = activation(x @ w^T + b)` from the gradient `g` at `y`, in two
/// products that read `g` through the activation's derivative ([`hal::Gate`]): the input
/// gradient `g' @ w` and the weight gradient `g'^T @ x`, whose product also sums the rows of
/// `g'^T`, the bias gradient ([`hal::Epilogue::a_row_sums`]). `g' = g * activation'(y)` is
/// never stored, so a backend that fuses both (wgpu, for products it splits over k or runs
/// whole as dot products) spends no launch on the activation's derivative or the bias
/// gradient. `x` and `w` are matrices
/// (`linear_activation` checked); `bias_needs` is `None` without a bias.
fn fused_linear_gradients<B: Backend>(
    x: &Tensor<B>,
    w: &Tensor<B>,
    (y, activation): (&Tensor<B>, Option<UnaryOp>),
    g: &Tensor<B>,
    [needs_x, needs_w]: [bool; 2],
    bias_needs: Option<bool>,
) -> Result<Vec<Option<Tensor<B>>>> {
    let backend = g.backend();
    let (m, n, k) = (x.shape()[0], w.shape()[0], x.shape()[1]);
    fn gate_on<Buf>(activation: Option<UnaryOp>, output: View<'_, Buf>) -> Option<Gate<'_, Buf>> {
        activation.map(|activation| Gate { activation, output })
    }
    let gx = match needs_x {
        true => {
            let gx = product_output(g, &[m, k], n)?;
            let epilogue = Epilogue {
                a_gate: gate_on(activation, y.view()),
                ..Default::default()
            };
            backend.matmul_epilogue(g.view(), w.view(), gx.view(), 1.0, 0.0, epilogue)?;
            Some(gx)
        }
        false => None,
    };
    let gw = match needs_w {
        true => Some(product_output(g, &[n, k], m)?),
        false => None,
    };
    let gb = match bias_needs {
        Some(true) => Some(g.new_output(&[n], g.dtype())?),
        _ => None,
    };
    if let Some(gw) = &gw {
        let (gt, yt) = (g.t()?, y.t()?);
        let epilogue = Epilogue {
            a_gate: gate_on(activation, yt.view()),
            a_row_sums: gb.as_ref().map(|t| t.view()),
            ..Default::default()
        };
        backend.matmul_epilogue(gt.view(), x.view(), gw.view(), 1.0, 0.0, epilogue)?;
    }
    let mut grads = vec![gx, gw];
    if bias_needs.is_some() {
        grads.push(gb);
    }
    Ok(grads)
}

/// `x @ weight^T + bias` under autocast to `dt` (`x: [.., k]`, `weight: [n, k]`, all of f32,
/// f16 or bf16): the product of `x` and `weight` cast to `dt`, stored in `dt`, as the casts
/// then `linear` compute it, but one node whose backward pass writes each gradient in its own
/// tensor's dtype straight from the narrow products (accumulated in f32, rounded once): the
/// f32 master weight's gradient is never rounded to `dt`, and no cast launches.
fn autocast_linear<B: Backend>(
    x: &Tensor<B>,
    weight: &Tensor<B>,
    bias: Option<&Tensor<B>>,
    dt: DType,
) -> Result<Tensor<B>> {
    let (n, k) = (weight.shape()[0], weight.shape()[1]);
    let lead = x.shape()[..x.rank() - 1].to_vec();
    let m: usize = lead.iter().product();
    let (x16, w16, b16) = crate::no_grad(|| -> Result<_> {
        let x2 = x.detach().reshape(&[m, k])?;
        Ok((
            x2.to_dtype(dt)?,
            weight.detach().to_dtype(dt)?,
            bias.map(|b| b.detach().to_dtype(dt)).transpose()?,
        ))
    })?;
    let y = crate::autocast::outside(|| crate::no_grad(|| x16.linear(&w16, b16.as_ref())))?;
    let mut shape = lead;
    shape.push(n);
    let y = y.reshape(&shape)?;
    let (x_dtype, w_dtype, b_dtype) = (x.dtype(), weight.dtype(), bias.map(|b| b.dtype()));
    let x_shape = x.shape().to_vec();
    let needs = [
        x.requires_grad_flag(),
        weight.requires_grad_flag(),
        bias.is_some_and(|b| b.requires_grad_flag()),
    ];
    let mut inputs = vec![x, weight];
    inputs.extend(bias);
    Ok(Tensor::from_op(y, "linear", &inputs, move |g| {
        let be = g.backend();
        let g = g.to_dtype(dt)?.reshape(&[m, n])?;
        let gx = match needs[0] {
            true => {
                let gx = product_output_as(&g, &[m, k], n, x_dtype)?;
                be.matmul(g.view(), w16.view(), gx.view(), 1.0, 0.0)?;
                Some(gx.reshape(&x_shape)?)
            }
            false => None,
        };
        let gw = match needs[1] {
            true => {
                let gw = product_output_as(&g, &[n, k], m, w_dtype)?;
                be.matmul(g.t()?.view(), x16.view(), gw.view(), 1.0, 0.0)?;
                Some(gw)
            }
            false => None,
        };
        let mut grads = vec![gx, gw];
        if let Some(b_dtype) = b_dtype {
            grads.push(match needs[2] {
                true => Some(g.to_dtype(b_dtype)?.sum(&[0], false)?),
                false => None,
            });
        }
        Ok(grads)
    }))
}

/// The gradients of `a @ b` (rank 2 or 3, batch-broadcast) for the operands `needs` marks,
/// each in its operand's shape.
fn matmul_gradients<B: Backend>(
    a: &Tensor<B>,
    b: &Tensor<B>,
    g: &Tensor<B>,
    precision: Option<Precision>,
    needs: [bool; 2],
) -> Result<[Option<Tensor<B>>; 2]> {
    let ga = if needs[0] {
        Some(product(g, &b.transpose(-1, -2)?.detach(), precision)?.sum_to(a.shape())?)
    } else {
        None
    };
    let gb = if !needs[1] {
        None
    } else if a.rank() == 2 && b.rank() == 2 && b.t()?.is_dense() {
        // `b` is a transposed dense matrix (a Linear layer's weight): its gradient is made in
        // the weight's own layout, `(g^T a)^T`, so that the weight's gradient arrives dense
        // and the optimiser need not copy it.
        Some(product(&g.t()?, &a.detach(), precision)?.t()?)
    } else {
        Some(product(&a.transpose(-1, -2)?.detach(), g, precision)?.sum_to(b.shape())?)
    };
    Ok([ga, gb])
}

/// The columns shape `[N, C*kh*kw, oh*ow]` of `geometry`, or the error of a kernel that does
/// not fit the padded input.
pub(super) fn cols_shape(geometry: &Conv2dGeometry) -> Result<[usize; 3]> {
    geometry.cols_shape().ok_or_else(|| {
        invalid(
            "im2col",
            format!("the kernel does not fit the padded input: {geometry:?}"),
        )
    })
}

/// The result of a product with inner dimension `k`: written whole by `matmul` (beta 0), so
/// not zero-filled first, except when `k = 0` (an empty sum: zeros, which a backend may or may
/// not store).
fn product_output<B: Backend>(a: &Tensor<B>, shape: &[usize], k: usize) -> Result<Tensor<B>> {
    product_output_as(a, shape, k, a.dtype())
}

/// [`product_output`] in `dtype`.
fn product_output_as<B: Backend>(
    a: &Tensor<B>,
    shape: &[usize],
    k: usize,
    dtype: DType,
) -> Result<Tensor<B>> {
    if k == 0 {
        a.new_zeros(shape, dtype)
    } else {
        a.new_output(shape, dtype)
    }
}
