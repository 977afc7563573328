//! Checks of segment_sum, and the reproducible precision of the clustering pair.

use super::*;

pub(super) fn run_seg<B: Backend>(
    b: &B,
    x: &HostTensor,
    seg: &[u32],
    w: Option<&[f32]>,
    m: usize,
) -> Result<Vec<f64>> {
    let (n, d) = (x.shape()[0], x.shape()[1]);
    let xb = x.upload(b)?;
    let sb = b.upload(seg)?;
    let wb = w.map(|w| b.upload(w)).transpose()?;
    let (sums, counts) = (b.alloc(DType::F32, m * d)?, b.alloc(DType::F32, m)?);
    let (ln, lm, lmd) = (
        Layout::contiguous(&[n]),
        Layout::contiguous(&[m]),
        Layout::contiguous(&[m, d]),
    );
    b.segment_sum(
        View::new(&xb, &x.layout),
        View::new(&sb, &ln),
        wb.as_ref().map(|w| View::new(w, &ln)),
        View::new(&sums, &lmd),
        View::new(&counts, &lm),
    )?;
    let mut out: Vec<f64> = b.read::<f32>(&sums)?.into_iter().map(f64::from).collect();
    out.extend(b.read::<f32>(&counts)?.into_iter().map(f64::from));
    Ok(out)
}

pub(super) fn segment_sum<B: Backend>(s: &mut Suite<'_, B>) {
    let mut cases: Vec<[usize; 3]> = vec![
        [0, 3, 2],
        [1, 1, 1],
        [7, 5, 3],
        [257, 16, 7],
        [65537, 8, 257],
        [3001, 5, 300],
        [3, 2, 1],
        // Segments times rows beyond 2^24, where GPU backends sort the rows first (smaller
        // problems scan the ids per segment); odd position, so weighted. The second has at
        // most 64 rows per segment on average (CUDA sums such segments whole, not in parts).
        [70001, 3, 300],
        [65537, 4, 1031],
    ];
    while cases.len() < s.cfg.cases + 7 {
        let r = s.rng();
        cases.push([r.below(3000), 1 + r.below(40), 1 + r.below(400)]);
    }
    for (ci, [n, d, m]) in cases.into_iter().enumerate() {
        let kind = s.kind();
        let fdt = s.float_dtype();
        let x = random_tensor(s.rng(), &[n, d], fdt, kind, |r| r.range(-1.0, 1.0));
        let r = s.rng();
        let seg: Vec<u32> = (0..n).map(|_| r.below(m) as u32).collect();
        segment_case(s, &x, &seg, m, ci % 2 == 1, &format!("{kind:?}"));
    }
    // Long segments of one repeated row (a broadcast view of same-sign values), most rows in
    // segment 0: the sums that drift furthest where a backend adds a segment as one chain of
    // f32 adds. Sized for each GPU path: the per-segment scan, the sorted sums in parts, and
    // the sorted sums of whole segments (at most 64 rows per segment on average).
    for (ci, [n, d, m]) in [[6000, 9, 2], [90000, 3, 200], [30000, 3, 600]]
        .into_iter()
        .enumerate()
    {
        let r = s.rng();
        let row: Vec<f32> = (0..d).map(|_| r.range(0.5, 1.0)).collect();
        let x = HostTensor {
            dtype: DType::F32,
            backing: row,
            layout: Layout::contiguous(&[1, d])
                .broadcast_to(&[n, d])
                .expect("broadcast"),
        };
        let seg: Vec<u32> = (0..n)
            .map(|i| if i % 8 == 0 { r.below(m) as u32 } else { 0 })
            .collect();
        segment_case(s, &x, &seg, m, ci == 1, "equal rows");
    }
}

/// One segment_sum case judged against the float64 sums (weights drawn here when
/// `weighted`).
pub(super) fn segment_case<B: Backend>(
    s: &mut Suite<'_, B>,
    x: &HostTensor,
    seg: &[u32],
    m: usize,
    weighted: bool,
    what: &str,
) {
    let (n, d) = (x.layout.shape[0], x.layout.shape[1]);
    let r = s.rng();
    let w: Vec<f32> = (0..n).map(|_| r.range(0.05, 1.0)).collect();
    let xs = x.logical();
    let mut exact = vec![0f64; m * d + m];
    let mut mag = vec![0f64; m * d + m];
    for i in 0..n {
        let wi = if weighted { w[i] as f64 } else { 1.0 };
        let sg = seg[i] as usize;
        for k in 0..d {
            exact[sg * d + k] += wi * xs[i * d + k];
            mag[sg * d + k] += (wi * xs[i * d + k]).abs();
        }
        exact[m * d + sg] += wi;
        mag[m * d + sg] += wi;
    }
    let name = if weighted {
        "segment_sum (weighted)"
    } else {
        "segment_sum"
    };
    let wref = weighted.then_some(&w[..]);
    match both!(s, run_seg(x, seg, wref, m)) {
        Ok((c, t)) => s.judge(
            name,
            &format!("n={n} d={d} m={m} {what}"),
            &c,
            t.as_deref(),
            &exact,
            &|o, w| 2f64.powi(-17) * mag[o] + 2.0 * U32F * w.abs(),
        ),
        Err(e) => s.fail(name, format!("n={n} d={d} m={m}: {e}")),
    }
}

