//! Bundle adjustment in the Large (BAL) problems: cameras and points from the BAL text
//! format, solved with the residual of Ceres's `bundle_adjuster`
//! (`snavely_reprojection_error.h`), and the result written as a PLY point cloud.
//!
//! A BAL file is a header `cameras points observations`, one line per observation
//! `camera point x y`, then 9 numbers per camera (angle-axis rotation, translation, focal
//! length, radial distortion `k1 k2`) and 3 per point. The residual of an observation is
//! `f (1 + k1 |p|^2 + k2 |p|^4) p - (x, y)` with `p = -P.xy / P.z` and `P = R X + t`:
//! cameras are plain 9-vectors (the angle-axis is Euclidean, as in Ceres's example).

use crate::Error;
use crate::problem::{Loss, Problem};
use crate::trace::{Var, Vec3};
use std::fmt;
use std::io::Write;
use std::path::Path;

/// Numbers per camera and per point.
pub const CAMERA_LEN: usize = 9;
pub const POINT_LEN: usize = 3;

/// A BAL problem as read.
#[derive(Clone, Debug, PartialEq)]
pub struct BalProblem {
    /// `[camera * 9 + k]`.
    pub cameras: Vec<f64>,
    /// `[point * 3 + k]`.
    pub points: Vec<f64>,
    /// Per observation: camera, point.
    pub observations: Vec<(u32, u32)>,
    /// Per observation: the measured `(x, y)`.
    pub measurements: Vec<[f64; 2]>,
}

/// A BAL file that cannot be read: where (the 1-based line; 0 for the whole file) and why.
#[derive(Debug, Clone, PartialEq)]
pub struct BalError {
    pub line: usize,
    pub message: String,
}

impl fmt::Display for BalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "BAL: {}", self.message)
        } else {
            write!(f, "BAL line {}: {}", self.line, self.message)
        }
    }
}

impl std::error::Error for BalError {}

/// Whitespace-separated tokens with the line each is on.
struct Tokens<'a> {
    lines: std::iter::Enumerate<std::str::Lines<'a>>,
    current: std::str::SplitWhitespace<'a>,
    line: usize,
}

impl<'a> Tokens<'a> {
    fn new(text: &'a str) -> Self {
        Self {
            lines: text.lines().enumerate(),
            current: "".split_whitespace(),
            line: 0,
        }
    }

    fn next(&mut self, what: &str) -> Result<&'a str, BalError> {
        loop {
            if let Some(t) = self.current.next() {
                return Ok(t);
            }
            match self.lines.next() {
                Some((n, l)) => {
                    self.line = n + 1;
                    self.current = l.split_whitespace();
                }
                None => {
                    return Err(BalError {
                        line: self.line,
                        message: format!("the file ends where {what} should be"),
                    });
                }
            }
        }
    }

    fn error(&self, message: String) -> BalError {
        BalError {
            line: self.line,
            message,
        }
    }

    fn count(&mut self, what: &str) -> Result<usize, BalError> {
        let t = self.next(what)?;
        t.parse::<u32>()
            .map(|v| v as usize)
            .map_err(|_| self.error(format!("{what}: '{t}' is not a count")))
    }

    fn number(&mut self, what: &str) -> Result<f64, BalError> {
        let t = self.next(what)?;
        match t.parse::<f64>() {
            Ok(v) if v.is_finite() => Ok(v),
            Ok(_) => Err(self.error(format!("{what}: '{t}' is not finite"))),
            Err(_) => Err(self.error(format!("{what}: '{t}' is not a number"))),
        }
    }
}

impl BalProblem {
    /// Reads a BAL file.
    pub fn read(path: &Path) -> Result<Self, BalError> {
        let text = std::fs::read_to_string(path).map_err(|e| BalError {
            line: 0,
            message: format!("cannot read {}: {e}", path.display()),
        })?;
        Self::parse(&text)
    }

