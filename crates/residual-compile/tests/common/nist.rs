//! The 27 NIST StRD nonlinear regression problems, read from NIST's own `.dat` files in
//! `tests/data/nist/`, with their models written as residuals, and NIST's grade: the log
//! relative error (LRE) of each certified parameter.
//!
//! Shared by `tests/certified.rs` and `examples/nist.rs` (which includes this file by path).

use hal::Backend;
use residual_compile::{KernelCache, Loss, Problem, SolveOptions, Summary, Var, solve};
use std::path::{Path, PathBuf};

/// One certified problem as NIST publishes it.
#[derive(Debug)]
pub struct Certified {
    pub name: String,
    /// Start 1 and start 2.
    pub starts: [Vec<f64>; 2],
    pub certified: Vec<f64>,
    /// The certified residual sum of squares.
    pub rss: f64,
    /// One row per observation: the response, then the predictors.
    pub rows: Vec<Vec<f64>>,
}

/// A model: the parameters and the predictors of one observation give the fitted response.
pub type Model = for<'t> fn(&[Var<'t>], &[Var<'t>]) -> Var<'t>;

/// Where the data files are.
pub fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/nist")
}

/// Every problem in `dir`, sorted by name; an unreadable file or an unknown model is an error.
pub fn load_all(dir: &Path) -> Result<Vec<Certified>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "dat"))
        .collect();
    paths.sort();
    let mut all = Vec::new();
    for path in paths {
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{name}: {e}"))?;
        let problem = parse(&name, &text).map_err(|e| format!("{name}: {e}"))?;
        if model(&name).is_none() {
            return Err(format!("{name}: no model written for it"));
        }
        all.push(problem);
    }
    Ok(all)
}

/// Parses NIST's layout: `bK = start1 start2 certified sd` lines, the residual sum of squares,
/// and after the `Data:   y  x ...` header one row of numbers per observation.
pub fn parse(name: &str, text: &str) -> Result<Certified, String> {
    let mut starts = [Vec::new(), Vec::new()];
    let mut certified = Vec::new();
    let mut rss = None;
    let mut observations = None;
    let mut rows = Vec::new();
    let mut in_data = false;
    for line in text.lines() {
        let t = line.trim();
        if in_data {
            if t.is_empty() {
                continue;
            }
            let row: Result<Vec<f64>, _> = t.split_whitespace().map(str::parse).collect();
            rows.push(row.map_err(|e| format!("data row {t:?}: {e}"))?);
        } else if let Some(rest) = t.strip_prefix("Data:") {
            in_data = rest.split_whitespace().next() == Some("y");
        } else if let Some(rest) = t.strip_prefix("Residual Sum of Squares:") {
            rss = Some(number(rest)?);
        } else if let Some(rest) = t.strip_prefix("Number of Observations:") {
            observations = Some(number(rest)? as usize);
        } else if t.starts_with('b') && t.contains('=') {
            let (_, values) = t.split_once('=').unwrap();
            let v: Vec<&str> = values.split_whitespace().collect();
            if v.len() != 4 {
                return Err(format!("parameter line {t:?}: expected 4 numbers"));
            }
            starts[0].push(number(v[0])?);
            starts[1].push(number(v[1])?);
            certified.push(number(v[2])?);
        }
    }
    let rss = rss.ok_or("no residual sum of squares")?;
    let width = rows.first().map_or(0, Vec::len);
    if certified.is_empty() || rows.is_empty() || rows.iter().any(|r| r.len() != width) {
        return Err("no parameters, no data, or ragged data".into());
    }
    if observations != Some(rows.len()) {
        return Err(format!(
            "{} data rows, but the header says {observations:?}",
            rows.len()
        ));
    }
    Ok(Certified {
        name: name.to_string(),
        starts,
        certified,
        rss,
        rows,
    })
}

fn number(s: &str) -> Result<f64, String> {
    s.trim().parse().map_err(|e| format!("{s:?}: {e}"))
}

