//! Checks of nearest_centroid (single and batched) and kmeans_pp.

use super::*;

/// Runs `nearest_centroid` on `x` and `c` (rank 2, or rank 3 for a batch) and returns the
/// indices and distances group after group. A batch's outputs are point-major (`[n, g]`
/// storage seen as `[g, n]`), as a product quantiser lays out its codes.
pub(super) fn run_nc<B: Backend>(
    b: &B,
    x: &HostTensor,
    c: &HostTensor,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let (g, n) = match x.shape() {
        [g, n, _] => (*g, *n),
        shape => (1, shape[0]),
    };
    let (xb, cb) = (x.upload(b)?, c.upload(b)?);
    let (ib, db) = (b.alloc(DType::U32, g * n)?, b.alloc(DType::F32, g * n)?);
    let l = match x.shape().len() {
        3 => Layout::contiguous(&[n, g]).transpose(0, 1)?,
        _ => Layout::contiguous(&[n]),
    };
    b.nearest_centroid(
        View::new(&xb, &x.layout),
        View::new(&cb, &c.layout),
        View::new(&ib, &l),
        View::new(&db, &l),
    )?;
    let group_major = |v: Vec<f32>| -> Vec<f64> {
        (0..g * n)
            .map(|t| f64::from(v[(t % n) * g + t / n]))
            .collect()
    };
    Ok((group_major(b.read_f32(&ib)?), group_major(b.read_f32(&db)?)))
}

pub(super) fn nearest_centroid<B: Backend>(s: &mut Suite<'_, B>) {
    let mut cases: Vec<[usize; 3]> = vec![
        [0, 4, 3],
        [1, 1, 1],
        [7, 3, 7],
        [257, 16, 65],
        [65537, 8, 33],
        [300, 33, 257],
        // Tensor-core shapes (contiguous rows, d a multiple of 4): several ragged centroid
        // tiles, d at and under the held kernels' limit, and beyond it.
        [1000, 128, 300],
        [129, 96, 513],
        [200, 132, 130],
        [150, 260, 200],
    ];
    while cases.len() < s.cfg.cases + 4 {
        let r = s.rng();
        cases.push([1 + r.below(500), 1 + r.below(40), 1 + r.below(100)]);
    }
    for [n, d, m] in cases {
        // The tensor-core shapes keep contiguous rows, so those kernels surely run.
        let (dt, kind) = match d {
            96.. => (DType::F32, ViewKind::Contiguous),
            _ => (s.float_dtype(), s.kind()),
        };
        let x = random_tensor(s.rng(), &[n, d], dt, kind, |r| r.range(-1.0, 1.0));
        let mut c = random_tensor(s.rng(), &[m, d], dt, ViewKind::Contiguous, |r| {
            r.range(-1.0, 1.0)
        });
        if m >= 3 {
            // A duplicated centroid: the lower index must win the tie.
            let (src, dst) = (s.rng().below(m / 2), m / 2 + s.rng().below(m - m / 2));
            for k in 0..d {
                c.backing[dst * d + k] = c.backing[src * d + k];
            }
        }
        let (xs, cs) = (x.logical(), c.logical());
        match both!(s, run_nc(&x, &c)) {
            Ok(((ci, cd), t)) => {
                let case = format!("n={n} d={d} m={m} {dt} {kind:?}");
                let reference = t.as_ref().map(|_| ci.as_slice());
                let (gi, gd) = t.as_ref().map_or((&ci, &cd), |(ti, td)| (ti, td));
                let got = (gi.as_slice(), gd.as_slice());
                let (worst, worst_rel, worst_case) =
                    judge_nearest(s.policy, &xs, &cs, [n, d, m], got, reference);
                s.record(
                    nearest_row(s.policy),
                    &format!("{case} {worst_case}"),
                    worst_rel,
                    worst,
                );
            }
            Err(e) => s.fail("nearest_centroid", format!("n={n} d={d} m={m}: {e}")),
        }
    }
}

/// The table row a nearest-centroid check reports under.
pub(super) fn nearest_row(policy: hal::Precision) -> &'static str {
    if policy == hal::Precision::Fast {
        "nearest_centroid (Precision::Fast)"
    } else {
        "nearest_centroid"
    }
}

