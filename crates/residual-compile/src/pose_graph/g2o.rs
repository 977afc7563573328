//! The g2o text format: `VERTEX_SE2` / `EDGE_SE2` (2D) and `VERTEX_SE3:QUAT` /
//! `EDGE_SE3:QUAT` (3D), read into a [`PoseGraph`] and written back.
//!
//! Reading follows Ceres's `pose_graph_2d`/`pose_graph_3d` examples: angles are wrapped into
//! `[-pi, pi)` and quaternions normalised as they are read, and an edge's square-root
//! information is the lower Cholesky factor of its information matrix. Anything else is an
//! error naming the line: an unknown or mixed record type, a missing or extra field, a number
//! that does not parse or is not finite, a repeated vertex id, an edge to a vertex that does
//! not exist, a zero quaternion, an information matrix that is not positive definite.

use super::{Edge, PoseGraph, PoseKind};
use crate::manifold::wrap_angle;
use std::collections::HashMap;
use std::fmt;
use std::io::Write;
use std::path::Path;

/// A g2o file that cannot be read: where and why.
#[derive(Debug, Clone, PartialEq)]
pub struct G2oError {
    /// 1-based; 0 for what concerns the whole file.
    pub line: usize,
    pub message: String,
}

impl fmt::Display for G2oError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "g2o: {}", self.message)
        } else {
            write!(f, "g2o line {}: {}", self.line, self.message)
        }
    }
}

impl std::error::Error for G2oError {}

fn error(line: usize, message: impl Into<String>) -> G2oError {
    G2oError {
        line,
        message: message.into(),
    }
}

/// Reads a g2o file (see the module docs).
pub fn read(path: &Path) -> Result<PoseGraph, G2oError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| error(0, format!("cannot read {}: {e}", path.display())))?;
    parse(&text)
}

/// Parses g2o text (see the module docs).
pub fn parse(text: &str) -> Result<PoseGraph, G2oError> {
    let mut kind: Option<PoseKind> = None;
    let mut vertices: Vec<(i64, Vec<f64>, usize)> = Vec::new();
    let mut seen: HashMap<i64, usize> = HashMap::new();
    let mut raw_edges: Vec<(usize, i64, i64, Vec<f64>)> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let n = n + 1;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut fields = line.split_whitespace();
        let tag = fields.next().expect("a non-empty line has a field");
        let (this_kind, is_vertex) = match tag {
            "VERTEX_SE2" => (PoseKind::Se2, true),
            "EDGE_SE2" => (PoseKind::Se2, false),
            "VERTEX_SE3:QUAT" => (PoseKind::Se3, true),
            "EDGE_SE3:QUAT" => (PoseKind::Se3, false),
            other => {
                return Err(error(
                    n,
                    format!(
                        "unknown record type '{other}' (read: VERTEX_SE2, EDGE_SE2, \
                         VERTEX_SE3:QUAT, EDGE_SE3:QUAT)"
                    ),
                ));
            }
        };
        match kind {
            None => kind = Some(this_kind),
            Some(k) if k != this_kind => {
                return Err(error(
                    n,
                    format!("a {tag} record in a file of {} records", k.name()),
                ));
            }
            _ => {}
        }
        let rest: Vec<&str> = fields.collect();
        let id = |s: &str| -> Result<i64, G2oError> {
            s.parse::<i64>()
                .map_err(|_| error(n, format!("'{s}' is not a vertex id")))
        };
        let numbers = |fields: &[&str]| -> Result<Vec<f64>, G2oError> {
            fields
                .iter()
                .map(|s| match s.parse::<f64>() {
                    Ok(v) if v.is_finite() => Ok(v),
                    Ok(_) => Err(error(n, format!("'{s}' is not finite"))),
                    Err(_) => Err(error(n, format!("'{s}' is not a number"))),
                })
                .collect()
        };
        let (pose_len, info_len) = this_kind.record_sizes();
        let want = if is_vertex {
            1 + pose_len
        } else {
            2 + pose_len + info_len
        };
        if rest.len() != want {
            return Err(error(
                n,
                format!("{tag} has {} fields after its type, not {want}", rest.len()),
            ));
        }
        if is_vertex {
            let vid = id(rest[0])?;
            let pose = this_kind.normalise(numbers(&rest[1..])?, n)?;
            if seen.insert(vid, vertices.len()).is_some() {
                return Err(error(n, format!("vertex {vid} appears twice")));
            }
            vertices.push((vid, pose, n));
        } else {
            let (a, b) = (id(rest[0])?, id(rest[1])?);
            raw_edges.push((n, a, b, numbers(&rest[2..])?));
        }
    }
    let kind = kind.ok_or_else(|| error(0, "no vertices or edges"))?;
    // Poses in order of id, as Ceres's `std::map`: the first is the one held constant.
    vertices.sort_by_key(|v| v.0);
    let index: HashMap<i64, usize> = vertices.iter().enumerate().map(|(i, v)| (v.0, i)).collect();
    let (pose_len, _) = kind.record_sizes();
    let mut edges = Vec::with_capacity(raw_edges.len());
    for (n, a, b, values) in raw_edges {
        let find = |v: i64| {
            index
                .get(&v)
                .copied()
                .ok_or_else(|| error(n, format!("edge to vertex {v}, which is not in the file")))
        };
        let (ia, ib) = (find(a)?, find(b)?);
        if ia == ib {
            return Err(error(n, format!("edge from vertex {a} to itself")));
        }
        let measurement = kind.normalise(values[..pose_len].to_vec(), n)?;
        let sqrt_information = lower_cholesky(&values[pose_len..], kind.tangent_len())
            .ok_or_else(|| error(n, "the information matrix is not positive definite"))?;
        edges.push(Edge {
            a: ia,
            b: ib,
            measurement,
            sqrt_information,
        });
    }
    Ok(PoseGraph {
        kind,
        ids: vertices.iter().map(|v| v.0).collect(),
        poses: vertices.into_iter().flat_map(|v| v.1).collect(),
        edges,
    })
}

