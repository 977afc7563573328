//! Checks of matmul, its epilogues and gates, and spmv_csr.

use super::*;

pub(super) fn run_matmul<B: Backend>(
    b: &B,
    x: &HostTensor,
    y: &HostTensor,
    out: &HostTensor,
    alpha: f32,
    beta: f32,
) -> Result<Vec<f64>> {
    let (xb, yb, ob) = (x.upload(b)?, y.upload(b)?, out.upload(b)?);
    b.matmul(
        View::new(&xb, &x.layout),
        View::new(&yb, &y.layout),
        View::new(&ob, &out.layout),
        alpha,
        beta,
    )?;
    read_view(b, &ob, &out.layout)
}

/// A matrix operand `[batch, rows, cols]`, stored transposed, broadcast along the batch or
/// plain.
pub(super) fn matrix_operand(
    rng: &mut TestRng,
    batch: usize,
    rows: usize,
    cols: usize,
    dtype: DType,
) -> HostTensor {
    match rng.below(3) {
        0 => {
            let mut t = random_tensor(
                rng,
                &[batch, cols, rows],
                dtype,
                ViewKind::Contiguous,
                |r| r.range(-1.0, 1.0),
            );
            t.layout = t.layout.transpose(1, 2).expect("rank 3");
            t
        }
        1 if batch > 1 => {
            random_tensor(rng, &[batch, rows, cols], dtype, ViewKind::Broadcast, |r| {
                r.range(-1.0, 1.0)
            })
        }
        _ => random_tensor(rng, &[batch, rows, cols], dtype, ViewKind::Strided, |r| {
            r.range(-1.0, 1.0)
        }),
    }
}

pub(super) fn matmul<B: Backend>(s: &mut Suite<'_, B>) {
    let sizes = [1usize, 7, 16, 33, 65, 130, 257];
    let mut cases: Vec<[usize; 4]> = vec![
        [1, 257, 257, 65],
        [3, 7, 0, 7],
        [1, 0, 5, 3],
        [2, 65, 130, 33],
        // Long k over few output tiles: backends may split k (wgpu does, under beta 0), and
        // a thin output's slices may be dot products (wgpu's at most 16 wide).
        [1, 33, 1040, 65],
        [1, 12, 2080, 40],
        // Enough output tiles for wgpu's large tiles, over a thin side: its half tiles
        // (64 x 128 and 128 x 64), which pad less.
        [1, 64, 64, 32768],
        [1, 32768, 16, 40],
        // Long k over a few tiles of an odd output: split over k (wgpu's slices in 64 x 64
        // tiles, partly padding).
        [1, 40, 4096, 200],
        [1, 200, 4096, 40],
        // Wide on both sides: where f32 products may take matrix units under Precision::Fast.
        [1, 1040, 130, 1100],
    ];
    while cases.len() < s.cfg.cases + 11 {
        let r = s.rng();
        cases.push([
            1 + r.below(3),
            sizes[r.below(7)],
            sizes[r.below(7)],
            sizes[r.below(7)],
        ]);
    }
    for [batch, m, k, n] in cases {
        let dt = s.float_dtype();
        let dout = s.float_dtype();
        let x = matrix_operand(s.rng(), batch, m, k, dt);
        let y = matrix_operand(s.rng(), batch, k, n, dt);
        let out = output_tensor(s.rng(), &[batch, m, n], dout);
        let (alpha, beta) = (
            s.rng().range(0.5, 2.0),
            if s.rng().below(2) == 0 || k >= 1024 {
                0.0
            } else {
                s.rng().range(-1.0, 1.0)
            },
        );
        let oa = out.logical();
        let (mut exact, mut mag) = host_products(&x, &y, [batch, m, k, n]);
        for o in 0..batch * m * n {
            let old = if beta == 0.0 {
                0.0
            } else {
                beta as f64 * oa[o]
            };
            exact[o] = alpha as f64 * exact[o] + old;
            mag[o] = alpha as f64 * mag[o] + old.abs();
        }
        let (row, rel) = match s.policy {
            hal::Precision::Fast => ("matmul (Precision::Fast)", 2f64.powi(-10)),
            hal::Precision::Compensated => ("matmul (Precision::Compensated)", 2f64.powi(-18)),
            _ => ("matmul", 2f64.powi(-18)),
        };
        match both!(s, run_matmul(&x, &y, &out, alpha, beta)) {
            Ok((c, t)) => s.judge(
                row,
                &format!("[{batch},{m},{k}]@[{batch},{k},{n}] {dt}->{dout} beta {beta}"),
                &c,
                t.as_deref(),
                &exact,
                &|o, w| rel * mag[o] + rounding(dout, w, 2.0),
            ),
            Err(e) => s.fail(row, format!("[{batch},{m},{k},{n}]: {e}")),
        }
    }
}