/// Judges nearest-centroid results `got` (indices, distances) for the points `xs: [n, d]`
/// among `cs: [m, d]` (float64, row-major): for every row, the chosen centroid's exact
/// distance must be within tolerance of the best one's (the reference's choice when
/// `reference` gives the CPU's indices), the reported distance within tolerance of the exact
/// one, and an exact tie between duplicate centroids must go to the lower index. Returns the
/// worst tolerance ratio, the worst relative distance error and the worst row's description.
pub(super) fn judge_nearest(
    policy: hal::Precision,
    xs: &[f64],
    cs: &[f64],
    [n, d, m]: [usize; 3],
    (gi, gd): (&[f64], &[f64]),
    reference: Option<&[f64]>,
) -> (f64, f64, String) {
    let dist = |i: usize, j: usize| -> f64 {
        (0..d)
            .map(|k| (xs[i * d + k] - cs[j * d + k]).powi(2))
            .sum()
    };
    let norm = |v: &[f64], i: usize| -> f64 { (0..d).map(|k| v[i * d + k].powi(2)).sum() };
    let cmax = (0..m).map(|j| norm(cs, j)).fold(0.0, f64::max);
    let (mut worst, mut worst_rel, mut worst_case) = (0f64, 0f64, String::new());
    // Precision::Fast may pick a centroid up to 2^-9 (|x|^2 + |c|^2) worse.
    let choice = if policy == hal::Precision::Fast {
        2f64.powi(-9)
    } else {
        2f64.powi(-16)
    };
    for i in 0..n {
        let tol = 2f64.powi(-16) * (norm(xs, i) + cmax);
        let choice_tol = choice * (norm(xs, i) + cmax);
        let j = gi[i] as usize;
        let reference_j = match reference {
            Some(ci) => ci[i] as usize,
            None => (0..m)
                .min_by(|&a, &b| dist(i, a).total_cmp(&dist(i, b)))
                .unwrap_or(0),
        };
        let best = dist(i, reference_j);
        let chosen = if j < m { dist(i, j) } else { f64::INFINITY };
        let mut over = ((chosen - best).max(0.0) / choice_tol).max((gd[i] - chosen).abs() / tol);
        if chosen == best
            && j > reference_j
            && (0..d).all(|k| cs[j * d + k] == cs[reference_j * d + k])
        {
            over = f64::INFINITY; // a duplicate centroid not resolved to the lower index
        }
        worst_rel = worst_rel.max((gd[i] - best).abs() / best.max(2f64.powi(-20)));
        if over > worst {
            worst = over;
            worst_case = format!(
                "row {i}: index {j} (distance {}) vs {reference_j} (distance {best})",
                gd[i]
            );
        }
    }
    (worst, worst_rel, worst_case)
}

pub(super) fn run_kmeans_pp<B: Backend>(
    b: &B,
    x: &[f32],
    [n, d, m]: [usize; 3],
    seed: u64,
) -> Result<Vec<f64>> {
    let xb = b.upload(x)?;
    let anchors = b.alloc(DType::F32, m * d)?;
    b.kmeans_pp(
        View::new(&xb, &Layout::contiguous(&[n, d])),
        View::new(&anchors, &Layout::contiguous(&[m, d])),
        seed,
    )?;
    Ok(b.read::<f32>(&anchors)?
        .into_iter()
        .map(f64::from)
        .collect())
}

/// The row of `x` each anchor is (`None` where an anchor is no row).
pub(super) fn anchor_rows(x: &[f32], anchors: &[f64], d: usize) -> Vec<Option<usize>> {
    anchors
        .chunks(d.max(1))
        .map(|a| {
            x.chunks(d.max(1))
                .position(|r| r.iter().zip(a).all(|(&v, &w)| v as f64 == w))
        })
        .collect()
}

