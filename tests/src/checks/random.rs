//! Checks of random.

use super::*;

pub(super) fn run_random<B: Backend>(
    b: &B,
    out: &HostTensor,
    dist: Distribution,
    seed: u64,
    offset: u64,
) -> Result<Vec<f64>> {
    let ob = out.upload(b)?;
    b.random(View::new(&ob, &out.layout), dist, seed, offset)?;
    read_view(b, &ob, &out.layout)
}

/// A normal draw whose element 48789 has `u1 = 1 - 1.7e-6`, where a driver's `log` (accurate
/// to an absolute 2^-21 near 1) put it 2.5 tolerances off on lavapipe.
const NEAR_ONE: (u64, u64) = (5072403877486366138, 7892179167614304531);

pub(super) fn random<B: Backend>(s: &mut Suite<'_, B>) {
    let mut shapes = vec![vec![65537, 1]];
    shapes.extend(s.shapes(0..=3, 1 << 18));
    for (i, shape) in shapes.iter().enumerate() {
        // The first case is NEAR_ONE's, then normal and uniform alternate.
        let normal = i % 2 == 0;
        let dist = if normal {
            Distribution::Normal {
                mean: 0.5,
                std: 2.0,
            }
        } else {
            Distribution::Uniform {
                low: -1.0,
                high: 3.0,
            }
        };
        let (seed, offset) = match i {
            0 => NEAR_ONE,
            _ => (s.rng().next_u64(), s.rng().next_u64() >> 1),
        };
        let fdt = s.float_dtype();
        let out = output_tensor(s.rng(), shape, fdt);
        let exact: Vec<f64> = (0..numel(shape))
            .map(|p| {
                round_to(
                    out.dtype,
                    hal::random::random_value(dist, seed, offset + p as u64),
                ) as f64
            })
            .collect();
        let name = if normal {
            "random normal"
        } else {
            "random uniform"
        };
        let dout = out.dtype;
        match both!(s, run_random(&out, dist, seed, offset)) {
            Ok((c, t)) => {
                // Moments of large draws: the stream must also look like its distribution.
                if c.len() >= 65537 {
                    let mean = c.iter().sum::<f64>() / c.len() as f64;
                    let var = c.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / c.len() as f64;
                    let (em, ev) = if normal {
                        (0.5, 4.0)
                    } else {
                        (1.0, 16.0 / 12.0)
                    };
                    if (mean - em).abs() > 0.05 || (var / ev - 1.0).abs() > 0.05 {
                        s.fail(
                            name,
                            format!(
                                "{shape:?}: mean {mean} variance {var}, expected {em} and {ev}"
                            ),
                        );
                        continue;
                    }
                }
                // std = 2 in the normal case.
                let tol = move |_: usize, w: f64| {
                    if normal {
                        2f64.powi(-15) * 2.0 + rounding(dout, w, 2.0)
                    } else {
                        rounding(dout, w, 2.0)
                    }
                };
                s.judge(
                    name,
                    &format!("{shape:?} seed {seed} offset {offset}"),
                    &c,
                    t.as_deref(),
                    &exact,
                    &tol,
                )
            }
            Err(e) => s.fail(name, format!("{shape:?}: {e}")),
        }
    }
}
