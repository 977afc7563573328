//! Loss functions, each a mean over the batch, composed from differentiable operations.

use crate::error::{Result, invalid, shape_error};
use crate::tensor::Tensor;
use hal::ir::{Access, IrBinary, IrCmp, IrUnary, ProgramBuilder};
use hal::{Backend, DType};

/// The most classes [`Tensor::cross_entropy`] fuses (its kernels unroll over a row's classes).
pub(crate) const FUSED_CLASSES: usize = 32;

impl<B: Backend> Tensor<B> {
    /// Mean squared error `mean((self - target)^2)`; the shapes must be equal.
    pub fn mse_loss(&self, target: &Tensor<B>) -> Result<Self> {
        if crate::autocast::widens(self) || crate::autocast::widens(target) {
            return self.autocast_wide()?.mse_loss(&target.autocast_wide()?);
        }
        if self.shape() != target.shape() {
            return Err(shape_error(
                "mse_loss",
                self.shape(),
                target.shape(),
                "prediction and target must have one shape",
            ));
        }
        self.sub(target)?.square()?.mean_all()
    }

    /// Negative log-likelihood of class `target[i]` (`u32` or `i32`, shape `[N]`) under
    /// log-probabilities `self: [N, C]`, averaged over the batch.
    pub fn nll_loss(&self, target: &Tensor<B>) -> Result<Self> {
        if crate::autocast::widens(self) {
            return self.autocast_wide()?.nll_loss(target);
        }
        if self.rank() != 2 || target.rank() != 1 || target.shape()[0] != self.shape()[0] {
            return Err(shape_error(
                "nll_loss",
                self.shape(),
                target.shape(),
                "expects log-probabilities [N, C] and class indices [N]",
            ));
        }
        if target.dtype().is_float() {
            return Err(invalid(
                "nll_loss",
                format!("class indices must be u32 or i32, got {}", target.dtype()),
            ));
        }
        let picked = self.gather(1, &target.reshape(&[target.numel(), 1])?)?;
        picked.mean_all()?.neg()
    }

    /// Cross-entropy of logits `self: [N, C]` against class indices `target: [N]`:
    /// `nll_loss(log_softmax(self))`. For f32 logits of at most 32 classes it
    /// runs as two IR kernels forward (each row's log-sum-exp and loss in one thread, then
    /// their mean) and one backward (`(softmax - onehot) g / N` per element), instead of the
    /// dozen or so launches of the composition each way. With more classes (a language
    /// model's vocabulary) the forward pass is the composition's arithmetic over the rows
    /// (max, shifted exp in one kernel, sum, log) and the backward one kernel: the `[N, C]`
    /// logits are read four times and written twice, not the composition's dozen times.
    /// That path also takes 16-bit logits as they are (no widened copy; the sums in f32, the
    /// loss f32, the logits' gradient in their dtype), which is how it runs under
    /// [`crate::autocast`].
    pub fn cross_entropy(&self, target: &Tensor<B>) -> Result<Self> {
        if self.rank() != 2 {
            return Err(shape_error(
                "cross_entropy",
                self.shape(),
                target.shape(),
                "expects logits [N, C] and class indices [N]",
            ));
        }
        let (n, c) = (self.shape()[0], self.shape()[1]);
        let fits = target.rank() == 1 && target.shape()[0] == n;
        if fits
            && self.dtype() == DType::F32
            && matches!(target.dtype(), DType::U32 | DType::I32)
            && (1..=FUSED_CLASSES).contains(&c)
            && n > 0
            && n * c < u32::MAX as usize
        {
            return fused_cross_entropy(self, target);
        }
        if fits
            && matches!(self.dtype(), DType::F32 | DType::BF16 | DType::F16)
            && matches!(target.dtype(), DType::U32 | DType::I32)
            && n > 0
            && n * c < u32::MAX as usize
        {
            return wide_cross_entropy(self, target);
        }
        self.autocast_wide()?.log_softmax(1)?.nll_loss(target)
    }