impl PoseKind {
    /// Numbers of a pose and of an information matrix's upper triangle in a record.
    fn record_sizes(self) -> (usize, usize) {
        match self {
            PoseKind::Se2 => (3, 6),
            PoseKind::Se3 => (7, 21),
        }
    }

    /// A pose as read: the angle wrapped, the quaternion normalised.
    fn normalise(self, mut pose: Vec<f64>, line: usize) -> Result<Vec<f64>, G2oError> {
        match self {
            PoseKind::Se2 => pose[2] = wrap_angle(pose[2]),
            PoseKind::Se3 => {
                // Scaled by the largest entry first, so 1e308 entries do not overflow.
                let largest = pose[3..7].iter().fold(0.0f64, |m, v| m.max(v.abs()));
                if largest == 0.0 {
                    return Err(error(line, "the quaternion is zero"));
                }
                pose[3..7].iter_mut().for_each(|v| *v /= largest);
                let norm = pose[3..7].iter().map(|v| v * v).sum::<f64>().sqrt();
                pose[3..7].iter_mut().for_each(|v| *v /= norm);
            }
        }
        Ok(pose)
    }
}

/// The lower Cholesky factor `L` (row-major `d x d`) of the symmetric matrix whose upper
/// triangle `upper` lists row by row; `None` when it is not positive definite.
fn lower_cholesky(upper: &[f64], d: usize) -> Option<Vec<f64>> {
    let mut a = vec![0.0f64; d * d];
    let mut k = 0;
    for i in 0..d {
        for j in i..d {
            a[i * d + j] = upper[k];
            a[j * d + i] = upper[k];
            k += 1;
        }
    }
    crate::dense::small_cholesky(&mut a, d).ok()?;
    // `a` is symmetric, so its column-major factor is the lower factor; read it row-major.
    let mut l = vec![0.0f64; d * d];
    for i in 0..d {
        for j in 0..=i {
            l[i * d + j] = a[j * d + i];
        }
    }
    Some(l)
}

/// The information matrix `L L^T` back from its factor, as g2o's upper triangle.
fn information_upper(l: &[f64], d: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(d * (d + 1) / 2);
    for i in 0..d {
        for j in i..d {
            out.push((0..d).map(|k| l[i * d + k] * l[j * d + k]).sum());
        }
    }
    out
}

/// Writes `graph` with its vertices at `poses` (the graph's layout) as g2o text, atomically.
pub fn write(graph: &PoseGraph, poses: &[f64], path: &Path) -> std::io::Result<()> {
    hal::durable::write_atomic(path, |w| {
        let (len, d) = (graph.kind.pose_len(), graph.kind.tangent_len());
        let (vertex, edge) = match graph.kind {
            PoseKind::Se2 => ("VERTEX_SE2", "EDGE_SE2"),
            PoseKind::Se3 => ("VERTEX_SE3:QUAT", "EDGE_SE3:QUAT"),
        };
        for (i, id) in graph.ids.iter().enumerate() {
            write!(w, "{vertex} {id}")?;
            for v in &poses[i * len..(i + 1) * len] {
                write!(w, " {v:e}")?;
            }
            writeln!(w)?;
        }
        for e in &graph.edges {
            write!(w, "{edge} {} {}", graph.ids[e.a], graph.ids[e.b])?;
            for v in &e.measurement {
                write!(w, " {v:e}")?;
            }
            for v in information_upper(&e.sqrt_information, d) {
                write!(w, " {v:e}")?;
            }
            writeln!(w)?;
        }
        Ok(())
    })
}

/// Writes the trajectory (vertices in id order joined by a polyline) as a Wavefront OBJ,
/// atomically: 2D poses at `z = 0`.
pub fn write_obj(graph: &PoseGraph, poses: &[f64], path: &Path) -> std::io::Result<()> {
    hal::durable::write_atomic(path, |w| {
        let len = graph.kind.pose_len();
        for pose in poses.chunks_exact(len) {
            match graph.kind {
                PoseKind::Se2 => writeln!(w, "v {:e} {:e} 0", pose[0], pose[1])?,
                PoseKind::Se3 => writeln!(w, "v {:e} {:e} {:e}", pose[0], pose[1], pose[2])?,
            }
        }
        let n = poses.len() / len;
        if n > 1 {
            write!(w, "l")?;
            for i in 1..=n {
                write!(w, " {i}")?;
            }
            writeln!(w)?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cholesky_factor_reproduces_the_matrix() {
        let upper = [4.0, 2.0, 0.4, 3.0, 0.5, 2.0];
        let l = lower_cholesky(&upper, 3).unwrap();
        let back = information_upper(&l, 3);
        for (a, b) in back.iter().zip(&upper) {
            assert!((a - b).abs() < 1e-12);
        }
        assert!(l[1] == 0.0 && l[2] == 0.0 && l[5] == 0.0, "lower: {l:?}");
        assert!(lower_cholesky(&[1.0, 2.0, 1.0], 2).is_none());
    }
}
