//! The icosphere demo problem: a subdivided icosahedron, perturbed by seeded noise, pulled back
//! by three kinds of residuals:
//!
//! - **edge regularity** (one per edge, 6 parameters): `|v_a - v_b| - L`, with `L` the mean
//!   edge length of the unperturbed mesh (a per-instance constant);
//! - **sphere** (one per vertex, 3 parameters): `w1 (|v| - 1)`;
//! - **bending** (three per edge, 12 parameters): `w2 (n_1 - n_2)`, the difference of the unit
//!   normals of the edge's two faces `(a, b, c)` and `(b, a, d)`.
//!
//! Level `L` has `10 * 4^L + 2` vertices (642 at 3, 163,842 at 7), `30 * 4^L` edges and
//! `20 * 4^L` faces. The noise is Gaussian with standard deviation `sigma` per coordinate, from
//! SplitMix64 and Box-Muller, so every program (the peers' scripts included, which read the
//! start from the file [`Icosphere::write_start`] writes) starts from the same point.

use crate::{Error, Loss, Problem, Vec3};
use std::collections::HashMap;
use std::io::Write;

/// The noise every demo perturbs the mesh with: the native example's default, the browser
/// page's, and what `cargo xtask web --check` solves natively as the page's reference.
pub const DEMO_SIGMA: f64 = 0.05;
/// The seed of that noise.
pub const DEMO_SEED: u64 = 7;

/// The demos' problem at `level`: the mesh, the start perturbed by [`DEMO_SIGMA`] and
/// [`DEMO_SEED`], and the problem from it with both weights 1.
pub fn demo(level: u32) -> Result<(Icosphere, Vec<f64>, Problem), Error> {
    let mesh = Icosphere::new(level)?;
    let start = mesh.perturbed(DEMO_SIGMA, DEMO_SEED);
    let problem = mesh.problem(&start, 1.0, 1.0)?;
    Ok((mesh, start, problem))
}

/// The options the browser page solves the demos' problem with, and `cargo xtask web --check`
/// its native reference: the library's defaults in `f32` (WebGPU has no `f64`), at most 500
/// iterations (the native example's default).
pub fn demo_options_f32() -> crate::SolveOptions {
    crate::SolveOptions {
        precision: crate::Precision::F32,
        max_iterations: 500,
        ..crate::SolveOptions::default()
    }
}

/// An edge and the vertices opposite it in its two faces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Edge {
    pub a: u32,
    pub b: u32,
    /// The third vertex of face `(a, b, c)`.
    pub c: u32,
    /// The third vertex of face `(b, a, d)`.
    pub d: u32,
}

pub struct Icosphere {
    pub level: u32,
    /// Unit vectors.
    pub vertices: Vec<[f64; 3]>,
    /// Counter-clockwise seen from outside.
    pub faces: Vec<[u32; 3]>,
    pub edges: Vec<Edge>,
}

