//! The f64 rows of the primitives that sum: reductions, products, scatter-adds and segment
//! sums, against double-double references.

use super::*;

fn reduce_on<B: Backend>(
    b: &B,
    op: ReduceOp,
    x: &[f64],
    shape: &[usize],
    axes: &[usize],
) -> Result<Vec<f64>> {
    let xl = Layout::contiguous(shape);
    let mut oshape = shape.to_vec();
    for &a in axes {
        oshape[a] = 1;
    }
    let ol = Layout::contiguous(&oshape);
    let xb = b.upload(x)?;
    let ob = b.alloc(DType::F64, ol.numel().max(1))?;
    b.reduce(op, View::new(&xb, &xl), axes, View::new(&ob, &ol))?;
    read_at(b, &ob, &ol)
}

/// Sums in double-double, so the reference is the exact sum rounded once; a backend may add
/// in any order: `n u sum |x|` (plus the final rounding).
pub(super) fn reduce<B: Backend>(s: &mut Suite<'_, B>) {
    let attempt = |b: &B| reduce_on(b, ReduceOp::Sum, &[1.0], &[1], &[0]);
    if !offered(s, "f64 reduce", "reduce", attempt) {
        return;
    }
    let cases: [(Vec<usize>, Vec<usize>); 4] = [
        (vec![100_003], vec![0]),
        (vec![37, 301], vec![1]),
        (vec![301, 37], vec![0]),
        (vec![5, 7, 9], vec![0, 2]),
    ];
    for (shape, axes) in cases {
        let n: usize = shape.iter().product();
        // Terms spanning 40 orders of magnitude with cancellation: f64 sums lose digits, the
        // double-double reference does not.
        let x: Vec<f64> = values(s, n, 1.0)
            .into_iter()
            .enumerate()
            .map(|(i, v)| v * 10f64.powi((i % 41) as i32 - 20))
            .collect();
        let xl = Layout::contiguous(&shape);
        let count: usize = axes.iter().map(|&a| shape[a]).product();
        let mut oshape = shape.clone();
        for &a in &axes {
            oshape[a] = 1;
        }
        let outs = numel(&oshape);
        let (mut sums, mut abs) = (vec![Dd::default(); outs], vec![0f64; outs]);
        let (mut mx, mut mn) = (vec![f64::NEG_INFINITY; outs], vec![f64::INFINITY; outs]);
        for (p, &v) in x.iter().enumerate() {
            let mut idx = unravel(p, &shape);
            for &a in &axes {
                idx[a] = 0;
            }
            let o = Layout::contiguous(&oshape).index_of(&idx);
            sums[o] = sums[o].add(v);
            abs[o] += v.abs();
            mx[o] = mx[o].max(v);
            mn[o] = mn[o].min(v);
        }
        let _ = xl;
        // log(sum(exp(x))) from the exact maxima: every shifted term is at most 1.
        let mut lse = vec![0f64; outs];
        for (p, &v) in x.iter().enumerate() {
            let mut idx = unravel(p, &shape);
            for &a in &axes {
                idx[a] = 0;
            }
            let o = Layout::contiguous(&oshape).index_of(&idx);
            lse[o] += (v - mx[o]).exp();
        }
        lse.iter_mut().zip(&mx).for_each(|(l, &m)| *l = m + l.ln());
        for op in ReduceOp::ALL {
            let want: Vec<f64> = (0..outs)
                .map(|o| match op {
                    ReduceOp::Sum => sums[o].value(),
                    ReduceOp::Mean => sums[o].value() / count as f64,
                    ReduceOp::Max => mx[o],
                    ReduceOp::Min => mn[o],
                    ReduceOp::LogSumExp => lse[o],
                })
                .collect();
            if op == ReduceOp::LogSumExp {
                let attempt = |b: &B| reduce_on(b, op, &[1.0], &[1], &[0]);
                if !offered(s, "f64 reduce logsumexp", "reduce_logsumexp", attempt) {
                    continue;
                }
            }
            let sum_like = matches!(op, ReduceOp::Sum | ReduceOp::Mean);
            let scale = if op == ReduceOp::Mean {
                1.0 / count as f64
            } else {
                1.0
            };
            let case = format!("{op:?} of {shape:?} over {axes:?}");
            match both!(s, reduce_on(op, &x, &shape, &axes)) {
                Ok((c, t)) => s.judge("f64 reduce", &case, &c, t.as_deref(), &want, &|o, w| {
                    if sum_like {
                        count as f64 * U64 * abs[o] * scale + 2.0 * U64 * w.abs()
                    } else if op == ReduceOp::LogSumExp {
                        // The sum of shifted terms (at least 1) to n u, its log to that much.
                        4.0 * count as f64 * U64 + 4.0 * U64 * w.abs()
                    } else {
                        0.0
                    }
                }),
                Err(e) => s.fail("f64 reduce", format!("{case}: {e}")),
            }
        }
    }
}