    /// Parses BAL text; an index out of range, a token that is not a number, a missing or
    /// extra value is an error naming its line.
    pub fn parse(text: &str) -> Result<Self, BalError> {
        let mut t = Tokens::new(text);
        let cameras = t.count("the number of cameras")?;
        let points = t.count("the number of points")?;
        let n_obs = t.count("the number of observations")?;
        if cameras == 0 || points == 0 || n_obs == 0 {
            return Err(t.error(format!(
                "{cameras} cameras, {points} points, {n_obs} observations: none may be 0"
            )));
        }
        // Bounded by the text's own size (each value takes at least 2 bytes), so a forged
        // header cannot reserve much.
        let budget = text.len() / 2;
        if n_obs * 4 + cameras * CAMERA_LEN + points * POINT_LEN > budget {
            return Err(t.error(format!(
                "the header promises {cameras} cameras, {points} points and {n_obs} \
                 observations; the file is too short to hold them"
            )));
        }
        let mut observations = Vec::with_capacity(n_obs);
        let mut measurements = Vec::with_capacity(n_obs);
        for i in 0..n_obs {
            let what = format!("observation {i}");
            let c = t.count(&what)?;
            let p = t.count(&what)?;
            if c >= cameras || p >= points {
                return Err(t.error(format!(
                    "observation {i} names camera {c} and point {p}; the file has {cameras} \
                     cameras and {points} points"
                )));
            }
            observations.push((c as u32, p as u32));
            measurements.push([t.number(&what)?, t.number(&what)?]);
        }
        let mut read = |n: usize, what: &str| -> Result<Vec<f64>, BalError> {
            (0..n)
                .map(|i| t.number(&format!("{what} value {i}")))
                .collect()
        };
        let cameras = read(cameras * CAMERA_LEN, "camera")?;
        let points = read(points * POINT_LEN, "point")?;
        if let Ok(extra) = t.next("") {
            return Err(t.error(format!("'{extra}' after the last point")));
        }
        Ok(Self {
            cameras,
            points,
            observations,
            measurements,
        })
    }

    pub fn num_cameras(&self) -> usize {
        self.cameras.len() / CAMERA_LEN
    }

    pub fn num_points(&self) -> usize {
        self.points.len() / POINT_LEN
    }

    /// The least-squares problem: cameras first (9 parameters each), then points (3 each,
    /// declared for elimination: [`Problem::set_eliminated`]); one residual block of 2 per
    /// observation, all one compiled kernel.
    pub fn problem(&self, loss: Loss) -> Result<Problem, Error> {
        let mut problem = Problem::new();
        problem.add_parameters(&self.cameras);
        let first_point = problem.add_parameters(&self.points);
        let mut params = Vec::with_capacity(self.observations.len() * 12);
        for &(c, p) in &self.observations {
            let (c, p) = (c as usize, p as usize);
            params.extend(c * CAMERA_LEN..(c + 1) * CAMERA_LEN);
            params.extend(first_point + p * POINT_LEN..first_point + (p + 1) * POINT_LEN);
        }
        problem.set_eliminated(first_point, POINT_LEN, self.num_points())?;
        let constants: Vec<f64> = self.measurements.iter().flatten().copied().collect();
        problem.add_residuals(
            "reprojection",
            CAMERA_LEN + POINT_LEN,
            &params,
            2,
            &constants,
            loss,
            snavely_reprojection,
        )?;
        Ok(problem)
    }

    /// Writes the points (and the camera centres, in red) as an ASCII PLY file, atomically;
    /// `parameters` in [`BalProblem::problem`]'s layout.
    pub fn write_ply(&self, parameters: &[f64], path: &Path) -> std::io::Result<()> {
        let (cameras, points) = parameters.split_at(self.cameras.len());
        hal::durable::write_atomic(path, |w| {
            writeln!(w, "ply\nformat ascii 1.0")?;
            writeln!(
                w,
                "element vertex {}",
                self.num_cameras() + self.num_points()
            )?;
            writeln!(w, "property float x\nproperty float y\nproperty float z")?;
            writeln!(
                w,
                "property uchar red\nproperty uchar green\nproperty uchar blue\nend_header"
            )?;
            for cam in cameras.chunks_exact(CAMERA_LEN) {
                // The centre is -R^T t.
                let minus_t = [-cam[3], -cam[4], -cam[5]];
                let c = rotate_f64([-cam[0], -cam[1], -cam[2]], minus_t);
                writeln!(w, "{} {} {} 255 0 0", c[0], c[1], c[2])?;
            }
            for p in points.chunks_exact(POINT_LEN) {
                writeln!(w, "{} {} {} 255 255 255", p[0], p[1], p[2])?;
            }
            Ok(())
        })
    }
}

/// `a x b`.
fn cross(a: [f64; 3], b: [f64; 3]) -> [f64; 3] {
    [
        a[1] * b[2] - a[2] * b[1],
        a[2] * b[0] - a[0] * b[2],
        a[0] * b[1] - a[1] * b[0],
    ]
}