impl Icosphere {
    /// Subdivides an icosahedron `level` times (at most 10), projecting new vertices onto the
    /// unit sphere.
    pub fn new(level: u32) -> Result<Self, Error> {
        if level > 10 {
            return Err(Error::InvalidProblem(format!(
                "icosphere level {level} is too large (at most 10)"
            )));
        }
        let t = (1.0 + 5f64.sqrt()) / 2.0;
        let mut vertices: Vec<[f64; 3]> = [
            [-1.0, t, 0.0],
            [1.0, t, 0.0],
            [-1.0, -t, 0.0],
            [1.0, -t, 0.0],
            [0.0, -1.0, t],
            [0.0, 1.0, t],
            [0.0, -1.0, -t],
            [0.0, 1.0, -t],
            [t, 0.0, -1.0],
            [t, 0.0, 1.0],
            [-t, 0.0, -1.0],
            [-t, 0.0, 1.0],
        ]
        .iter()
        .map(|&v| normalized(v))
        .collect();
        let mut faces: Vec<[u32; 3]> = vec![
            [0, 11, 5],
            [0, 5, 1],
            [0, 1, 7],
            [0, 7, 10],
            [0, 10, 11],
            [1, 5, 9],
            [5, 11, 4],
            [11, 10, 2],
            [10, 7, 6],
            [7, 1, 8],
            [3, 9, 4],
            [3, 4, 2],
            [3, 2, 6],
            [3, 6, 8],
            [3, 8, 9],
            [4, 9, 5],
            [2, 4, 11],
            [6, 2, 10],
            [8, 6, 7],
            [9, 8, 1],
        ];
        for _ in 0..level {
            let mut midpoint: HashMap<(u32, u32), u32> = HashMap::new();
            let mut mid = |a: u32, b: u32, vertices: &mut Vec<[f64; 3]>| {
                *midpoint.entry((a.min(b), a.max(b))).or_insert_with(|| {
                    let (p, q) = (vertices[a as usize], vertices[b as usize]);
                    vertices.push(normalized([p[0] + q[0], p[1] + q[1], p[2] + q[2]]));
                    vertices.len() as u32 - 1
                })
            };
            let mut next = Vec::with_capacity(faces.len() * 4);
            for &[a, b, c] in &faces {
                let ab = mid(a, b, &mut vertices);
                let bc = mid(b, c, &mut vertices);
                let ca = mid(c, a, &mut vertices);
                next.extend([[a, ab, ca], [b, bc, ab], [c, ca, bc], [ab, bc, ca]]);
            }
            faces = next;
        }
        // Each directed edge (a, b) of a face, with its third vertex; the twin (b, a) is in the
        // neighbouring face.
        let mut opposite: HashMap<(u32, u32), u32> = HashMap::with_capacity(faces.len() * 3);
        for &[a, b, c] in &faces {
            opposite.insert((a, b), c);
            opposite.insert((b, c), a);
            opposite.insert((c, a), b);
        }
        let mut edges = Vec::with_capacity(faces.len() * 3 / 2);
        for &[a, b, c] in &faces {
            for (p, q, r) in [(a, b, c), (b, c, a), (c, a, b)] {
                if p < q {
                    let d = opposite[&(q, p)];
                    edges.push(Edge {
                        a: p,
                        b: q,
                        c: r,
                        d,
                    });
                }
            }
        }
        Ok(Self {
            level,
            vertices,
            faces,
            edges,
        })
    }

    /// The mean edge length of the unperturbed mesh.
    pub fn mean_edge_length(&self) -> f64 {
        let total: f64 = self
            .edges
            .iter()
            .map(|e| distance(self.vertices[e.a as usize], self.vertices[e.b as usize]))
            .sum();
        total / self.edges.len() as f64
    }

    /// The vertices with Gaussian noise of standard deviation `sigma` per coordinate,
    /// flattened `[x0, y0, z0, x1, ...]`.
    pub fn perturbed(&self, sigma: f64, seed: u64) -> Vec<f64> {
        let mut rng = SplitMix64(seed);
        let mut out = Vec::with_capacity(self.vertices.len() * 3);
        for v in &self.vertices {
            for &x in v {
                out.push(x + sigma * rng.normal());
            }
        }
        out
    }

