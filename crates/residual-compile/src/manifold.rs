//! Parameter blocks that live on manifolds (Ceres's `Manifold`): a unit quaternion is stored
//! as 4 numbers but moves in 3 directions.
//!
//! A block on a manifold of ambient size `a` and tangent size `t` is stored as `a` problem
//! parameters; the solver steps in its `t`-dimensional tangent space and moves the block by
//! the manifold's `plus`. The Jacobian columns of such a block are the tangent directions:
//! when a residual reads the block, it is traced on `plus(x, delta)` with `delta` symbolic,
//! differentiated with respect to `delta` and evaluated at `delta = 0`, so the compiled kernel
//! writes the tangent-space Jacobian directly (no ambient Jacobian, no product with the plus
//! Jacobian afterwards). Only the first-order part of `plus` matters there, so the traced form
//! is the linearisation (for a quaternion, `(1, delta) * q`), and the solver applies the exact
//! one ([`Manifold::plus`]) to its steps.
//!
//! [`TangentSpace`] maps a problem's parameters to the solver's columns.

use crate::trace::Var;
use std::f64::consts::PI;

/// A manifold a parameter block lives on ([`crate::Problem::set_manifold`]). Parameters that
/// are on none are Euclidean (an angle-axis rotation is a plain 3-vector, as in Ceres's
/// bundle adjuster).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Manifold {
    /// A unit quaternion stored `(w, x, y, z)` (Ceres's `QuaternionManifold`): tangent size
    /// 3, `plus(q, d) = exp(d) * q` with `exp(d) = (cos|d|, sin|d| d / |d|)`.
    Quaternion,
    /// A unit quaternion stored `(x, y, z, w)`, as Eigen and g2o store it (Ceres's
    /// `EigenQuaternionManifold`); the same `plus`.
    EigenQuaternion,
    /// An angle in radians kept in `[-pi, pi)`: `plus(a, d) = wrap(a + d)`.
    Angle,
    /// A 2D pose `(x, y, yaw)`: the position Euclidean, the yaw an [`Manifold::Angle`] (the
    /// parameterisation of Ceres's `pose_graph_2d`).
    Se2,
    /// A 3D pose `(x, y, z, qx, qy, qz, qw)`: the position Euclidean, the rotation an
    /// [`Manifold::EigenQuaternion`]; tangent `(dp, dq)`. This is the product
    /// parameterisation of Ceres's `pose_graph_3d`, not SE(3)'s coupled exponential: both
    /// reach the same minima.
    Se3,
}

impl Manifold {
    /// Parameters the block stores.
    pub fn ambient_size(self) -> usize {
        match self {
            Manifold::Quaternion | Manifold::EigenQuaternion => 4,
            Manifold::Angle => 1,
            Manifold::Se2 => 3,
            Manifold::Se3 => 7,
        }
    }

    /// Directions it moves in: its columns in the Jacobian.
    pub fn tangent_size(self) -> usize {
        match self {
            Manifold::Quaternion | Manifold::EigenQuaternion => 3,
            Manifold::Angle => 1,
            Manifold::Se2 => 3,
            Manifold::Se3 => 6,
        }
    }

    /// `out = plus(x, delta)`, exactly.
    pub fn plus(self, x: &[f64], delta: &[f64], out: &mut [f64]) {
        match self {
            Manifold::Quaternion => {
                let q = quaternion_product(exp_quaternion(delta), [x[0], x[1], x[2], x[3]]);
                out[..4].copy_from_slice(&q);
            }
            Manifold::EigenQuaternion => {
                let q = quaternion_product(exp_quaternion(delta), [x[3], x[0], x[1], x[2]]);
                out[..4].copy_from_slice(&[q[1], q[2], q[3], q[0]]);
            }
            Manifold::Angle => out[0] = wrap_angle(x[0] + delta[0]),
            Manifold::Se2 => {
                out[0] = x[0] + delta[0];
                out[1] = x[1] + delta[1];
                out[2] = wrap_angle(x[2] + delta[2]);
            }
            Manifold::Se3 => {
                for k in 0..3 {
                    out[k] = x[k] + delta[k];
                }
                Manifold::EigenQuaternion.plus(&x[3..7], &delta[3..6], &mut out[3..7]);
            }
        }
    }

    /// `out = minus(y, x)`: the tangent step `d` with `plus(x, d) = y` (Ceres's `Minus`; for
    /// a quaternion the shorter of the two rotations `y` and `-y` describe is not chosen: `y`
    /// as stored).
    pub fn minus(self, y: &[f64], x: &[f64], out: &mut [f64]) {
        match self {
            Manifold::Quaternion => {
                out[..3].copy_from_slice(&log_quaternion(quaternion_product(
                    [y[0], y[1], y[2], y[3]],
                    [x[0], -x[1], -x[2], -x[3]],
                )));
            }
            Manifold::EigenQuaternion => {
                out[..3].copy_from_slice(&log_quaternion(quaternion_product(
                    [y[3], y[0], y[1], y[2]],
                    [x[3], -x[0], -x[1], -x[2]],
                )));
            }
            Manifold::Angle => out[0] = wrap_angle(y[0] - x[0]),
            Manifold::Se2 => {
                out[0] = y[0] - x[0];
                out[1] = y[1] - x[1];
                out[2] = wrap_angle(y[2] - x[2]);
            }
            Manifold::Se3 => {
                for k in 0..3 {
                    out[k] = y[k] - x[k];
                }
                Manifold::EigenQuaternion.minus(&y[3..7], &x[3..7], &mut out[3..6]);
            }
        }
    }