    /// Binary cross-entropy of logits against targets in `[0, 1]` of the same shape, in the
    /// stable form `max(x, 0) - x y + log(1 + exp(-|x|))`, averaged. Its gradient is the
    /// exact one, `(sigmoid(x) - y) / n` for the logits and `-x / n` for the targets, also at
    /// `x = 0` (where the stable form's pieces have no derivative).
    pub fn bce_with_logits(&self, target: &Tensor<B>) -> Result<Self> {
        if crate::autocast::widens(self) || crate::autocast::widens(target) {
            return self
                .autocast_wide()?
                .bce_with_logits(&target.autocast_wide()?);
        }
        if self.shape() != target.shape() {
            return Err(shape_error(
                "bce_with_logits",
                self.shape(),
                target.shape(),
                "logits and targets must have one shape",
            ));
        }
        let target = target.to_dtype(if self.dtype() == DType::U32 {
            DType::F32
        } else {
            self.dtype()
        })?;
        let (x, y) = (self.detach(), target.detach());
        let loss = crate::no_grad(|| {
            let softplus = x.abs()?.neg()?.exp()?.add_scalar(1.0)?.log()?;
            x.relu()?.sub(&x.mul(&y)?)?.add(&softplus)?.mean_all()
        })?;
        let count = self.numel().max(1) as f32;
        Ok(Tensor::from_op(
            loss,
            "bce_with_logits",
            &[self, &target],
            move |g| {
                let scale = g.mul_scalar(1.0 / count)?;
                let logits = x.sigmoid()?.sub(&y)?.mul(&scale)?;
                let targets = x.neg()?.mul(&scale)?;
                Ok(vec![Some(logits), Some(targets)])
            },
        ))
    }
}

/// [`Tensor::cross_entropy`] in fused kernels: f32 `logits [N, C]` (`C <= FUSED_CLASSES`) and
/// u32/i32 `target [N]` (checked by the caller).
fn fused_cross_entropy<B: Backend>(logits: &Tensor<B>, target: &Tensor<B>) -> Result<Tensor<B>> {
    let (n, c) = (logits.shape()[0], logits.shape()[1]);
    let b = logits.backend().clone();
    let x = logits.materialize(&[n, c])?.detach();
    let labels = target.materialize(&[n])?.detach();
    // A label outside 0..C must be an error, not a read of the next row: each row also loads
    // `classes[label]`, a C-element buffer, so a bad label faults naming itself and C. Only
    // the bounds check matters, not what the buffer holds, so it is not zero-filled (on a GPU
    // a recorded step would otherwise clear it on every replay).
    let classes = b.alloc_for_write(DType::F32, c)?;
    // Both written row by row by the kernel below.
    let lse = Tensor::for_write(&b, &[n], DType::F32)?;
    let per_row = Tensor::for_write(&b, &[n], DType::F32)?;
    // Where a backward pass may follow, the rows kernel also writes the gradient for a seed
    // of 1 (a training step's loss): that backward pass then launches nothing here.
    let unit_gradient = match crate::is_grad_enabled() && logits.requires_grad_flag() {
        true => Some(Tensor::for_write(&b, &[n, c], DType::F32)?),
        false => None,
    };
    let rows = b.compile(&rows_program(
        n,
        c,
        target.dtype(),
        unit_gradient.is_some(),
    )?)?;
    let mut buffers = vec![
        x.buffer(),
        labels.buffer(),
        &classes,
        lse.buffer(),
        per_row.buffer(),
    ];
    buffers.extend(unit_gradient.as_ref().map(|t| t.buffer()));
    b.launch(&rows, &buffers, n)?;
    let loss = crate::no_grad(|| per_row.mean_all())?;
    let label_dtype = target.dtype();
    // Handed out once: a second backward pass over the same graph computes its own.
    let unit_gradient = std::sync::Mutex::new(unit_gradient);
    Ok(Tensor::from_op(
        loss,
        "cross_entropy",
        &[logits],
        move |g| {
            if crate::autograd::is_unit_seed(g) {
                let made = unit_gradient.lock().map(|mut t| t.take());
                if let Ok(Some(gradient)) = made {
                    return Ok(vec![Some(gradient)]);
                }
            }
            Ok(vec![Some(gradient(
                &b,
                [&x, &labels, &lse],
                g,
                label_dtype,
            )?)])
        },
    ))
}