/// `p` rotated by the angle-axis `w` (Rodrigues), in `f64`.
fn rotate_f64(w: [f64; 3], p: [f64; 3]) -> [f64; 3] {
    let theta = (w[0] * w[0] + w[1] * w[1] + w[2] * w[2]).sqrt();
    if theta < 1e-12 {
        let c = cross(w, p);
        return [p[0] + c[0], p[1] + c[1], p[2] + c[2]];
    }
    let k = w.map(|v| v / theta);
    let (c, s) = (theta.cos(), theta.sin());
    let kxp = cross(k, p);
    let kp = k[0] * p[0] + k[1] * p[1] + k[2] * p[2];
    [0, 1, 2].map(|i| p[i] * c + kxp[i] * s + k[i] * kp * (1.0 - c))
}

/// `p` rotated by the angle-axis `w` (Ceres's `AngleAxisRotatePoint`): Rodrigues' formula,
/// and its first-order form `p + w x p` near `w = 0`, where the full one divides by zero. The
/// full branch is evaluated at a harmless angle there, so neither branch's derivative is NaN.
pub fn angle_axis_rotate<'t>(w: Vec3<'t>, p: Vec3<'t>) -> Vec3<'t> {
    let theta2 = w.norm_squared();
    let small = theta2.le(theta2.lit(f64::EPSILON));
    let safe2 = small.select(theta2.lit(1.0), theta2);
    let theta = safe2.sqrt();
    let k = w * (1.0 / theta);
    let (c, s) = (theta.cos(), theta.sin());
    let full = p * c + k.cross(p) * s + k * (k.dot(p) * (1.0 - c));
    let first_order = p + w.cross(p);
    let pick = |a: Var<'t>, b: Var<'t>| small.select(a, b);
    Vec3::new(
        pick(first_order.x, full.x),
        pick(first_order.y, full.y),
        pick(first_order.z, full.z),
    )
}