/// `fixed` products `[m, k, n]` followed by the suite's count of random ones, each side one
/// of a few odd and even sizes.
pub(super) fn with_random_products<B: Backend>(
    s: &mut Suite<'_, B>,
    mut fixed: Vec<[usize; 3]>,
) -> Vec<[usize; 3]> {
    let sizes = [1usize, 7, 16, 33, 65, 130];
    for _ in 0..s.cfg.cases {
        let r = s.rng();
        fixed.push([sizes[r.below(6)], sizes[r.below(6)], sizes[r.below(6)]]);
    }
    fixed
}

pub(super) fn run_matmul_epilogue<B: Backend>(
    b: &B,
    [x, y, out]: [&HostTensor; 3],
    bias: Option<&HostTensor>,
    activation: Option<UnaryOp>,
    (alpha, beta): (f32, f32),
) -> Result<Vec<f64>> {
    let (xb, yb, ob) = (x.upload(b)?, y.upload(b)?, out.upload(b)?);
    let bb = bias.map(|t| t.upload(b)).transpose()?;
    let bias_view = bias
        .zip(bb.as_ref())
        .map(|(t, buf)| View::new(buf, &t.layout));
    b.matmul_epilogue(
        View::new(&xb, &x.layout),
        View::new(&yb, &y.layout),
        View::new(&ob, &out.layout),
        alpha,
        beta,
        hal::Epilogue {
            bias: bias_view,
            activation,
            ..Default::default()
        },
    )?;
    read_view(b, &ob, &out.layout)
}