/// k-means++ seeding: every anchor a row of `x`, no row twice, and the target's picks the
/// reference's until a step where the two picks' race keys (recomputed in float64 from the
/// shared anchors so far and the uniform stream) lie within the distance tolerance of each
/// other; from there on the two runs legitimately differ. Keys' tolerance: `2^-12` relative
/// (distances of up to a few hundred coordinates summed in f32 in different orders).
pub(super) fn kmeans_pp<B: Backend>(s: &mut Suite<'_, B>) {
    let mut cases: Vec<[usize; 3]> = vec![
        [1, 3, 1],
        [7, 2, 7],
        [300, 5, 23],
        [2000, 128, 64],
        [999, 50, 40],
        [513, 300, 9],
        [1500, 768, 30],
        // Fewer slices of points than coordinates: the sliced step's copy of each anchor's
        // row needs threads of its own.
        [11, 57, 9],
    ];
    while cases.len() < s.cfg.cases.min(4) + 7 {
        let r = s.rng();
        let n = 1 + r.below(3000);
        cases.push([n, 1 + r.below(160), 1 + r.below(n.min(80))]);
    }
    for [n, d, m] in cases {
        // Points in a few loose clusters, as seeding meets them.
        let centres: Vec<f32> = (0..8 * d).map(|_| s.rng().range(-4.0, 4.0)).collect();
        let x: Vec<f32> = (0..n * d)
            .map(|i| centres[(i / d % 8) * d + i % d] + s.rng().range(-1.0, 1.0))
            .collect();
        let seed = s.rng().next_u64();
        let case = format!("n={n} d={d} m={m} seed={seed}");
        let (cpu, target) = match both!(s, run_kmeans_pp(&x, [n, d, m], seed)) {
            Ok(r) => r,
            Err(e) => {
                s.fail("kmeans_pp", format!("{case}: {e}"));
                continue;
            }
        };
        let got = target.as_ref().unwrap_or(&cpu);
        let (picked, reference) = (anchor_rows(&x, got, d), anchor_rows(&x, &cpu, d));
        let mut rows = std::collections::HashSet::new();
        if let Some(j) = (0..m).find(|&j| picked[j].is_none_or(|r| !rows.insert(r))) {
            s.fail(
                "kmeans_pp",
                format!("{case}: anchor {j} is not a new row of x ({:?})", picked[j]),
            );
            continue;
        }
        let mut over = 0.0f64;
        if let Some(j) = (0..m).find(|&j| picked[j] != reference[j]) {
            // D^2 to the anchors both placed, then each pick's key.
            let row = |i: usize| &x[i * d..(i + 1) * d];
            let d2 = |i: usize| -> f64 {
                reference[..j]
                    .iter()
                    .map(|a| {
                        let a = row(a.expect("checked"));
                        row(i)
                            .iter()
                            .zip(a)
                            .map(|(&p, &q)| (p as f64 - q as f64).powi(2))
                            .sum::<f64>()
                    })
                    .fold(f64::INFINITY, f64::min)
            };
            let key = |i: usize| -> f64 {
                let u = hal::random::random_value(
                    hal::Distribution::Uniform {
                        low: 0.0,
                        high: 1.0,
                    },
                    seed,
                    (j * n + i) as u64,
                );
                if j == 0 {
                    return u as f64;
                }
                -(u.max(f32::MIN_POSITIVE) as f64).ln() / d2(i)
            };
            let (ours, theirs) = (
                key(picked[j].expect("checked")),
                key(reference[j].expect("checked")),
            );
            over = (ours / theirs - 1.0).abs() / 2f64.powi(-12);
        }
        s.record("kmeans_pp", &case, 0.0, over);
    }
}

/// Batched searches (`x: [g, n, d]` against `centroids: [g, m, d]`): each group's results
/// judged against its own centroids as the unbatched search is, on any view of the points,
/// with a duplicated centroid in every group.
pub(super) fn nearest_centroid_batched<B: Backend>(s: &mut Suite<'_, B>) {
    let mut cases: Vec<[usize; 4]> = vec![
        [1, 1, 1, 1],
        [3, 0, 4, 5],
        [16, 1000, 8, 256],
        [3, 257, 5, 33],
        [5, 300, 20, 9],
        [2, 129, 3, 1],
        [4, 70, 67, 40],
        [6, 90, 13, 300],
    ];
    while cases.len() < s.cfg.cases.min(6) + 8 {
        let r = s.rng();
        cases.push([
            1 + r.below(20),
            1 + r.below(300),
            1 + r.below(24),
            1 + r.below(100),
        ]);
    }
    for [g, n, d, m] in cases {
        let (dt, kind) = (s.float_dtype(), s.kind());
        let x = random_tensor(s.rng(), &[g, n, d], dt, kind, |r| r.range(-1.0, 1.0));
        let mut c = random_tensor(s.rng(), &[g, m, d], dt, ViewKind::Contiguous, |r| {
            r.range(-1.0, 1.0)
        });
        if m >= 3 {
            for group in 0..g {
                let (src, dst) = (s.rng().below(m / 2), m / 2 + s.rng().below(m - m / 2));
                let base = group * m * d;
                for k in 0..d {
                    c.backing[base + dst * d + k] = c.backing[base + src * d + k];
                }
            }
        }
        let (xs, cs) = (x.logical(), c.logical());
        let case = format!("g={g} n={n} d={d} m={m} {dt} {kind:?}");
        match both!(s, run_nc(&x, &c)) {
            Ok(((ci, cd), t)) => {
                let (gi, gd) = t.as_ref().map_or((&ci, &cd), |(ti, td)| (ti, td));
                let (mut worst, mut worst_rel, mut worst_case) = (0f64, 0f64, String::new());
                for group in 0..g {
                    let rows = group * n..(group + 1) * n;
                    let reference = t.as_ref().map(|_| &ci[rows.clone()]);
                    let (w, r, case) = judge_nearest(
                        s.policy,
                        &xs[group * n * d..(group + 1) * n * d],
                        &cs[group * m * d..(group + 1) * m * d],
                        [n, d, m],
                        (&gi[rows.clone()], &gd[rows]),
                        reference,
                    );
                    worst_rel = worst_rel.max(r);
                    if w > worst {
                        (worst, worst_case) = (w, format!("group {group} {case}"));
                    }
                }
                s.record(
                    "nearest_centroid (batched)",
                    &format!("{case} {worst_case}"),
                    worst_rel,
                    worst,
                );
            }
            Err(e) => s.fail("nearest_centroid (batched)", format!("{case}: {e}")),
        }
    }
}
