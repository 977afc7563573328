//! Pose-graph optimisation (SLAM back ends): poses in 2D or 3D joined by relative-pose
//! measurements, read from g2o files ([`g2o`]) and solved as a [`Problem`] with the residuals
//! of Ceres's `pose_graph_2d` and `pose_graph_3d` examples, so costs compare with Ceres's on
//! the same files.
//!
//! - 2D: a pose `(x, y, yaw)` on [`Manifold::Se2`]; an edge `a -> b` measuring
//!   `(dx, dy, dyaw)` has the residual `S [R(yaw_a)^T (p_b - p_a) - d_p ;
//!   wrap(yaw_b - yaw_a - dyaw)]`.
//! - 3D: a pose `(x, y, z, qx, qy, qz, qw)` on [`Manifold::Se3`]; an edge measuring
//!   `(p_ab, q_ab)` has the residual `S [q_a^-1 (p_b - p_a) - p_ab ;
//!   2 vec(q_ab (q_a^-1 q_b)^-1)]`.
//!
//! `S` is the lower Cholesky factor of the edge's information matrix, applied as `S r` (the
//! weight is `S^T S`, which is the information matrix only where it is diagonal: Ceres's
//! convention, kept to reach its costs). The first pose (the smallest id) is held constant.

pub mod g2o;

use crate::Error;
use crate::manifold::Manifold;
use crate::problem::{Loss, Problem};
use crate::trace::{Var, Vec3};

pub use g2o::G2oError;

/// 2D or 3D poses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoseKind {
    /// `(x, y, yaw)`.
    Se2,
    /// `(x, y, z, qx, qy, qz, qw)`.
    Se3,
}

impl PoseKind {
    /// Numbers per pose.
    pub fn pose_len(self) -> usize {
        match self {
            PoseKind::Se2 => 3,
            PoseKind::Se3 => 7,
        }
    }

    /// Residuals per edge (the tangent size).
    pub fn tangent_len(self) -> usize {
        match self {
            PoseKind::Se2 => 3,
            PoseKind::Se3 => 6,
        }
    }

    fn name(self) -> &'static str {
        match self {
            PoseKind::Se2 => "SE2",
            PoseKind::Se3 => "SE3:QUAT",
        }
    }

    fn manifold(self) -> Manifold {
        match self {
            PoseKind::Se2 => Manifold::Se2,
            PoseKind::Se3 => Manifold::Se3,
        }
    }
}

/// A relative-pose measurement between poses `a` and `b` (indices into the graph's poses).
#[derive(Clone, Debug, PartialEq)]
pub struct Edge {
    pub a: usize,
    pub b: usize,
    /// The pose of `b` in `a`'s frame, in the pose layout.
    pub measurement: Vec<f64>,
    /// `S`, row-major `d x d` lower triangular (`d` the tangent size).
    pub sqrt_information: Vec<f64>,
}

/// Poses and the edges between them.
#[derive(Clone, Debug, PartialEq)]
pub struct PoseGraph {
    pub kind: PoseKind,
    /// The file's vertex ids, ascending; pose `i` is vertex `ids[i]`.
    pub ids: Vec<i64>,
    /// `[pose * pose_len + k]`.
    pub poses: Vec<f64>,
    pub edges: Vec<Edge>,
}