/// Products with a bias and an activation after them (`Backend::matmul_epilogue`): shapes
/// that wgpu splits over k (its fused sum pass) and shapes it does not (the separate calls),
/// biases per column (contiguous, strided, broadcast), per row and per element.
pub(super) fn matmul_epilogue<B: Backend>(s: &mut Suite<'_, B>) {
    let fixed = vec![
        [33, 1040, 65],
        [12, 2080, 40],
        [64, 784, 96],
        // Small thin outputs that wgpu runs whole as dot products, epilogue included.
        [130, 520, 10],
        [16, 200, 77],
        [7, 16, 33],
        [0, 5, 3],
        [5, 0, 7],
    ];
    let cases = with_random_products(s, fixed);
    let activations = [
        None,
        Some(UnaryOp::Relu),
        Some(UnaryOp::Sigmoid),
        Some(UnaryOp::Tanh),
        Some(UnaryOp::LeakyRelu { slope: 0.1 }),
        Some(UnaryOp::Gelu),
    ];
    for (i, [m, k, n]) in cases.into_iter().enumerate() {
        let (dt, dout, dbias) = (s.float_dtype(), s.float_dtype(), s.float_dtype());
        let x = matrix_operand(s.rng(), 1, m, k, dt);
        let y = matrix_operand(s.rng(), 1, k, n, dt);
        let out = output_tensor(s.rng(), &[1, m, n], dout);
        let bias_shape = match i % 4 {
            0 => None,
            1 | 2 => Some(vec![n]),
            _ => Some(if i % 8 == 3 {
                vec![m, 1]
            } else {
                vec![1, m, n]
            }),
        };
        let kind = s.kind();
        let bias = bias_shape
            .map(|shape| random_tensor(s.rng(), &shape, dbias, kind, |r| r.range(-1.0, 1.0)));
        let activation = activations[s.rng().below(activations.len())];
        let alpha = s.rng().range(0.5, 2.0);
        let beta = if s.rng().below(3) == 0 && k < 1024 {
            s.rng().range(-1.0, 1.0)
        } else {
            0.0
        };
        let (mut z, mut mag) = host_products(&x, &y, [1, m, k, n]);
        let old = out.logical();
        let bias_at = bias.as_ref().map(|b| {
            let values = b.logical();
            let shape = b.layout.shape.clone();
            move |o: usize| -> f64 {
                match shape.len() {
                    1 => values[o % n],
                    2 => values[o / n.max(1)],
                    _ => values[o],
                }
            }
        });
        let mut exact = vec![0f64; m * n];
        let mut pre = vec![0f64; m * n];
        for o in 0..m * n {
            let kept = if beta == 0.0 {
                0.0
            } else {
                beta as f64 * old[o]
            };
            z[o] = alpha as f64 * z[o] + kept;
            mag[o] = alpha as f64 * mag[o] + kept.abs();
            pre[o] = z[o] + bias_at.as_ref().map_or(0.0, |b| b(o));
            exact[o] = activation.map_or(pre[o], |op| unary_f64(op, pre[o]));
        }
        // The product's tolerance and one rounding of the product and of the sum (a backend
        // that runs the steps stores each), through the activation (slope at most 1.13,
        // GELU's), then the activation's own.
        let u = dout.unit_roundoff();
        let (rel, abs) = match activation {
            Some(op) if !is_exact_unary(op) => (4.0 * u + 2f64.powi(-18), 2f64.powi(-19)),
            _ => (2.0 * u + 2.0 * U32F, 0.0),
        };
        let tol = |o: usize, w: f64| {
            1.13 * (2f64.powi(-18) * mag[o]
                + rounding(dout, z[o], 2.0)
                + rounding(dout, pre[o], 2.0))
                + rel * w.abs()
                + abs
                + rounding(dout, w, 2.0)
        };
        let what = format!(
            "[{m},{k}]@[{k},{n}] {dt}->{dout} bias {:?} {dbias} {kind:?} {activation:?} beta {beta}",
            bias.as_ref().map(|b| b.layout.shape.clone())
        );
        match both!(
            s,
            run_matmul_epilogue([&x, &y, &out], bias.as_ref(), activation, (alpha, beta))
        ) {
            Ok((c, t)) => s.judge("matmul (epilogue)", &what, &c, t.as_deref(), &exact, &tol),
            Err(e) => s.fail("matmul (epilogue)", format!("{what}: {e}")),
        }
    }
}

pub(super) fn run_matmul_gate<B: Backend>(
    b: &B,
    [x, y, out]: [&HostTensor; 3],
    gate: Option<(UnaryOp, &HostTensor)>,
    sums: Option<&HostTensor>,
    (alpha, beta): (f32, f32),
) -> Result<Vec<f64>> {
    let (xb, yb, ob) = (x.upload(b)?, y.upload(b)?, out.upload(b)?);
    let gb = gate.map(|(_, t)| t.upload(b)).transpose()?;
    let sb = sums.map(|t| t.upload(b)).transpose()?;
    let a_gate = gate
        .zip(gb.as_ref())
        .map(|((activation, t), buf)| hal::Gate {
            activation,
            output: View::new(buf, &t.layout),
        });
    b.matmul_epilogue(
        View::new(&xb, &x.layout),
        View::new(&yb, &y.layout),
        View::new(&ob, &out.layout),
        alpha,
        beta,
        hal::Epilogue {
            a_gate,
            a_row_sums: sums
                .zip(sb.as_ref())
                .map(|(t, buf)| View::new(buf, &t.layout)),
            ..Default::default()
        },
    )?;
    let mut got = read_view(b, &ob, &out.layout)?;
    if let Some((t, buf)) = sums.zip(sb.as_ref()) {
        got.extend(read_view(b, buf, &t.layout)?);
    }
    Ok(got)
}