/// The model of each problem, as its file states it, and whether the response is `ln y`
/// (Nelson's is).
pub fn model(name: &str) -> Option<(Model, bool)> {
    let m: Model = match name {
        "Misra1a" | "BoxBOD" => |b, x| b[0] * (1.0 - (-b[1] * x[0]).exp()),
        "Misra1b" => |b, x| b[0] * (1.0 - (1.0 + b[1] * x[0] * 0.5).powi(-2)),
        "Misra1c" => |b, x| b[0] * (1.0 - (1.0 + 2.0 * b[1] * x[0]).powf(-0.5)),
        "Misra1d" => |b, x| b[0] * b[1] * x[0] / (1.0 + b[1] * x[0]),
        "Chwirut1" | "Chwirut2" => |b, x| (-b[0] * x[0]).exp() / (b[1] + b[2] * x[0]),
        "Lanczos1" | "Lanczos2" | "Lanczos3" => |b, x| {
            b[0] * (-b[1] * x[0]).exp() + b[2] * (-b[3] * x[0]).exp() + b[4] * (-b[5] * x[0]).exp()
        },
        "Gauss1" | "Gauss2" | "Gauss3" => |b, x| {
            let bump = |i: usize| b[i] * (-((x[0] - b[i + 1]) / b[i + 2]).powi(2)).exp();
            b[0] * (-b[1] * x[0]).exp() + bump(2) + bump(5)
        },
        "DanWood" => |b, x| b[0] * x[0].pow(b[1]),
        "Kirby2" => |b, x| {
            let t = x[0];
            (b[0] + b[1] * t + b[2] * t * t) / (1.0 + b[3] * t + b[4] * t * t)
        },
        "Hahn1" | "Thurber" => |b, x| {
            let t = x[0];
            (b[0] + t * (b[1] + t * (b[2] + t * b[3]))) / (1.0 + t * (b[4] + t * (b[5] + t * b[6])))
        },
        "Nelson" => |b, x| b[0] - b[1] * x[0] * (-b[2] * x[1]).exp(),
        "MGH17" => |b, x| b[0] + b[1] * (-x[0] * b[3]).exp() + b[2] * (-x[0] * b[4]).exp(),
        "Roszman1" => {
            |b, x| b[0] - b[1] * x[0] - (b[2] / (x[0] - b[3])).atan() * (1.0 / std::f64::consts::PI)
        }
        "ENSO" => |b, x| {
            let tau = 2.0 * std::f64::consts::PI;
            let w = x[0] * (tau / 12.0);
            let w4 = x[0] * tau / b[3];
            let w7 = x[0] * tau / b[6];
            b[0] + b[1] * w.cos()
                + b[2] * w.sin()
                + b[4] * w4.cos()
                + b[5] * w4.sin()
                + b[7] * w7.cos()
                + b[8] * w7.sin()
        },
        "MGH09" => |b, x| {
            let t = x[0];
            b[0] * (t * t + t * b[1]) / (t * t + t * b[2] + b[3])
        },
        "Rat42" => |b, x| b[0] / (1.0 + (b[1] - b[2] * x[0]).exp()),
        "MGH10" => |b, x| b[0] * (b[1] / (x[0] + b[2])).exp(),
        "Eckerle4" => |b, x| (b[0] / b[1]) * (-0.5 * ((x[0] - b[2]) / b[1]).powi(2)).exp(),
        "Rat43" => |b, x| b[0] / (1.0 + (b[1] - b[2] * x[0]).exp()).pow(1.0 / b[3]),
        "Bennett5" => |b, x| b[0] * (b[1] + x[0]).pow(-1.0 / b[2]),
        _ => return None,
    };
    Some((m, name == "Nelson"))
}

/// The least-squares problem of `c` from one of its starts: one residual per observation,
/// `response - model(b, predictors)`, with the data as constants exactly as NIST gives them.
pub fn build(c: &Certified, start: usize) -> Problem {
    let (m, log_response) = model(&c.name).expect("load_all checked the model");
    let mut p = Problem::new();
    let first = p.add_parameters(&c.starts[start]);
    let idx: Vec<usize> = (first..first + c.certified.len()).collect();
    for row in &c.rows {
        let y = if log_response { row[0].ln() } else { row[0] };
        let mut k = row[1..].to_vec();
        k.push(y);
        let n = k.len();
        p.add_residual(&c.name, &idx, &k, Loss::Trivial, move |b, k| {
            vec![k[n - 1] - m(b, &k[..n - 1])]
        })
        .expect("a NIST model is a valid residual");
    }
    p
}

/// NIST's log relative error of `got` against `want`: digits of agreement, at most 11 (the
/// digits certified).
pub fn lre(got: f64, want: f64) -> f64 {
    let rel = (got - want).abs() / want.abs();
    if rel == 0.0 {
        11.0
    } else if rel.is_nan() {
        0.0
    } else {
        (-rel.log10()).clamp(0.0, 11.0)
    }
}

/// One graded run.
pub struct Graded {
    pub name: String,
    /// 1 or 2.
    pub start: usize,
    /// The worst parameter's LRE (0 where the solve failed).
    pub parameter_lre: f64,
    /// The LRE of the residual sum of squares.
    pub rss_lre: f64,
    pub summary: Result<Summary, String>,
}

/// Solves `c` from start `start` (0 or 1) with `options` and grades it.
pub fn grade<B: Backend>(
    backend: &B,
    c: &Certified,
    start: usize,
    options: &SolveOptions,
) -> Graded {
    let mut p = build(c, start);
    let summary = solve(backend, &mut p, options, &KernelCache::new()).map_err(|e| e.to_string());
    let parameter_lre = match &summary {
        Ok(_) => p
            .parameters()
            .iter()
            .zip(&c.certified)
            .map(|(&g, &w)| lre(g, w))
            .fold(11.0, f64::min),
        Err(_) => 0.0,
    };
    let rss_lre = summary
        .as_ref()
        .map_or(0.0, |s| lre(2.0 * s.final_cost, c.rss));
    Graded {
        name: c.name.clone(),
        start: start + 1,
        parameter_lre,
        rss_lre,
        summary,
    }
}

impl Graded {
    /// One line: name, start, LREs, termination and iterations (or the error).
    pub fn line(&self) -> String {
        let how = match &self.summary {
            Ok(s) => format!("{:?}, {} iterations", s.termination, s.iterations),
            Err(e) => format!("error: {e}"),
        };
        format!(
            "{:<9} start {}: parameter LRE {:>4.1}, RSS LRE {:>4.1} ({how})",
            self.name, self.start, self.parameter_lre, self.rss_lre
        )
    }
}