impl PoseGraph {
    /// Reads a g2o file ([`g2o::parse`]).
    pub fn read(path: &std::path::Path) -> Result<Self, G2oError> {
        g2o::read(path)
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The least-squares problem: one parameter block per pose, on its manifold, the first
    /// fixed, one residual block per edge (all edges one compiled kernel: measurement and
    /// `S` are per-edge constants).
    pub fn problem(&self) -> Result<Problem, Error> {
        let len = self.kind.pose_len();
        let mut problem = Problem::new();
        problem.add_parameters(&self.poses);
        for i in 0..self.len() {
            problem.set_manifold(i * len, self.kind.manifold())?;
        }
        for k in 0..len {
            problem.set_fixed(k, true)?;
        }
        let d = self.kind.tangent_len();
        let lower = d * (d + 1) / 2;
        let mut params = Vec::with_capacity(self.edges.len() * 2 * len);
        let mut constants = Vec::with_capacity(self.edges.len() * (len + lower));
        for e in &self.edges {
            params.extend(e.a * len..(e.a + 1) * len);
            params.extend(e.b * len..(e.b + 1) * len);
            constants.extend_from_slice(&e.measurement);
            for i in 0..d {
                constants.extend_from_slice(&e.sqrt_information[i * d..i * d + i + 1]);
            }
        }
        match self.kind {
            PoseKind::Se2 => problem.add_residuals(
                "edge_se2",
                2 * len,
                &params,
                len + lower,
                &constants,
                Loss::Trivial,
                se2_residual,
            )?,
            PoseKind::Se3 => problem.add_residuals(
                "edge_se3",
                2 * len,
                &params,
                len + lower,
                &constants,
                Loss::Trivial,
                se3_residual,
            )?,
        };
        Ok(problem)
    }
}

/// `S r` for `S` lower triangular given row by row in `s` (its lower triangle only).
fn apply_lower<'t>(s: &[Var<'t>], r: &[Var<'t>]) -> Vec<Var<'t>> {
    let mut out = Vec::with_capacity(r.len());
    let mut k = 0;
    for i in 0..r.len() {
        let mut acc = s[k] * r[0];
        for (j, &rj) in r.iter().enumerate().take(i + 1).skip(1) {
            acc = acc + s[k + j] * rj;
        }
        k += i + 1;
        out.push(acc);
    }
    out
}

/// Ceres's `PoseGraph2dErrorTerm`: `v` = pose a, pose b; `c` = measurement, `S`.
fn se2_residual<'t>(v: &[Var<'t>], c: &[Var<'t>]) -> Vec<Var<'t>> {
    let (xa, ya, ta, xb, yb, tb) = (v[0], v[1], v[2], v[3], v[4], v[5]);
    let (dx, dy) = (xb - xa, yb - ya);
    let (cos, sin) = (ta.cos(), ta.sin());
    let angle = tb - ta - c[2];
    let r = [
        cos * dx + sin * dy - c[0],
        -sin * dx + cos * dy - c[1],
        // wrap(angle) into (-pi, pi], whose derivative is 1.
        angle.sin().atan2(angle.cos()),
    ];
    apply_lower(&c[3..], &r)
}

/// `v` rotated by the unit quaternion `(x, y, z, w)` (Eigen's formula).
fn rotate<'t>(q: [Var<'t>; 4], v: Vec3<'t>) -> Vec3<'t> {
    let u = Vec3::new(q[0], q[1], q[2]);
    let t = u.cross(v) * 2.0;
    v + t * q[3] + u.cross(t)
}

/// The Hamilton product of quaternions stored `(x, y, z, w)`.
fn product<'t>(a: [Var<'t>; 4], b: [Var<'t>; 4]) -> [Var<'t>; 4] {
    [
        a[3] * b[0] + a[0] * b[3] + a[1] * b[2] - a[2] * b[1],
        a[3] * b[1] - a[0] * b[2] + a[1] * b[3] + a[2] * b[0],
        a[3] * b[2] + a[0] * b[1] - a[1] * b[0] + a[2] * b[3],
        a[3] * b[3] - a[0] * b[0] - a[1] * b[1] - a[2] * b[2],
    ]
}

/// Ceres's `PoseGraph3dErrorTerm`: `v` = pose a, pose b; `c` = measurement, `S`.
fn se3_residual<'t>(v: &[Var<'t>], c: &[Var<'t>]) -> Vec<Var<'t>> {
    let pa = Vec3::new(v[0], v[1], v[2]);
    let qa_inv = [-v[3], -v[4], -v[5], v[6]];
    let pb = Vec3::new(v[7], v[8], v[9]);
    let qb = [v[10], v[11], v[12], v[13]];
    let q_ab = product(qa_inv, qb);
    let p_ab = rotate(qa_inv, pb - pa);
    let measured = [c[3], c[4], c[5], c[6]];
    let delta = product(measured, [-q_ab[0], -q_ab[1], -q_ab[2], q_ab[3]]);
    let r = [
        p_ab.x - c[0],
        p_ab.y - c[1],
        p_ab.z - c[2],
        delta[0] * 2.0,
        delta[1] * 2.0,
        delta[2] * 2.0,
    ];
    apply_lower(&c[7..], &r)
}
