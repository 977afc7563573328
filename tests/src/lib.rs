//! # hal-parity: the parity suite
//!
//! Every `hal` primitive's check is written once here, generic over the backend. A run checks a
//! *target* backend against the CPU reference (`backend-cpu`), and the CPU reference itself
//! against float64 computed on the host, with fresh random inputs, odd sizes (0, 1, 7, 257,
//! 65537), and non-contiguous and broadcast views, using the tolerances the `hal` rustdoc
//! states for each primitive. Shapes are drawn by proptest strategies from a seed that the
//! report prints, so a failing run can be replayed with `--seed`.
//!
//! ```
//! use hal_parity::{Suite, SuiteConfig};
//! let cpu = backend_cpu::CpuBackend::new();
//! let report = Suite::new(&cpu, &cpu, true, SuiteConfig { cases: 1, seed: 7 }).run();
//! assert!(report.rows.iter().all(|r| r.passed()));
//! ```

pub mod checks;
pub mod collective;
pub mod device_checks;
pub mod host;
pub mod kill;
pub mod overflow;
pub mod special;

use backend_cpu::CpuBackend;
use hal::Backend;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

/// A fresh seed per run for a test's random inputs, or the one in environment variable `var`
/// to replay a failure; printed either way (`cargo test` shows it when the test fails).
pub fn fresh_seed(var: &str) -> u64 {
    let seed = std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0)
        });
    println!("seed {seed} (replay with {var}={seed})");
    seed
}

/// How much to test.
#[derive(Clone, Copy, Debug)]
pub struct SuiteConfig {
    /// Random cases per primitive (special sizes are always included on top of the first few).
    pub cases: usize,
    pub seed: u64,
}

/// One primitive's outcome on one backend.
#[derive(Clone, Debug)]
pub struct Row {
    pub primitive: &'static str,
    pub cases: usize,
    /// Largest `|got - want| / max(|want|, 2^-20)` seen.
    pub max_rel_err: f64,
    /// Largest `|got - want| / tolerance` seen: at most 1 passes.
    pub worst_err_over_tol: f64,
    pub failures: Vec<String>,
}

impl Row {
    pub fn passed(&self) -> bool {
        self.failures.is_empty() && self.cases > 0
    }
}

/// The rows of one backend's run.
#[derive(Clone, Debug)]
pub struct Report {
    pub backend: String,
    pub compared_against: &'static str,
    pub seed: u64,
    pub rows: Vec<Row>,
    /// What the table cannot show (which paths of the backend ran).
    pub notes: Vec<String>,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.rows.iter().all(Row::passed)
    }
}

/// A run of every check on one target backend.
pub struct Suite<'a, B: Backend> {
    pub(crate) target: &'a B,
    pub(crate) cpu: &'a CpuBackend,
    /// True when the target is the CPU reference: then it is compared against float64.
    pub(crate) target_is_reference: bool,
    pub(crate) runner: TestRunner,
    pub(crate) cfg: SuiteConfig,
    /// The target's precision policy: under `Fast` and `Compensated` the matmul and
    /// nearest-centroid checks use that policy's tolerances and row names.
    pub(crate) policy: hal::Precision,
    rows: Vec<Row>,
    /// What the report should say beyond the rows (f64 primitives a backend refused, say).
    pub(crate) notes: Vec<String>,
}