/// The backward epilogues (`Epilogue::a_gate`, `Epilogue::a_row_sums`): a Linear layer's
/// weight gradient `(g * act'(y))^T x` with its bias gradient, and its input gradient. Gates
/// laid out as `a` (which wgpu fuses into the product's reads) and otherwise (the separate
/// calls); shapes wgpu splits over k (row sums in the split's last column; thin outputs as
/// dot products) and shapes it does not.
pub(super) fn matmul_gate<B: Backend>(s: &mut Suite<'_, B>) {
    let fixed = vec![
        [65, 1040, 33],
        [10, 256, 130],
        [130, 256, 10],
        [64, 784, 96],
        [7, 16, 33],
        [0, 5, 3],
        [5, 0, 7],
        [6, 9, 0],
    ];
    let cases = with_random_products(s, fixed);
    for (i, [m, k, n]) in cases.into_iter().enumerate() {
        let (dt, dout, dgate, dsums) = (
            s.float_dtype(),
            s.float_dtype(),
            s.float_dtype(),
            s.float_dtype(),
        );
        let x = matrix_operand(s.rng(), 1, m, k, dt);
        let y = matrix_operand(s.rng(), 1, k, n, dt);
        let out = output_tensor(s.rng(), &[1, m, n], dout);
        let activation = hal::Gate::<()>::ACTIVATIONS[s.rng().below(3)];
        // The gate's output: the activation of random values, at `x`'s strides (fusable) or
        // laid out on its own.
        let act = move |v: f32| unary_f64(activation, v as f64) as f32;
        let gate = match i % 4 {
            0 => None,
            1 | 2 => {
                let backing = (0..x.backing.len())
                    .map(|_| round_to(dgate, act(s.rng().range(-2.0, 2.0))))
                    .collect();
                Some(HostTensor {
                    dtype: dgate,
                    backing,
                    layout: x.layout.clone(),
                })
            }
            _ => {
                let kind = s.kind();
                Some(random_tensor(s.rng(), &[1, m, k], dgate, kind, |r| {
                    act(r.range(-2.0, 2.0))
                }))
            }
        };
        let sums = (i % 3 != 1).then(|| output_tensor(s.rng(), &[1, m], dsums));
        let alpha = s.rng().range(0.5, 2.0);
        let beta = if s.rng().below(4) == 0 {
            s.rng().range(-1.0, 1.0)
        } else {
            0.0
        };
        // The gated operand in f64, then the product and the row sums.
        let mut gated = x.clone();
        if let Some(g) = &gate {
            let (xs, ys) = (x.logical(), g.logical());
            let through = |a: f64, y: f64| match activation {
                UnaryOp::Relu if y > 0.0 => a,
                UnaryOp::Relu => 0.0,
                UnaryOp::Sigmoid => y * (1.0 - y) * a,
                _ => (1.0 - y * y) * a,
            };
            let values: Vec<f32> = (0..m * k).map(|e| through(xs[e], ys[e]) as f32).collect();
            gated = HostTensor::contiguous(DType::F32, &[1, m, k], values);
        }
        let (mut exact, mut mag) = host_products(&gated, &y, [1, m, k, n]);
        let old = out.logical();
        for o in 0..m * n {
            let kept = if beta == 0.0 {
                0.0
            } else {
                beta as f64 * old[o]
            };
            exact[o] = alpha as f64 * exact[o] + kept;
            mag[o] = alpha as f64 * mag[o] + kept.abs();
        }
        if sums.is_some() {
            let ga = gated.logical();
            for r in 0..m {
                let row = &ga[r * k..(r + 1) * k];
                exact.push(alpha as f64 * row.iter().sum::<f64>());
                mag.push(alpha as f64 * k as f64 * row.iter().map(|v| v.abs()).sum::<f64>());
            }
        }
        // The product's tolerance (its scale from the gated operand, which the host rounds
        // to f32 as a backend does), one rounding of the stored values (two for the row
        // sums: a backend may round the sum and then its scaling by alpha).
        let tol = |o: usize, w: f64| {
            let d = if o < m * n { dout } else { dsums };
            2f64.powi(-18) * mag[o] + rounding(d, w, 2.0) + 2.0 * U32F * w.abs()
        };
        let what = format!(
            "[{m},{k}]@[{k},{n}] {dt}->{dout} gate {:?} {dgate} (layout of a: {}) sums {:?} {dsums} beta {beta}",
            gate.as_ref().map(|_| activation),
            gate.as_ref().is_some_and(|g| g.layout == x.layout),
            sums.as_ref().map(|t| t.layout.clone()),
        );
        let gate_arg = gate.as_ref().map(|g| (activation, g));
        match both!(
            s,
            run_matmul_gate([&x, &y, &out], gate_arg, sums.as_ref(), (alpha, beta))
        ) {
            Ok((c, t)) => s.judge(
                "matmul (gate, row sums)",
                &what,
                &c,
                t.as_deref(),
                &exact,
                &tol,
            ),
            Err(e) => s.fail("matmul (gate, row sums)", format!("{what}: {e}")),
        }
    }
}