/// `Precision::Reproducible`: nearest-centroid results and segment sums bit-identical to the
/// CPU's (on the CPU itself: the distances equal to the exact-mode reference's, the sums
/// within the sequential-summation bound of float64).
pub(super) fn reproducible<B: Backend>(s: &mut Suite<'_, B>) {
    let target = s.target.with_precision(hal::Precision::Reproducible);
    let cpu = s.cpu.with_precision(hal::Precision::Reproducible);
    // The last fixed case has segments times rows beyond 2^24 (GPU backends sort there).
    let mut cases: Vec<[usize; 3]> = vec![
        [1, 1, 1],
        [7, 3, 7],
        [300, 33, 65],
        [65537, 8, 33],
        [300001, 2, 61],
    ];
    while cases.len() < s.cfg.cases.min(6) + 5 {
        let r = s.rng();
        cases.push([1 + r.below(2000), 1 + r.below(70), 1 + r.below(80)]);
    }
    for [n, d, m] in cases {
        let kind = s.kind();
        let x = random_tensor(s.rng(), &[n, d], DType::F32, kind, |r| r.range(-1.0, 1.0));
        let c = random_tensor(s.rng(), &[m, d], DType::F32, ViewKind::Contiguous, |r| {
            r.range(-1.0, 1.0)
        });
        let r = s.rng();
        let seg: Vec<u32> = (0..n).map(|_| r.below(m) as u32).collect();
        let w: Vec<f32> = (0..n).map(|_| r.range(0.05, 1.0)).collect();
        let case = format!("n={n} d={d} m={m} {kind:?}");
        let nc_name = "nearest_centroid (Precision::Reproducible)";
        let seg_name = "segment_sum (Precision::Reproducible)";
        let reference =
            run_nc(&cpu, &x, &c).and_then(|r| Ok((r, run_seg(&cpu, &x, &seg, Some(&w), m)?)));
        let ((ci, cd), csum) = match reference {
            Ok(r) => r,
            Err(e) => {
                s.fail(nc_name, format!("{case}: cpu: {e}"));
                continue;
            }
        };
        if s.target_is_reference {
            // The CPU's exact mode already follows the reproducible order for nearest_centroid.
            match run_nc(s.cpu, &x, &c) {
                Ok((ei, ed)) => {
                    let same =
                        ei == ci && ed.iter().zip(&cd).all(|(a, b)| a.to_bits() == b.to_bits());
                    s.record(nc_name, &case, 0.0, if same { 0.0 } else { f64::INFINITY });
                }
                Err(e) => s.fail(nc_name, format!("{case}: {e}")),
            }
            let xs = x.logical();
            let (mut exact, mut mag, mut len) =
                (vec![0f64; m * d + m], vec![0f64; m * d + m], vec![0f64; m]);
            for i in 0..n {
                let (sg, wi) = (seg[i] as usize, w[i] as f64);
                for k in 0..d {
                    exact[sg * d + k] += wi * xs[i * d + k];
                    mag[sg * d + k] += (wi * xs[i * d + k]).abs();
                }
                exact[m * d + sg] += wi;
                mag[m * d + sg] += wi;
                len[sg] += 1.0;
            }
            let worst = (0..m * d + m)
                .map(|o| {
                    let count = if o < m * d {
                        len[o / d.max(1)]
                    } else {
                        len[o - m * d]
                    };
                    (csum[o] - exact[o]).abs() / ((count + 1.0) * 2f64.powi(-24) * mag[o] + 1e-30)
                })
                .fold(0.0, f64::max);
            s.record(seg_name, &case, 0.0, worst);
            continue;
        }
        match run_nc(&target, &x, &c) {
            Ok((ti, td)) => {
                let diff = (0..n).find(|&i| ti[i] != ci[i] || td[i].to_bits() != cd[i].to_bits());
                let detail = diff.map_or(String::new(), |i| {
                    format!(
                        " row {i}: {} at {} vs the CPU's {} at {}",
                        ti[i], td[i], ci[i], cd[i]
                    )
                });
                s.record(
                    nc_name,
                    &format!("{case}{detail}"),
                    0.0,
                    if diff.is_some() { f64::INFINITY } else { 0.0 },
                );
            }
            Err(e) => s.fail(nc_name, format!("{case}: target: {e}")),
        }
        match run_seg(&target, &x, &seg, Some(&w), m) {
            Ok(tsum) => {
                let diff = (0..tsum.len()).find(|&o| tsum[o].to_bits() != csum[o].to_bits());
                let detail = diff.map_or(String::new(), |o| {
                    format!(" element {o}: {} vs the CPU's {}", tsum[o], csum[o])
                });
                s.record(
                    seg_name,
                    &format!("{case}{detail}"),
                    0.0,
                    if diff.is_some() { f64::INFINITY } else { 0.0 },
                );
            }
            Err(e) => s.fail(seg_name, format!("{case}: target: {e}")),
        }
    }
}