    /// The first-order form of `plus(x, delta)` traced into a residual: equal to `plus` at
    /// `delta = 0` with the same derivative there.
    pub(crate) fn trace_plus<'t>(self, x: &[Var<'t>], delta: &[Var<'t>]) -> Vec<Var<'t>> {
        match self {
            Manifold::Quaternion => {
                let d = [delta[0].lit(1.0), delta[0], delta[1], delta[2]];
                quaternion_product_traced(d, [x[0], x[1], x[2], x[3]]).to_vec()
            }
            Manifold::EigenQuaternion => {
                let d = [delta[0].lit(1.0), delta[0], delta[1], delta[2]];
                let q = quaternion_product_traced(d, [x[3], x[0], x[1], x[2]]);
                vec![q[1], q[2], q[3], q[0]]
            }
            Manifold::Angle | Manifold::Se2 => x.iter().zip(delta).map(|(&a, &d)| a + d).collect(),
            Manifold::Se3 => {
                let mut out: Vec<Var<'t>> = (0..3).map(|k| x[k] + delta[k]).collect();
                out.extend(Manifold::EigenQuaternion.trace_plus(&x[3..7], &delta[3..6]));
                out
            }
        }
    }
}

/// `a` wrapped into `[-pi, pi)` (Ceres's `NormalizeAngle`).
pub fn wrap_angle(a: f64) -> f64 {
    let two_pi = 2.0 * PI;
    a - two_pi * ((a + PI) / two_pi).floor()
}

/// The Hamilton product `a * b` of quaternions stored `(w, x, y, z)`.
pub fn quaternion_product(a: [f64; 4], b: [f64; 4]) -> [f64; 4] {
    [
        a[0] * b[0] - a[1] * b[1] - a[2] * b[2] - a[3] * b[3],
        a[0] * b[1] + a[1] * b[0] + a[2] * b[3] - a[3] * b[2],
        a[0] * b[2] - a[1] * b[3] + a[2] * b[0] + a[3] * b[1],
        a[0] * b[3] + a[1] * b[2] - a[2] * b[1] + a[3] * b[0],
    ]
}

fn quaternion_product_traced<'t>(a: [Var<'t>; 4], b: [Var<'t>; 4]) -> [Var<'t>; 4] {
    [
        a[0] * b[0] - a[1] * b[1] - a[2] * b[2] - a[3] * b[3],
        a[0] * b[1] + a[1] * b[0] + a[2] * b[3] - a[3] * b[2],
        a[0] * b[2] - a[1] * b[3] + a[2] * b[0] + a[3] * b[1],
        a[0] * b[3] + a[1] * b[2] - a[2] * b[1] + a[3] * b[0],
    ]
}

/// `(cos|d|, sin|d| d / |d|)`, `(w, x, y, z)`.
fn exp_quaternion(d: &[f64]) -> [f64; 4] {
    let norm = (d[0] * d[0] + d[1] * d[1] + d[2] * d[2]).sqrt();
    if norm == 0.0 {
        return [1.0, 0.0, 0.0, 0.0];
    }
    let s = norm.sin() / norm;
    [norm.cos(), s * d[0], s * d[1], s * d[2]]
}

/// The inverse of [`exp_quaternion`] for a unit `q`.
fn log_quaternion(q: [f64; 4]) -> [f64; 3] {
    let v = (q[1] * q[1] + q[2] * q[2] + q[3] * q[3]).sqrt();
    if v == 0.0 {
        return [0.0; 3];
    }
    let theta = v.atan2(q[0]) / v;
    [theta * q[1], theta * q[2], theta * q[3]]
}

/// How a problem's parameters map to the solver's columns: a Euclidean parameter is one
/// column, a manifold block its tangent size; fixed columns are still columns (the engines
/// skip them).
#[derive(Clone, Debug)]
pub struct TangentSpace {
    /// Columns.
    pub cols: usize,
    /// Per parameter: its column (Euclidean), or for offset `j` of a manifold block the block's
    /// `j`-th tangent column (`u32::MAX` from `j = tangent size` on).
    col_of: Vec<u32>,
    /// Per column: its parameter where Euclidean, `u32::MAX` on a manifold.
    param_of_col: Vec<u32>,
    /// The manifold blocks: first parameter, first column, manifold.
    blocks: Vec<(usize, usize, Manifold)>,
    /// Per column: held at its value.
    pub fixed: Vec<bool>,
}