/// The batched product `x @ y` in f64 on the host, and beside it `k * (|x| @ |y|)` (the scale
/// matmul tolerances are stated in).
pub(super) fn host_products(
    x: &HostTensor,
    y: &HostTensor,
    [batch, m, k, n]: [usize; 4],
) -> (Vec<f64>, Vec<f64>) {
    let (xa, ya) = (x.logical(), y.logical());
    let mut exact = vec![0f64; batch * m * n];
    let mut mag = vec![0f64; batch * m * n];
    for bi in 0..batch {
        for i in 0..m {
            for j in 0..n {
                let o = (bi * m + i) * n + j;
                for p in 0..k {
                    let v = xa[(bi * m + i) * k + p] * ya[(bi * k + p) * n + j];
                    exact[o] += v;
                    mag[o] += v.abs();
                }
                mag[o] *= k as f64;
            }
        }
    }
    (exact, mag)
}

/// Products whose operands hold values that f16 cannot represent (bf16 operands; f32 ones
/// under `Fast` and `Compensated`): a backend that multiplies on f16 matrix units must notice
/// (huge, tiny, infinite) and compute them another way, within the policy's tolerance.
pub(super) fn matmul_beyond_f16<B: Backend>(s: &mut Suite<'_, B>) {
    let (row, rel, dt) = match s.policy {
        hal::Precision::Fast => (
            "matmul (Precision::Fast, beyond f16)",
            2f64.powi(-10),
            DType::F32,
        ),
        hal::Precision::Compensated => (
            "matmul (Precision::Compensated, beyond f16)",
            2f64.powi(-18),
            DType::F32,
        ),
        _ => ("matmul (bf16 beyond f16)", 2f64.powi(-18), DType::BF16),
    };
    for (case, [batch, m, k, n]) in [[1, 65, 33, 65], [2, 130, 47, 129], [1, 257, 64, 200]]
        .into_iter()
        .enumerate()
    {
        let odd = [3.0e5f32, -7.5e6, 1.0e-9, 2.5e-12][case % 4];
        let mut x = random_tensor(s.rng(), &[batch, m, k], dt, ViewKind::Contiguous, |r| {
            r.range(-1.0, 1.0)
        });
        let y = random_tensor(s.rng(), &[batch, k, n], dt, ViewKind::Strided, |r| {
            r.range(-1.0, 1.0)
        });
        let at = s.rng().below(x.backing.len());
        x.backing[at] = round_to(dt, odd);
        let out = output_tensor(s.rng(), &[batch, m, n], DType::F32);
        let (exact, mag) = host_products(&x, &y, [batch, m, k, n]);
        match both!(s, run_matmul(&x, &y, &out, 1.0, 0.0)) {
            Ok((c, t)) => s.judge(
                row,
                &format!("[{batch},{m},{k}]@[{batch},{k},{n}] {dt} holding {odd:e}"),
                &c,
                t.as_deref(),
                &exact,
                &|o, w| rel * mag[o] + rounding(DType::F32, w, 2.0),
            ),
            Err(e) => s.fail(row, format!("[{batch},{m},{k},{n}]: {e}")),
        }
    }
}