/// [`Tensor::cross_entropy`] for f32 or 16-bit `logits [N, C]` with more classes than one
/// thread keeps (checked by the caller): `lse` by the backend's LogSumExp reduction (shifted
/// by the row's largest finite logit), the loss `mean(lse - x[label])`, the gradient
/// [`gradient_program`]'s.
fn wide_cross_entropy<B: Backend>(logits: &Tensor<B>, target: &Tensor<B>) -> Result<Tensor<B>> {
    let (n, c) = (logits.shape()[0], logits.shape()[1]);
    let b = logits.backend().clone();
    let x = logits.materialize(&[n, c])?.detach();
    let labels = target.materialize(&[n])?.detach();
    let (loss, lse) = crate::no_grad(|| -> Result<(Tensor<B>, Tensor<B>)> {
        // One pass over the logits (hal's LogSumExp reduction), into f32; not through
        // `Tensor::logsumexp`, which under autocast first widens 16-bit logits into a copy.
        let lse = Tensor::for_write(&b, &[n, 1], DType::F32)?;
        b.reduce(hal::ReduceOp::LogSumExp, x.view(), &[1], lse.view())?;
        let lse = lse.reshape(&[n])?;
        // gather checks every label against C (an error names the bad one).
        let picked = x.gather(1, &labels.reshape(&[n, 1])?)?.reshape(&[n])?;
        Ok((lse.sub(&picked)?.mean_all()?, lse))
    })?;
    let label_dtype = target.dtype();
    Ok(Tensor::from_op(
        loss,
        "cross_entropy",
        &[logits],
        move |g| {
            Ok(vec![Some(gradient(
                &b,
                [&x, &labels, &lse],
                g,
                label_dtype,
            )?)])
        },
    ))
}

/// The cross-entropy gradient `(softmax - onehot) g / N` over logits `x [N, C]` from the
/// rows' log-sum-exps ([`gradient_program`], one launch), in the logits' dtype.
fn gradient<B: Backend>(
    b: &B,
    [x, labels, lse]: [&Tensor<B>; 3],
    g: &Tensor<B>,
    label_dtype: DType,
) -> Result<Tensor<B>> {
    let (n, c) = (x.shape()[0], x.shape()[1]);
    let g = g.materialize(&[])?.to_dtype(DType::F32)?;
    let grad = Tensor::for_write(b, &[n, c], x.dtype())?;
    let kernel = b.compile(&gradient_program(n, c, [x.dtype(), label_dtype])?)?;
    b.launch(
        &kernel,
        &[
            x.buffer(),
            labels.buffer(),
            lse.buffer(),
            g.buffer(),
            grad.buffer(),
        ],
        n * c,
    )?;
    Ok(grad)
}

/// Loads label `i` as u32 (an i32 label below zero becomes a huge index, which the range
/// check reports).
fn load_label(
    p: &mut ProgramBuilder,
    labels: hal::ir::BufferId,
    i: hal::ir::Value,
    dtype: DType,
) -> hal::ir::Value {
    let label = p.load(labels, i);
    match dtype {
        DType::I32 => p.cast(hal::ir::ScalarType::U32, label),
        _ => label,
    }
}