/// Ceres's `SnavelyReprojectionError`: `v` = camera (9), point (3); `c` = observed `(x, y)`.
pub fn snavely_reprojection<'t>(v: &[Var<'t>], c: &[Var<'t>]) -> Vec<Var<'t>> {
    let w = Vec3::new(v[0], v[1], v[2]);
    let point = Vec3::new(v[9], v[10], v[11]);
    let p = angle_axis_rotate(w, point) + Vec3::new(v[3], v[4], v[5]);
    let (xp, yp) = (-p.x / p.z, -p.y / p.z);
    let (focal, k1, k2) = (v[6], v[7], v[8]);
    let r2 = xp * xp + yp * yp;
    let distortion = 1.0 + r2 * (k1 + k2 * r2);
    vec![
        focal * distortion * xp - c[0],
        focal * distortion * yp - c[1],
    ]
}

/// A synthetic BAL scene whose noise floor is known: cameras on a ring looking at points in
/// a ball, each point seen by a few cameras, measurements the true projections plus Gaussian
/// noise. [`Synthetic::expected_cost`] is the least cost's expectation to first order in the
/// noise, `sigma^2 / 2 (2 N - (9 C + 3 P - 7))` (residuals minus the parameters, less the 7
/// directions of a similarity transform that leave every projection unchanged).
#[derive(Clone, Debug)]
pub struct Synthetic {
    /// The scene to solve: the noisy measurements, cameras and points perturbed from the
    /// truth.
    pub start: BalProblem,
    /// The true cameras and points (with the same measurements).
    pub truth: BalProblem,
    pub expected_cost: f64,
    /// The least cost's standard deviation (`sigma^2 / 2 sqrt(2 dof)`).
    pub cost_std: f64,
}

impl Synthetic {
    /// `cameras` cameras (focal length 500 pixels, no distortion) on a ring of radius 4,
    /// `points` points uniform in the unit ball, each seen by `per_point` distinct cameras,
    /// noise `sigma` pixels; the start perturbs rotations by about 0.01 rad, positions by
    /// 0.02 and focal lengths by 1%. Deterministic in `seed`.
    pub fn new(cameras: usize, points: usize, per_point: usize, sigma: f64, seed: u64) -> Self {
        assert!(
            cameras >= per_point && per_point >= 2,
            "each point needs 2 cameras or more"
        );
        let mut rng = crate::icosphere::SplitMix64(seed);
        let mut cams = Vec::with_capacity(cameras * CAMERA_LEN);
        for i in 0..cameras {
            let angle = 2.0 * std::f64::consts::PI * i as f64 / cameras as f64;
            let c = [
                4.0 * angle.cos(),
                0.5 * (rng.uniform() - 0.5),
                4.0 * angle.sin(),
            ];
            // Looking at the origin down the camera's -z axis (BAL's convention).
            let norm = |v: [f64; 3]| {
                let n = (v[0] * v[0] + v[1] * v[1] + v[2] * v[2]).sqrt();
                v.map(|x| x / n)
            };
            let z = norm(c);
            let x = norm(cross([0.0, 1.0, 0.0], z));
            let y = cross(z, x);
            let r = [x, y, z];
            let w = angle_axis_of(r);
            let t = [0, 1, 2].map(|k| -(r[k][0] * c[0] + r[k][1] * c[1] + r[k][2] * c[2]));
            cams.extend_from_slice(&[w[0], w[1], w[2], t[0], t[1], t[2], 500.0, 0.0, 0.0]);
        }
        let mut pts = Vec::with_capacity(points * POINT_LEN);
        while pts.len() < points * POINT_LEN {
            let p = [0, 1, 2].map(|_| 2.0 * rng.uniform() - 1.0);
            if p.iter().map(|v| v * v).sum::<f64>() <= 1.0 {
                pts.extend_from_slice(&p);
            }
        }
        let mut observations = Vec::with_capacity(points * per_point);
        let mut measurements = Vec::with_capacity(points * per_point);
        let mut seen = Vec::with_capacity(per_point);
        for p in 0..points {
            seen.clear();
            while seen.len() < per_point {
                let c = (rng.next_u64() % cameras as u64) as u32;
                if !seen.contains(&c) {
                    seen.push(c);
                }
            }
            seen.sort_unstable();
            for &c in &seen {
                let cam = &cams[c as usize * CAMERA_LEN..(c as usize + 1) * CAMERA_LEN];
                let [u, v] = project(cam, &pts[p * POINT_LEN..(p + 1) * POINT_LEN]);
                observations.push((c, p as u32));
                measurements.push([u + sigma * rng.normal(), v + sigma * rng.normal()]);
            }
        }
        let truth = BalProblem {
            cameras: cams,
            points: pts,
            observations,
            measurements,
        };
        let mut start = truth.clone();
        for cam in start.cameras.chunks_exact_mut(CAMERA_LEN) {
            for k in 0..3 {
                cam[k] += 0.01 * rng.normal();
                cam[3 + k] += 0.02 * rng.normal();
            }
            cam[6] *= 1.0 + 0.01 * rng.normal();
        }
        for v in start.points.iter_mut() {
            *v += 0.02 * rng.normal();
        }
        let residuals = 2 * truth.observations.len();
        let dof = residuals as f64 - (CAMERA_LEN * cameras + POINT_LEN * points - 7) as f64;
        Self {
            start,
            truth,
            expected_cost: 0.5 * sigma * sigma * dof,
            cost_std: 0.5 * sigma * sigma * (2.0 * dof).sqrt(),
        }
    }
}

/// The projection of `point` by `camera` in `f64` (the residual's model).
fn project(camera: &[f64], point: &[f64]) -> [f64; 2] {
    let p = rotate_f64(
        [camera[0], camera[1], camera[2]],
        [point[0], point[1], point[2]],
    );
    let p = [p[0] + camera[3], p[1] + camera[4], p[2] + camera[5]];
    let (xp, yp) = (-p[0] / p[2], -p[1] / p[2]);
    let r2 = xp * xp + yp * yp;
    let d = 1.0 + r2 * (camera[7] + camera[8] * r2);
    [camera[6] * d * xp, camera[6] * d * yp]
}

/// The angle-axis vector of the rotation matrix with rows `r` (its angle below pi).
fn angle_axis_of(r: [[f64; 3]; 3]) -> [f64; 3] {
    let cos = ((r[0][0] + r[1][1] + r[2][2] - 1.0) / 2.0).clamp(-1.0, 1.0);
    let axis = [r[2][1] - r[1][2], r[0][2] - r[2][0], r[1][0] - r[0][1]];
    let sin = 0.5 * (axis[0] * axis[0] + axis[1] * axis[1] + axis[2] * axis[2]).sqrt();
    let angle = sin.atan2(cos);
    if sin < 1e-12 {
        return [0.5 * axis[0], 0.5 * axis[1], 0.5 * axis[2]];
    }
    axis.map(|v| v * angle / (2.0 * sin))
}