pub(super) struct CsrHost {
    rows: usize,
    cols: usize,
    offsets: Vec<u32>,
    indices: Vec<u32>,
    values: Vec<f32>,
}

pub(super) fn run_spmv<B: Backend>(
    b: &B,
    a: &CsrHost,
    x: &[f32],
    y: &[f32],
    alpha: f32,
    beta: f32,
) -> Result<Vec<f64>> {
    let (ro, ci, va) = (
        b.upload(&a.offsets)?,
        b.upload(&a.indices)?,
        b.upload(&a.values)?,
    );
    let (xb, yb) = (b.upload(x)?, b.upload(y)?);
    b.spmv_csr(
        Csr {
            rows: a.rows,
            cols: a.cols,
            row_offsets: &ro,
            col_indices: &ci,
            values: &va,
        },
        &xb,
        &yb,
        alpha,
        beta,
    )?;
    Ok(b.read::<f32>(&yb)?.into_iter().map(f64::from).collect())
}

pub(super) fn spmv<B: Backend>(s: &mut Suite<'_, B>) {
    let dims = [0usize, 1, 7, 257, 65537];
    for c in 0..s.cfg.cases + 4 {
        let (rows, cols) = (dims[c % 5], dims[(c / 5 + 2) % 5].max(1));
        let r = s.rng();
        let mut a = CsrHost {
            rows,
            cols,
            offsets: vec![0],
            indices: Vec::new(),
            values: Vec::new(),
        };
        for _ in 0..rows {
            for _ in 0..r.below(9) {
                a.indices.push(r.below(cols) as u32);
                a.values.push(r.range(-1.0, 1.0));
            }
            a.offsets.push(a.indices.len() as u32);
        }
        let x: Vec<f32> = (0..cols).map(|_| r.range(-1.0, 1.0)).collect();
        let y: Vec<f32> = (0..rows).map(|_| r.range(-1.0, 1.0)).collect();
        let (alpha, beta) = (
            r.range(0.5, 2.0),
            if r.below(2) == 0 {
                0.0
            } else {
                r.range(-1.0, 1.0)
            },
        );
        let mut exact = vec![0f64; rows];
        let mut mag = vec![0f64; rows];
        for i in 0..rows {
            let (mut acc, mut m) = (0f64, 0f64);
            for k in a.offsets[i] as usize..a.offsets[i + 1] as usize {
                let t = a.values[k] as f64 * x[a.indices[k] as usize] as f64;
                acc += t;
                m += t.abs();
            }
            exact[i] = alpha as f64 * acc
                + if beta == 0.0 {
                    0.0
                } else {
                    beta as f64 * y[i] as f64
                };
            mag[i] = alpha as f64 * m * 9.0 + (beta as f64 * y[i] as f64).abs();
        }
        match both!(s, run_spmv(&a, &x, &y, alpha, beta)) {
            Ok((cv, t)) => s.judge(
                "spmv_csr",
                &format!("{rows}x{cols}"),
                &cv,
                t.as_deref(),
                &exact,
                &|i, w| 2f64.powi(-18) * mag[i] + 2.0 * U32F * w.abs(),
            ),
            Err(e) => s.fail("spmv_csr", format!("{rows}x{cols}: {e}")),
        }
    }
}
