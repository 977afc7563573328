//! Checks of reduce and arg_reduce.

use super::*;

pub(super) fn run_reduce<B: Backend>(
    b: &B,
    op: ReduceOp,
    x: &HostTensor,
    axes: &[usize],
    out: &HostTensor,
) -> Result<Vec<f64>> {
    let (xb, ob) = (x.upload(b)?, out.upload(b)?);
    b.reduce(
        op,
        View::new(&xb, &x.layout),
        axes,
        View::new(&ob, &out.layout),
    )?;
    read_view(b, &ob, &out.layout)
}

pub(super) fn reduce<B: Backend>(s: &mut Suite<'_, B>) {
    let shapes = s.shapes(1..=4, 1 << 18);
    let mut cases: Vec<(Vec<usize>, Vec<usize>)> = shapes
        .into_iter()
        .map(|shape| {
            let axes = (0..shape.len()).filter(|_| s.rng().below(2) == 0).collect();
            (shape, axes)
        })
        .collect();
    // Column sums (the leading axis of row-major data, as for a bias gradient), which
    // backends may serve with their own kernel: short and long columns, odd widths.
    cases.extend([
        (vec![257, 77], vec![0]),
        (vec![131, 5, 33], vec![0]),
        (vec![2003, 41], vec![0]),
        // Short lines that still span several chunks: whole lines, a workgroup's worth of
        // invocations each where backends have such a kernel (wgpu's reduce_lanes).
        (vec![3001], vec![0]),
        (vec![7, 1500], vec![1]),
    ]);
    for (i, (shape, axes)) in cases.iter().enumerate() {
        let (shape, axes) = (shape.clone(), axes.clone());
        let shape = &shape;
        let op = ReduceOp::ALL[i % ReduceOp::ALL.len()];
        let mut oshape = shape.clone();
        for &a in &axes {
            oshape[a] = 1;
        }
        let (din, dout, kind) = (s.float_dtype(), s.float_dtype(), s.kind());
        let inject_nan = i % 5 == 4;
        let mut x = random_tensor(s.rng(), shape, din, kind, |r| r.range(-2.0, 2.0));
        if inject_nan && !x.backing.is_empty() {
            let at = s.rng().below(x.backing.len());
            x.backing[at] = f32::NAN;
        }
        // LogSumExp's rules for infinities: -inf adds nothing, +inf makes the result +inf.
        if op == ReduceOp::LogSumExp && !x.backing.is_empty() {
            for (every, value) in [(2, f32::NEG_INFINITY), (3, f32::INFINITY)] {
                if i % every == 0 {
                    let at = s.rng().below(x.backing.len());
                    x.backing[at] = value;
                }
            }
        }
        let out = output_tensor(s.rng(), &oshape, dout);
        let name = match op {
            ReduceOp::Sum => "reduce sum",
            ReduceOp::Mean => "reduce mean",
            ReduceOp::Max => "reduce max",
            ReduceOp::Min => "reduce min",
            ReduceOp::LogSumExp => "reduce logsumexp",
        };
        let count: usize = axes.iter().map(|&a| shape[a]).product();
        if count == 0 && numel(&oshape) > 0 && matches!(op, ReduceOp::Max | ReduceOp::Min) {
            match both!(s, run_reduce(op, &x, &axes, &out)) {
                Err(e) if e.contains("empty input") => s.pass(name),
                other => s.fail(
                    name,
                    format!(
                        "{shape:?} over {axes:?}: expected an empty-input error, got {other:?}"
                    ),
                ),
            }
            continue;
        }
        let xs = x.logical();
        let mut sums = vec![0f64; numel(&oshape)];
        let mut abs = vec![0f64; numel(&oshape)];
        let mut ext = vec![None::<f64>; numel(&oshape)];
        for (p, &v) in xs.iter().enumerate() {
            let mut idx = unravel(p, shape);
            for &a in &axes {
                idx[a] = 0;
            }
            let o = Layout::contiguous(&oshape).index_of(&idx);
            sums[o] += v;
            abs[o] += v.abs();
            let better = |cur: f64| match op {
                ReduceOp::Max => v > cur || v.is_nan(),
                _ => v < cur || v.is_nan(),
            };
            ext[o] = match ext[o] {
                Some(cur) if cur.is_nan() || !better(cur) => Some(cur),
                _ => Some(v),
            };
        }
        // LogSumExp: over each output's finite elements (flags for NaN and +inf), shifted by
        // their maximum.
        let mut finite_max = vec![f64::NEG_INFINITY; sums.len()];
        let (mut has_nan, mut has_inf) = (vec![false; sums.len()], vec![false; sums.len()]);
        let output_of = |p: usize| {
            let mut idx = unravel(p, shape);
            for &a in &axes {
                idx[a] = 0;
            }
            Layout::contiguous(&oshape).index_of(&idx)
        };
        for (p, &v) in xs.iter().enumerate() {
            let o = output_of(p);
            has_nan[o] |= v.is_nan();
            has_inf[o] |= v == f64::INFINITY;
            if v.is_finite() {
                finite_max[o] = finite_max[o].max(v);
            }
        }
        let mut shifted = vec![0f64; sums.len()];
        for (p, &v) in xs.iter().enumerate() {
            let o = output_of(p);
            if v.is_finite() {
                shifted[o] += (v - finite_max[o]).exp();
            }
        }
        let exact: Vec<f64> = (0..sums.len())
            .map(|o| match op {
                ReduceOp::Sum => sums[o],
                ReduceOp::Mean => sums[o] / count as f64,
                ReduceOp::LogSumExp if has_nan[o] => f64::NAN,
                ReduceOp::LogSumExp if has_inf[o] => f64::INFINITY,
                ReduceOp::LogSumExp => finite_max[o] + shifted[o].ln(),
                _ => ext[o].unwrap_or(f64::NAN),
            })
            .collect();
        let scale = if op == ReduceOp::Mean {
            1.0 / count.max(1) as f64
        } else {
            1.0
        };
        match both!(s, run_reduce(op, &x, &axes, &out)) {
            Ok((c, t)) => s.judge(
                name,
                &format!("{shape:?} over {axes:?} {din}->{dout} {kind:?}"),
                &c,
                t.as_deref(),
                &exact,
                &|o, w| match op {
                    ReduceOp::LogSumExp => 2f64.powi(-16) + rounding(dout, w, 2.0),
                    _ => 2f64.powi(-17) * abs[o] * scale + rounding(dout, w, 2.0),
                },
            ),
            Err(e) => s.fail(name, format!("{shape:?} over {axes:?}: {e}")),
        }
    }
}

