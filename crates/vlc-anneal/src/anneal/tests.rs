use super::maintain::{merge_close, sq_dist};
use super::*;

/// The device's maintenance check flags every round the host would act on: an empty
/// anchor, or a pair closer than the merge radius, including pairs a hair inside it
/// (and it stays quiet when neither holds, with pairs a little outside).
#[test]
fn maintenance_check_flags_what_the_host_would_merge_or_refill() {
    let b = backend_cpu::CpuBackend::new();
    let (n, d, m, merge) = (1000usize, 7, 19, 0.05f64);
    let kernel = b
        .compile(&maintenance_check_program(m, d).unwrap())
        .unwrap();
    let limits = b.upload(&maintenance_limits(n, merge as f32)).unwrap();
    let mut rng = 0x1234_5678_9abc_def0u64;
    let mut uniform = || {
        rng = crate::splitmix(rng);
        (rng >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut seen = [0usize; 2];
    for case in 0..60 {
        let mut anchors: Vec<f32> = (0..m * d).map(|_| (uniform() * 4.0 - 2.0) as f32).collect();
        let mut counts = vec![3.0f32; m];
        let total = (uniform() * 50.0 + 1.0) as f32;
        let radius2 = merge * merge * (total as f64 / n as f64);
        match case % 4 {
            // An empty anchor.
            0 => counts[(uniform() * m as f64) as usize] = 0.0,
            // A pair just inside or just outside the radius, along one axis.
            1 | 2 => {
                let (i, j) = (3, 11);
                let factor = if case % 4 == 1 { 0.999 } else { 1.01 };
                let gap = (radius2.sqrt() * factor) as f32;
                for k in 0..d {
                    anchors[j * d + k] = anchors[i * d + k];
                }
                anchors[j * d] += gap;
            }
            _ => {}
        }
        let host_work = counts.contains(&0.0)
            || (0..m).any(|i| {
                (i + 1..m).any(|j| {
                    sq_dist(&anchors[i * d..(i + 1) * d], &anchors[j * d..(j + 1) * d])
                        < merge * merge * (total as f64 / n as f64).max(f64::MIN_POSITIVE)
                })
            });
        let flags = b.alloc(DType::F32, 1025).unwrap();
        let args = [
            b.upload(&anchors).unwrap(),
            b.upload(&counts).unwrap(),
            b.upload(&[total]).unwrap(),
        ];
        b.launch(
            &kernel,
            &[&args[0], &args[1], &args[2], &limits, &flags],
            m * m,
        )
        .unwrap();
        let flagged = b.read::<f32>(&flags).unwrap()[0] > 0.0;
        assert_eq!(flagged, host_work, "case {case}");
        seen[host_work as usize] += 1;
    }
    assert!(seen[0] > 10 && seen[1] > 10, "{seen:?}");
}

/// k-means++ gives the same anchors whether its uniform draws come a step at a time, a
/// few steps at a time (a partial last block) or all at once, and each anchor is one of
/// the points.
#[test]
fn kmeans_pp_draw_blocks_do_not_change_the_anchors() {
    let b = backend_cpu::CpuBackend::new();
    let (n, d, m) = (300, 5, 23);
    let data = crate::synthetic::gaussian_mixture(n, d, 7, 0.3, 11);
    let x = b.upload(&data.data).unwrap();
    let run = |block| {
        let anchors = b.alloc(DType::F32, m * d).unwrap();
        hal::seeding::kmeans_pp_in_blocks(&b, &x, &anchors, [n, d, m], 5, block).unwrap();
        b.read::<f32>(&anchors).unwrap()
    };
    let whole = run(m);
    assert_eq!(run(1), whole);
    assert_eq!(run(4), whole);
    // Blocks that several-step recordings fit in, and some steps that are left over.
    assert_eq!(run(9), whole);
    for anchor in whole.chunks(d) {
        assert!(data.data.chunks(d).any(|p| p == anchor), "{anchor:?}");
    }
    // Distinct anchors: k-means++ never draws a point already taken (its D^2 is 0).
    for (i, a) in whole.chunks(d).enumerate() {
        assert!(whole.chunks(d).skip(i + 1).all(|c| c != a));
    }
}

/// The merge rule by comparing every two anchors, as `merge_close` must decide it.
fn merge_all_pairs(
    anchors: &mut [f32],
    d: usize,
    counts: &mut [f32],
    gone: &mut [bool],
    merge2: f64,
) -> usize {
    let m = counts.len();
    let mut merged = 0;
    for i in 0..m {
        if gone[i] {
            continue;
        }
        let mut best: Option<(usize, f64)> = None;
        for j in i + 1..m {
            let dj = sq_dist(&anchors[i * d..(i + 1) * d], &anchors[j * d..(j + 1) * d]);
            if !gone[j] && dj < merge2 && best.is_none_or(|(_, bd)| dj < bd) {
                best = Some((j, dj));
            }
        }
        if let Some((j, _)) = best {
            let (ci, cj) = (counts[i] as f64, counts[j] as f64);
            for k in 0..d {
                let v =
                    (anchors[i * d + k] as f64 * ci + anchors[j * d + k] as f64 * cj) / (ci + cj);
                anchors[i * d + k] = v as f32;
            }
            counts[i] += counts[j];
            counts[j] = 0.0;
            gone[j] = true;
            merged += 1;
        }
    }
    merged
}

#[test]
fn merging_by_sorted_neighbours_matches_all_pairs() {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |t| t.as_nanos() as u64);
    eprintln!("anchor seed {seed}");
    for (round, (m, d, radius)) in [(300, 8, 0.3), (200, 3, 0.6), (64, 16, 5.0), (1, 4, 1.0)]
        .into_iter()
        .enumerate()
    {
        // Anchors on a coarse grid plus noise, so many pairs fall near the radius, and a
        // few exact duplicates for ties.
        let s = seed.wrapping_add(round as u64);
        let mut anchors: Vec<f32> = (0..m * d)
            .map(|i| {
                let u = hal::random::random_value(
                    hal::Distribution::Uniform {
                        low: 0.0,
                        high: 1.0,
                    },
                    s,
                    i as u64,
                );
                (u * 4.0).floor() * 0.5 + u * 0.2
            })
            .collect();
        for j in (0..m).step_by(17).skip(1) {
            let (head, tail) = anchors.split_at_mut(j * d);
            tail[..d].copy_from_slice(&head[(j - 1) * d..j * d]);
        }
        let counts: Vec<f32> = (0..m).map(|j| 1.0 + (j % 5) as f32).collect();
        let gone: Vec<bool> = (0..m).map(|j| j % 11 == 3).collect();
        let merge2: f64 = radius * radius;
        let (mut a1, mut c1, mut g1) = (anchors.clone(), counts.clone(), gone.clone());
        let mut sse = vec![1.0; m];
        let mut free = Vec::new();
        let n1 = merge_close(&mut a1, d, &mut c1, &mut sse, &mut g1, &mut free, merge2);
        let (mut a2, mut c2, mut g2) = (anchors, counts, gone);
        let n2 = merge_all_pairs(&mut a2, d, &mut c2, &mut g2, merge2);
        assert_eq!(n1, n2, "seed {s}: merge counts");
        assert!(m < 10 || n1 > 0, "seed {s}: the case merges nothing");
        assert_eq!(g1, g2, "seed {s}");
        assert_eq!(c1, c2, "seed {s}");
        assert_eq!(a1, a2, "seed {s}");
        assert_eq!(free.len(), n1);
    }
}