fn matmul_on<B: Backend>(b: &B, a: &[f64], bm: &[f64], mkn: [usize; 3]) -> Result<Vec<f64>> {
    let [m, k, n] = mkn;
    let (la, lb, lo) = (
        Layout::contiguous(&[m, k]),
        Layout::contiguous(&[n, k]).transpose(0, 1)?,
        Layout::contiguous(&[m, n]),
    );
    let (ab, bb) = (b.upload(a)?, b.upload(bm)?);
    let ob = b.alloc(DType::F64, m * n)?;
    b.matmul(
        View::new(&ab, &la),
        View::new(&bb, &lb),
        View::new(&ob, &lo),
        1.0,
        0.0,
    )?;
    read_at(b, &ob, &lo)
}

fn spmv_on<B: Backend>(
    b: &B,
    csr: (&[u32], &[u32], &[f64]),
    x: &[f64],
    rows: usize,
) -> Result<Vec<f64>> {
    let (offsets, cols, vals) = csr;
    let (ob, cb, vb, xb) = (
        b.upload(offsets)?,
        b.upload(cols)?,
        b.upload(vals)?,
        b.upload(x)?,
    );
    let y = b.alloc(DType::F64, rows.max(1))?;
    let a = Csr {
        rows,
        cols: x.len(),
        row_offsets: &ob,
        col_indices: &cb,
        values: &vb,
    };
    b.spmv_csr(a, &xb, &y, 1.0, 0.0)?;
    Ok(b.read_f64(&y)?[..rows].to_vec())
}

/// Products against double-double dot products: `k u sum |a b|` (any order of the terms).
pub(super) fn products<B: Backend>(s: &mut Suite<'_, B>) {
    let attempt = |b: &B| matmul_on(b, &[1.0], &[1.0], [1, 1, 1]);
    if offered(s, "f64 matmul", "matmul", attempt) {
        for mkn in [[1, 1, 1], [7, 257, 5], [65, 33, 129], [128, 300, 96]] {
            let [m, k, n] = mkn;
            let a = values(s, m * k, 3.0);
            let bt = values(s, n * k, 3.0);
            let (mut want, mut abs) = (vec![0.0; m * n], vec![0.0; m * n]);
            for i in 0..m {
                for j in 0..n {
                    let (mut d, mut t) = (Dd::default(), 0.0);
                    for p in 0..k {
                        d = d.add_product(a[i * k + p], bt[j * k + p]);
                        t += (a[i * k + p] * bt[j * k + p]).abs();
                    }
                    want[i * n + j] = d.value();
                    abs[i * n + j] = t;
                }
            }
            let case = format!("{m}x{k} by {k}x{n} (b transposed)");
            match both!(s, matmul_on(&a, &bt, mkn)) {
                Ok((c, t)) => s.judge("f64 matmul", &case, &c, t.as_deref(), &want, &|i, w| {
                    (k as f64 + 1.0) * U64 * abs[i] + U64 * w.abs()
                }),
                Err(e) => s.fail("f64 matmul", format!("{case}: {e}")),
            }
        }
    }
    let attempt = |b: &B| spmv_on(b, (&[0, 1], &[0], &[1.0]), &[1.0], 1);
    if offered(s, "f64 spmv_csr", "spmv_csr", attempt) {
        let (rows, cols) = (1001usize, 517usize);
        let mut offsets = vec![0u32];
        let (mut idx, mut vals) = (Vec::new(), Vec::new());
        for r in 0..rows {
            for _ in 0..(r % 13) {
                idx.push(s.rng().below(cols) as u32);
                vals.push(values(s, 1, 4.0)[0]);
            }
            offsets.push(idx.len() as u32);
        }
        let x = values(s, cols, 2.0);
        let (mut want, mut abs) = (vec![0.0; rows], vec![0.0; rows]);
        for r in 0..rows {
            let mut d = Dd::default();
            for e in offsets[r] as usize..offsets[r + 1] as usize {
                d = d.add_product(vals[e], x[idx[e] as usize]);
                abs[r] += (vals[e] * x[idx[e] as usize]).abs();
            }
            want[r] = d.value();
        }
        match both!(s, spmv_on((&offsets, &idx, &vals), &x, rows)) {
            Ok((c, t)) => s.judge(
                "f64 spmv_csr",
                "1001 x 517",
                &c,
                t.as_deref(),
                &want,
                &|i, w| 14.0 * U64 * abs[i] + U64 * w.abs(),
            ),
            Err(e) => s.fail("f64 spmv_csr", e),
        }
    }
}