pub(super) fn run_arg<B: Backend>(
    b: &B,
    op: ArgReduceOp,
    x: &HostTensor,
    axis: usize,
    out: &HostTensor,
) -> Result<Vec<f64>> {
    let (xb, ob) = (x.upload(b)?, out.upload(b)?);
    b.arg_reduce(
        op,
        View::new(&xb, &x.layout),
        axis,
        View::new(&ob, &out.layout),
    )?;
    read_view(b, &ob, &out.layout)
}

pub(super) fn arg_reduce<B: Backend>(s: &mut Suite<'_, B>) {
    let mut cases: Vec<(Vec<usize>, Option<usize>)> = s
        .shapes(1..=3, 1 << 18)
        .into_iter()
        .map(|shape| (shape, None))
        .collect();
    // A few long lines (the backends' paths for few outputs along a long axis, and for one
    // output split over blocks), one strided.
    cases.extend([
        (vec![1, 8191], Some(1)),
        (vec![300007], Some(0)),
        (vec![4097, 1], Some(0)),
        (vec![3, 65537], Some(1)),
        (vec![2051, 2], Some(0)),
        // Short axes with many outputs (a pooling window's argmax), up to the longest a
        // backend may give one thread per output.
        (vec![37, 4, 53], Some(1)),
        (vec![16, 1001], Some(0)),
        (vec![603, 17], Some(1)),
    ]);
    for (i, (shape, axis)) in cases.iter().enumerate() {
        if shape.contains(&0) {
            continue;
        }
        let op = if i % 2 == 0 {
            ArgReduceOp::ArgMax
        } else {
            ArgReduceOp::ArgMin
        };
        let axis = match axis {
            Some(a) => *a,
            None => s.rng().below(shape.len()),
        };
        let mut oshape = shape.clone();
        oshape[axis] = 1;
        let (din, kind) = (s.float_dtype(), s.kind());
        // Few distinct values, so ties are common; sometimes a NaN.
        let mut x = random_tensor(s.rng(), shape, din, kind, |r| r.below(5) as f32);
        if i % 4 == 3 && !x.backing.is_empty() {
            let at = s.rng().below(x.backing.len());
            x.backing[at] = f32::NAN;
        }
        let out = output_tensor(s.rng(), &oshape, DType::U32);
        let xs = x.logical();
        let cl = Layout::contiguous(shape);
        let exact: Vec<f64> = (0..numel(&oshape))
            .map(|o| {
                let base = unravel(o, &oshape);
                let mut best: Option<(usize, f64)> = None;
                for j in 0..shape[axis] {
                    let mut idx = base.clone();
                    idx[axis] = j;
                    let v = xs[cl.index_of(&idx)];
                    best = match best {
                        Some((_, b)) if b.is_nan() => best,
                        None => Some((j, v)),
                        Some((_, b))
                            if v.is_nan()
                                || (op == ArgReduceOp::ArgMax && v > b)
                                || (op == ArgReduceOp::ArgMin && v < b) =>
                        {
                            Some((j, v))
                        }
                        keep => keep,
                    };
                }
                best.map_or(0.0, |(j, _)| j as f64)
            })
            .collect();
        let name = if op == ArgReduceOp::ArgMax {
            "argmax"
        } else {
            "argmin"
        };
        match both!(s, run_arg(op, &x, axis, &out)) {
            Ok((c, t)) => s.judge(
                name,
                &format!("{shape:?} axis {axis} {kind:?}"),
                &c,
                t.as_deref(),
                &exact,
                &|_, _| 0.0,
            ),
            Err(e) => s.fail(name, format!("{shape:?} axis {axis}: {e}")),
        }
    }
}