impl TangentSpace {
    /// The space of `n` parameters with `blocks` (first parameter, manifold; disjoint, in
    /// range) on manifolds; `fixed` per parameter (a manifold block's columns are fixed when
    /// all its parameters are; partly fixed is an error naming the block).
    pub(crate) fn new(
        n: usize,
        blocks: &[(usize, Manifold)],
        fixed: &[bool],
    ) -> Result<Self, crate::Error> {
        let mut sorted = blocks.to_vec();
        sorted.sort_by_key(|b| b.0);
        let mut col_of = vec![u32::MAX; n];
        let mut param_of_col = Vec::with_capacity(n);
        let mut fixed_cols = Vec::with_capacity(n);
        let mut placed = Vec::with_capacity(sorted.len());
        let mut next = sorted.iter().peekable();
        let mut i = 0;
        while i < n {
            if let Some(&&(first, m)) = next.peek().filter(|b| b.0 == i) {
                next.next();
                let (a, t) = (m.ambient_size(), m.tangent_size());
                let block_fixed = &fixed[first..first + a];
                let all = block_fixed.iter().all(|&f| f);
                if !all && block_fixed.iter().any(|&f| f) {
                    return Err(crate::Error::InvalidProblem(format!(
                        "the {m:?} block at parameters {first}..{} is partly fixed: fix all \
                         {a} of its parameters or none",
                        first + a
                    )));
                }
                let col = param_of_col.len();
                placed.push((first, col, m));
                for j in 0..t {
                    col_of[first + j] = (col + j) as u32;
                    param_of_col.push(u32::MAX);
                    fixed_cols.push(all);
                }
                i += a;
            } else {
                col_of[i] = param_of_col.len() as u32;
                param_of_col.push(i as u32);
                fixed_cols.push(fixed[i]);
                i += 1;
            }
        }
        Ok(Self {
            cols: param_of_col.len(),
            col_of,
            param_of_col,
            blocks: placed,
            fixed: fixed_cols,
        })
    }

    /// The problem's parameters (stored values; `cols` but for manifold blocks).
    pub fn parameters(&self) -> usize {
        self.col_of.len()
    }

    /// Whether every parameter is Euclidean (columns are parameters).
    pub fn is_identity(&self) -> bool {
        self.blocks.is_empty()
    }

    /// The column of a differentiated slot that reads parameter `index` (see `col_of`).
    pub(crate) fn col(&self, index: u32) -> u32 {
        self.col_of[index as usize]
    }

    /// Column `c`'s parameter where it is Euclidean.
    pub(crate) fn param_of_col(&self, c: usize) -> Option<usize> {
        let p = self.param_of_col[c];
        (p != u32::MAX).then_some(p as usize)
    }

    /// `out = x (+) delta`: Euclidean parameters moved by their column, manifold blocks by
    /// their `plus`.
    pub fn plus(&self, x: &[f64], delta: &[f64], out: &mut [f64]) {
        for (c, &p) in self.param_of_col.iter().enumerate() {
            if p != u32::MAX {
                out[p as usize] = x[p as usize] + delta[c];
            }
        }
        for &(first, col, m) in &self.blocks {
            let (a, t) = (m.ambient_size(), m.tangent_size());
            m.plus(
                &x[first..first + a],
                &delta[col..col + t],
                &mut out[first..first + a],
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plus_then_minus_returns_the_step() {
        let q = {
            let v = [0.3, -0.5, 0.7, 0.2];
            let n = v.iter().map(|x: &f64| x * x).sum::<f64>().sqrt();
            v.map(|x| x / n)
        };
        for m in [
            Manifold::Quaternion,
            Manifold::EigenQuaternion,
            Manifold::Angle,
            Manifold::Se2,
            Manifold::Se3,
        ] {
            let x: Vec<f64> = match m {
                Manifold::Quaternion | Manifold::EigenQuaternion => q.to_vec(),
                Manifold::Angle => vec![3.0],
                Manifold::Se2 => vec![1.0, -2.0, 3.0],
                Manifold::Se3 => [&[1.0, -2.0, 0.5][..], &q].concat(),
            };
            let d: Vec<f64> = (0..m.tangent_size())
                .map(|k| 0.1 * k as f64 - 0.12)
                .collect();
            let mut y = vec![0.0; m.ambient_size()];
            m.plus(&x, &d, &mut y);
            let mut back = vec![0.0; m.tangent_size()];
            m.minus(&y, &x, &mut back);
            for (a, b) in back.iter().zip(&d) {
                assert!((a - b).abs() < 1e-12, "{m:?}: {back:?} vs {d:?}");
            }
        }
    }

    #[test]
    fn angles_wrap_into_the_half_open_range() {
        assert_eq!(wrap_angle(PI), -PI);
        assert!((wrap_angle(3.0 * PI + 0.5) - (-PI + 0.5)).abs() < 1e-12);
        assert!((wrap_angle(-0.25) + 0.25).abs() < 1e-15);
    }
}