/// One thread per row `i` of `x [N, C]`: `lse[i] = max + ln(sum exp(x - max))` and
/// `loss[i] = lse[i] - x[i, label[i]]`. Buffers `[x, labels, classes, lse, loss]`, and with
/// `with_gradient` a sixth, `[N, C]`: the gradient for a seed of 1, as [`gradient_program`]
/// computes it for `g = 1`.
fn rows_program(
    n: usize,
    c: usize,
    label_dtype: DType,
    with_gradient: bool,
) -> Result<hal::ir::Program> {
    let mut p = ProgramBuilder::new(match with_gradient {
        true => "cross_entropy_rows_gradient",
        false => "cross_entropy_rows",
    });
    let x = p.buffer(DType::F32, Access::Read);
    let labels = p.buffer(label_dtype, Access::Read);
    let classes = p.buffer(DType::F32, Access::Read);
    let lse_out = p.buffer(DType::F32, Access::Write);
    let loss_out = p.buffer(DType::F32, Access::Write);
    let gradient_out = with_gradient.then(|| p.buffer(DType::F32, Access::Write));
    let i = p.index();
    let cc = p.const_u32(c as u32);
    let base = p.mul(i, cc);
    let values: Vec<hal::ir::Value> = (0..c)
        .map(|k| {
            let k = p.const_u32(k as u32);
            let at = p.add(base, k);
            p.load(x, at)
        })
        .collect();
    let mut max = values[0];
    for &v in &values[1..] {
        max = p.binary(IrBinary::Max, max, v);
    }
    let mut sum = p.const_f32(0.0);
    for &v in &values {
        let shifted = p.sub(v, max);
        let e = p.unary(IrUnary::Exp, shifted);
        sum = p.add(sum, e);
    }
    let log_sum = p.unary(IrUnary::Log, sum);
    let lse = p.add(max, log_sum);
    let label = load_label(&mut p, labels, i, label_dtype);
    // Faults for a label outside 0..C (an IR load out of range is an error on every backend,
    // whether or not its value is used; the value, unspecified, is not).
    p.load(classes, label);
    let last = p.const_u32(c as u32 - 1);
    let safe = p.binary(IrBinary::Min, label, last);
    let at = p.add(base, safe);
    let picked = p.load(x, at);
    let loss = p.sub(lse, picked);
    p.store(lse_out, i, lse);
    p.store(loss_out, i, loss);
    if let Some(gradient_out) = gradient_out {
        // gradient_program's formula with g = 1 (g / N is then 1 / N exactly): the same bits.
        let scale = p.const_f32(1.0 / n as f32);
        for (k, &v) in values.iter().enumerate() {
            let kc = p.const_u32(k as u32);
            let out = gradient_element(&mut p, [v, lse], kc, label, scale);
            let at = p.add(base, kc);
            p.store(gradient_out, at, out);
        }
    }
    Ok(p.build()?)
}

/// `(exp(x - lse) - [k == label]) * scale`: one element of the cross-entropy gradient.
fn gradient_element(
    p: &mut ProgramBuilder,
    [x, lse]: [hal::ir::Value; 2],
    k: hal::ir::Value,
    label: hal::ir::Value,
    scale: hal::ir::Value,
) -> hal::ir::Value {
    let shifted = p.sub(x, lse);
    let softmax = p.unary(IrUnary::Exp, shifted);
    let hit = p.cmp(IrCmp::Eq, k, label);
    let (one, zero) = (p.const_f32(1.0), p.const_f32(0.0));
    let onehot = p.select(hit, one, zero);
    let diff = p.sub(softmax, onehot);
    p.mul(diff, scale)
}

/// One thread per element `(i, k)` of the logits: `(exp(x - lse[i]) - [k == label[i]]) *
/// g / N`. Buffers `[x, labels, lse, g, grad]`, `x` and `grad` of `x_dtype`.
fn gradient_program(
    n: usize,
    c: usize,
    [x_dtype, label_dtype]: [DType; 2],
) -> Result<hal::ir::Program> {
    let mut p = ProgramBuilder::new("cross_entropy_gradient");
    let x = p.buffer(x_dtype, Access::Read);
    let labels = p.buffer(label_dtype, Access::Read);
    let lse = p.buffer(DType::F32, Access::Read);
    let g = p.buffer(DType::F32, Access::Read);
    let grad = p.buffer(x_dtype, Access::Write);
    let t = p.index();
    let cc = p.const_u32(c as u32);
    let i = p.div(t, cc);
    let row_start = p.mul(i, cc);
    let k = p.sub(t, row_start);
    let xv = p.load(x, t);
    let l = p.load(lse, i);
    let label = load_label(&mut p, labels, i, label_dtype);
    let first = p.const_u32(0);
    let gv = p.load(g, first);
    let scale = p.const_f32(1.0 / n as f32);
    let gs = p.mul(gv, scale);
    let out = gradient_element(&mut p, [xv, l], k, label, gs);
    p.store(grad, t, out);
    Ok(p.build()?)
}