impl<'a, B: Backend> Suite<'a, B> {
    pub fn new(
        target: &'a B,
        cpu: &'a CpuBackend,
        target_is_reference: bool,
        cfg: SuiteConfig,
    ) -> Self {
        let mut seed = [0u8; 32];
        seed[..8].copy_from_slice(&cfg.seed.to_le_bytes());
        let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed);
        Self {
            target,
            cpu,
            target_is_reference,
            runner: TestRunner::new_with_rng(Config::default(), rng),
            cfg,
            policy: hal::Precision::Exact,
            rows: Vec::new(),
            notes: Vec::new(),
        }
    }

    pub(crate) fn rng(&mut self) -> &mut TestRng {
        self.runner.rng()
    }

    /// Runs every check and returns the report.
    pub fn run(mut self) -> Report {
        checks::run_all(&mut self);
        let caps = self.target.capabilities();
        let mut notes = std::mem::take(&mut self.notes);
        if !self.target_is_reference {
            // A backend's faster paths get their own rows, under that policy's tolerances.
            for (policy, present) in [
                (hal::Precision::Fast, caps.fast_precision),
                (hal::Precision::Compensated, caps.compensated_precision),
            ] {
                if !present {
                    notes.push(format!(
                        "Precision::{policy:?} has no path of its own on this device (it runs exactly): its rows were not run"
                    ));
                    continue;
                }
                let handle = self.target.with_precision(policy);
                let mut sub = Suite::new(&handle, self.cpu, false, self.cfg);
                sub.policy = policy;
                checks::run_matrix_unit_policy(&mut sub);
                self.rows.append(&mut sub.rows);
            }
            notes.push(if caps.matrix_units {
                "matrix units present: f16 and bf16 products (and the policies above) ran on them".into()
            } else {
                "matrix units (cooperative matrices / tensor cores) not present on this device: every product ran on the f32 kernels".into()
            });
        }
        for name in checks::EXPECTED_ROWS.into_iter().chain(checks::F64_ROWS) {
            if self.rows.iter().all(|r| r.primitive != name) {
                self.fail(
                    name,
                    "no case was drawn for this primitive: the suite must cover it".into(),
                );
            }
        }
        Report {
            backend: self.target.info().backend.to_string(),
            compared_against: if self.target_is_reference {
                "float64 on the host"
            } else {
                "backend-cpu"
            },
            seed: self.cfg.seed,
            rows: self.rows,
            notes,
        }
    }

    fn row(&mut self, primitive: &'static str) -> &mut Row {
        if let Some(i) = self.rows.iter().position(|r| r.primitive == primitive) {
            return &mut self.rows[i];
        }
        self.rows.push(Row {
            primitive,
            cases: 0,
            max_rel_err: 0.0,
            worst_err_over_tol: 0.0,
            failures: Vec::new(),
        });
        self.rows.last_mut().unwrap()
    }

    /// Records a failure that is not a numeric mismatch (an error where none was expected).
    pub(crate) fn fail(&mut self, primitive: &'static str, detail: String) {
        let row = self.row(primitive);
        row.cases += 1;
        if row.failures.len() < 5 {
            row.failures.push(detail);
        }
    }

    /// Records a case that passed without a numeric comparison (an expected error, say).
    pub(crate) fn pass(&mut self, primitive: &'static str) {
        self.row(primitive).cases += 1;
    }

    /// Records a case judged by the check itself: its relative error and its error over the
    /// tolerance (at most 1 passes).
    pub(crate) fn record(
        &mut self,
        primitive: &'static str,
        case: &str,
        rel_err: f64,
        over_tol: f64,
    ) {
        let row = self.row(primitive);
        row.cases += 1;
        row.max_rel_err = row.max_rel_err.max(rel_err);
        row.worst_err_over_tol = row.worst_err_over_tol.max(over_tol);
        if !within(over_tol) && row.failures.len() < 5 {
            row.failures
                .push(format!("{case}: error {over_tol:.3} times the tolerance"));
        }
    }

    /// Compares one case. `cpu` is the reference backend's output, `target` the target's
    /// (`None` when the target is the reference), `exact` the float64 result;
    /// `tol(i, want)` is the allowed absolute error of element `i`.
    pub(crate) fn judge(
        &mut self,
        primitive: &'static str,
        case: &str,
        cpu: &[f64],
        target: Option<&[f64]>,
        exact: &[f64],
        tol: &dyn Fn(usize, f64) -> f64,
    ) {
        let (got, want) = match target {
            None => (cpu, exact),
            Some(t) => (t, cpu),
        };
        let row = self.row(primitive);
        row.cases += 1;
        if got.len() != want.len() {
            row.failures.push(format!(
                "{case}: {} results, expected {}",
                got.len(),
                want.len()
            ));
            return;
        }
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            let same = g == w || (g.is_nan() && w.is_nan());
            let err = if same { 0.0 } else { (g - w).abs() };
            let t = tol(i, w);
            let over = if same {
                0.0
            } else if t > 0.0 {
                err / t
            } else {
                f64::INFINITY
            };
            let rel = err / w.abs().max(2f64.powi(-20));
            if !over.is_nan() {
                row.worst_err_over_tol = row.worst_err_over_tol.max(over);
            }
            if !rel.is_nan() {
                row.max_rel_err = row.max_rel_err.max(rel);
            }
            if !within(over) {
                if row.failures.len() < 5 {
                    row.failures.push(format!(
                        "{case}: element {i}: got {g}, want {w} (tolerance {t:.3e})"
                    ));
                }
                return;
            }
        }
    }
}

/// An error ratio passes when it is at most 1; NaN never passes.
fn within(err_over_tol: f64) -> bool {
    err_over_tol <= 1.0
}

/// Formats reports as the table `xtask parity` prints: primitive x backend.
pub fn format_table(reports: &[Report], absent: &[(String, String)]) -> String {
    let mut names: Vec<&'static str> = Vec::new();
    for r in reports {
        for row in &r.rows {
            if !names.contains(&row.primitive) {
                names.push(row.primitive);
            }
        }
    }
    let mut s = String::new();
    let width = 26;
    s.push_str(&format!("{:<width$}", "primitive"));
    for r in reports {
        s.push_str(&format!(
            " | {:<34}",
            format!(
                "{} (vs {})",
                r.backend,
                if r.compared_against.starts_with("float64") {
                    "f64"
                } else {
                    "cpu"
                }
            )
        ));
    }
    for (name, _) in absent {
        s.push_str(&format!(" | {name:<20}"));
    }
    s.push('\n');
    for name in &names {
        s.push_str(&format!("{name:<width$}"));
        for r in reports {
            let cell = match r.rows.iter().find(|row| row.primitive == *name) {
                Some(row) => format!(
                    "{} n={:<3} rel {:.1e} tol {:.2}",
                    if row.passed() { "pass" } else { "FAIL" },
                    row.cases,
                    row.max_rel_err,
                    row.worst_err_over_tol
                ),
                None => "not run".into(),
            };
            s.push_str(&format!(" | {cell:<34}"));
        }
        for _ in absent {
            s.push_str(&format!(" | {:<20}", "not present"));
        }
        s.push('\n');
    }
    for r in reports {
        for row in r.rows.iter().filter(|row| !row.passed()) {
            for f in &row.failures {
                s.push_str(&format!("FAIL {} {}: {f}\n", r.backend, row.primitive));
            }
        }
    }
    for r in reports {
        for note in &r.notes {
            s.push_str(&format!("{}: {note}\n", r.backend));
        }
    }
    for (name, why) in absent {
        s.push_str(&format!("{name}: not present: {why}\n"));
    }
    s
}