    /// The problem, starting from `start` (flattened vertices), with weights `w1` (sphere)
    /// and `w2` (bending).
    pub fn problem(&self, start: &[f64], w1: f64, w2: f64) -> Result<Problem, Error> {
        if start.len() != self.vertices.len() * 3 {
            return Err(Error::InvalidProblem(format!(
                "the start has {} values; the icosphere needs {}",
                start.len(),
                self.vertices.len() * 3
            )));
        }
        let mut p = Problem::new();
        p.add_parameters(start);
        let xyz = |v: u32| {
            let i = v as usize * 3;
            [i, i + 1, i + 2]
        };
        let rest = self.mean_edge_length();
        // Each kind's blocks are added in one call, traced in parallel.
        let corners = |vertices_per_block: usize, blocks: &mut dyn Iterator<Item = [u32; 4]>| {
            let mut out = Vec::with_capacity(self.edges.len() * vertices_per_block * 3);
            for vs in blocks {
                for &v in &vs[..vertices_per_block] {
                    out.extend(xyz(v));
                }
            }
            out
        };
        let edges = corners(2, &mut self.edges.iter().map(|e| [e.a, e.b, 0, 0]));
        let rests = vec![rest; self.edges.len()];
        p.add_residuals("edge", 6, &edges, 1, &rests, Loss::Trivial, |v, c| {
            let d = Vec3::from_slice(&v[0..3]) - Vec3::from_slice(&v[3..6]);
            vec![d.norm() - c[0]]
        })?;
        let vertices = corners(1, &mut (0..self.vertices.len() as u32).map(|v| [v; 4]));
        p.add_residuals(
            "sphere",
            3,
            &vertices,
            0,
            &[],
            Loss::Trivial,
            move |x, _| vec![(Vec3::from_slice(x).norm() - 1.0) * w1],
        )?;
        let hinges = corners(4, &mut self.edges.iter().map(|e| [e.a, e.b, e.c, e.d]));
        p.add_residuals(
            "bending",
            12,
            &hinges,
            0,
            &[],
            Loss::Trivial,
            move |x, _| {
                let (a, b) = (Vec3::from_slice(&x[0..3]), Vec3::from_slice(&x[3..6]));
                let (c, d) = (Vec3::from_slice(&x[6..9]), Vec3::from_slice(&x[9..12]));
                let n1 = (b - a).cross(c - a).normalize();
                let n2 = (a - b).cross(d - b).normalize();
                ((n1 - n2) * w2).to_array().to_vec()
            },
        )?;
        Ok(p)
    }

    /// Writes the mesh with `positions` (flattened) as a Wavefront OBJ file.
    /// The file is written atomically ([`hal::durable::write_atomic`]).
    pub fn write_obj(&self, path: &std::path::Path, positions: &[f64]) -> std::io::Result<()> {
        hal::durable::write_atomic(path, |w| {
            writeln!(w, "# icosphere level {} (residual-compile)", self.level)?;
            for v in positions.chunks_exact(3) {
                writeln!(w, "v {} {} {}", v[0], v[1], v[2])?;
            }
            for f in &self.faces {
                writeln!(w, "f {} {} {}", f[0] + 1, f[1] + 1, f[2] + 1)?;
            }
            Ok(())
        })
    }

    /// Writes what a peer needs to build the same problem: a little-endian binary file with
    /// `u32` vertex count, `u32` edge count, the start (`f64` x 3 per vertex), the edges
    /// (`u32` a, b, c, d each), and the rest length (`f64`). Written atomically.
    pub fn write_start(&self, path: &std::path::Path, start: &[f64]) -> std::io::Result<()> {
        hal::durable::write_atomic(path, |w| {
            w.write_all(&(self.vertices.len() as u32).to_le_bytes())?;
            w.write_all(&(self.edges.len() as u32).to_le_bytes())?;
            for x in start {
                w.write_all(&x.to_le_bytes())?;
            }
            for e in &self.edges {
                for v in [e.a, e.b, e.c, e.d] {
                    w.write_all(&v.to_le_bytes())?;
                }
            }
            w.write_all(&self.mean_edge_length().to_le_bytes())
        })
    }
}

fn normalized(v: [f64; 3]) -> [f64; 3] {
    let n = (v[0] * v[0] + v[1] * v[1] + v[2] * v[2]).sqrt();
    [v[0] / n, v[1] / n, v[2] / n]
}

fn distance(p: [f64; 3], q: [f64; 3]) -> f64 {
    ((p[0] - q[0]).powi(2) + (p[1] - q[1]).powi(2) + (p[2] - q[2]).powi(2)).sqrt()
}

/// SplitMix64 (Steele, Lea and Flood 2014): small, seedable, and easy to reproduce in a peer.
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `(0, 1]`.
    pub fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }
    /// Standard normal (Box-Muller, one value per pair of uniforms).
    pub fn normal(&mut self) -> f64 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}