fn gather_scatter_on<B: Backend>(
    b: &B,
    x: &[f64],
    index: &[u32],
    n_out: usize,
) -> Result<Vec<f64>> {
    // gather rows of x [n, 3] by index, then scatter-add them back into [n_out, 3].
    let n = x.len() / 3;
    let (xl, il) = (
        Layout::contiguous(&[n, 3]),
        Layout::contiguous(&[index.len(), 3]),
    );
    let idx: Vec<u32> = index.iter().flat_map(|&i| [i; 3]).collect();
    let (xb, ib) = (b.upload(x)?, b.upload(&idx)?);
    let gathered = b.alloc(DType::F64, idx.len().max(1))?;
    b.gather(
        View::new(&xb, &xl),
        0,
        View::new(&ib, &il),
        View::new(&gathered, &il),
    )?;
    let ol = Layout::contiguous(&[n_out, 3]);
    let out = b.alloc(DType::F64, 3 * n_out)?;
    b.scatter_add(
        View::new(&gathered, &il),
        0,
        View::new(&ib, &il),
        View::new(&out, &ol),
    )?;
    let mut r = read_at(b, &gathered, &il)?;
    r.extend(read_at(b, &out, &ol)?);
    Ok(r)
}

fn segment_on<B: Backend>(b: &B, x: &[f64], seg: &[u32], m: usize, d: usize) -> Result<Vec<f64>> {
    let n = seg.len();
    let (xb, sb) = (b.upload(x)?, b.upload(seg)?);
    let (sums, counts) = (b.alloc(DType::F64, m * d)?, b.alloc(DType::F64, m)?);
    let (xl, sl) = (Layout::contiguous(&[n, d]), Layout::contiguous(&[n]));
    let (ol, cl) = (Layout::contiguous(&[m, d]), Layout::contiguous(&[m]));
    b.segment_sum(
        View::new(&xb, &xl),
        View::new(&sb, &sl),
        None,
        View::new(&sums, &ol),
        View::new(&counts, &cl),
    )?;
    let mut r = b.read_f64(&sums)?;
    r.extend(b.read_f64(&counts)?);
    Ok(r)
}

/// Index primitives move values exactly; their sums are held to `n u sum |x|`.
pub(super) fn indexing<B: Backend>(s: &mut Suite<'_, B>) {
    let attempt = |b: &B| gather_scatter_on(b, &[1.0; 3], &[0], 1);
    if offered(s, "f64 gather, scatter_add", "gather", attempt) {
        let (n, k, n_out) = (211usize, 1009usize, 97usize);
        let x = values(s, 3 * n, 1e5);
        let index: Vec<u32> = (0..k).map(|_| s.rng().below(n_out.min(n)) as u32).collect();
        let mut want: Vec<f64> = index
            .iter()
            .flat_map(|&i| (0..3).map(move |c| (i, c)))
            .map(|(i, c)| x[3 * i as usize + c])
            .collect();
        let (mut sums, mut abs) = (vec![Dd::default(); 3 * n_out], vec![0.0; 3 * n_out]);
        for (j, &i) in index.iter().enumerate() {
            for c in 0..3 {
                let v = want[3 * j + c];
                sums[3 * i as usize + c] = sums[3 * i as usize + c].add(v);
                abs[3 * i as usize + c] += v.abs();
            }
        }
        want.extend(sums.iter().map(|d| d.value()));
        let gathered = 3 * k;
        match both!(s, gather_scatter_on(&x, &index, n_out)) {
            Ok((c, t)) => s.judge(
                "f64 gather, scatter_add",
                "rows of [211, 3] by 1009 indices",
                &c,
                t.as_deref(),
                &want,
                &|i, w| {
                    if i < gathered {
                        0.0
                    } else {
                        k as f64 * U64 * abs[i - gathered] + U64 * w.abs()
                    }
                },
            ),
            Err(e) => s.fail("f64 gather, scatter_add", e),
        }
    }
    let attempt = |b: &B| segment_on(b, &[1.0], &[0], 1, 1);
    if offered(s, "f64 segment_sum", "segment_sum", attempt) {
        let (n, m, d) = (3001usize, 17usize, 5usize);
        let x = values(s, n * d, 1e3);
        let seg: Vec<u32> = (0..n).map(|_| s.rng().below(m) as u32).collect();
        let (mut sums, mut abs) = (vec![Dd::default(); m * d], vec![0.0; m * d]);
        let mut counts = vec![0.0; m];
        for (i, &g) in seg.iter().enumerate() {
            for c in 0..d {
                sums[g as usize * d + c] = sums[g as usize * d + c].add(x[i * d + c]);
                abs[g as usize * d + c] += x[i * d + c].abs();
            }
            counts[g as usize] += 1.0;
        }
        let mut want: Vec<f64> = sums.iter().map(|s| s.value()).collect();
        want.extend(&counts);
        match both!(s, segment_on(&x, &seg, m, d)) {
            Ok((c, t)) => s.judge(
                "f64 segment_sum",
                "3001 rows into 17 segments",
                &c,
                t.as_deref(),
                &want,
                &|i, w| {
                    let a = abs.get(i).copied().unwrap_or(0.0);
                    n as f64 * U64 * a + U64 * w.abs()
                },
            ),
            Err(e) => s.fail("f64 segment_sum", e),
        }
    }
}
