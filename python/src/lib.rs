//! # vlc-python: the `vlc` Python module
//!
//! Python bindings of [`vlc_anneal`] (PyO3, built by maturin): compress a numpy array of
//! embeddings into an index, search it, add and remove vectors, save and load it. This crate is
//! the compiled half, imported as `vlc._vlc`; the `vlc` package beside it (`python/vlc/`)
//! converts what numpy users pass (other float dtypes, any integer ids, lists) and documents
//! the API. Here every argument is checked strictly: `float32` arrays in C order, `int64` ids.
//!
//! Long work (compression, search, adding) runs with the interpreter's lock released, so
//! other Python threads run meanwhile. Arrays cross without copies where numpy allows: results
//! are handed to numpy as they are, and inputs are read in place (compression and adding copy
//! the vectors once, into the index's working matrix).

mod backend;
mod index;

use numpy::{PyReadonlyArray1, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::exceptions::{
    PyFileNotFoundError, PyOSError, PyPermissionError, PyRuntimeError, PyValueError,
};
use pyo3::prelude::*;

pub use index::PyIndex;

/// A Python exception for a library error: bad input or a malformed file is a `ValueError`, a
/// file system error an `OSError` (its subclass where one fits), a device error a
/// `RuntimeError`.
pub(crate) fn py_err(e: vlc_anneal::Error) -> PyErr {
    let text = e.to_string();
    match e {
        vlc_anneal::Error::Input(_) | vlc_anneal::Error::Format { .. } => {
            PyValueError::new_err(text)
        }
        vlc_anneal::Error::Io { source, .. } => match source.kind() {
            std::io::ErrorKind::NotFound => PyFileNotFoundError::new_err(text),
            std::io::ErrorKind::PermissionDenied => PyPermissionError::new_err(text),
            _ => PyOSError::new_err(text),
        },
        vlc_anneal::Error::Hal(_) => PyRuntimeError::new_err(text),
    }
}

/// The rows of a 2-D `float32` array in C order, read in place.
pub(crate) fn rows<'a>(
    x: &'a PyReadonlyArray2<'_, f32>,
    what: &str,
) -> PyResult<(usize, usize, &'a [f32])> {
    let shape = x.shape();
    let data = x.as_slice().map_err(|_| {
        PyValueError::new_err(format!("{what} must be a C-contiguous float32 array"))
    })?;
    Ok((shape[0], shape[1], data))
}

/// Ids as the index stores them (non-negative, at most 2^63 - 1), from an `int64` array.
pub(crate) fn ids(x: &PyReadonlyArray1<'_, i64>) -> PyResult<Vec<u64>> {
    let v = x.as_array();
    let mut out = Vec::with_capacity(v.len());
    for (i, &id) in v.iter().enumerate() {
        if id < 0 {
            return Err(PyValueError::new_err(format!(
                "id {id} at position {i} is negative (ids are 0 to 2**63 - 1)"
            )));
        }
        out.push(id as u64);
    }
    Ok(out)
}

/// `vlc.compress`'s compiled half: the vectors (float32, C order) and every parameter
/// positionally, as the `vlc` package passes them after checking and converting them.
#[allow(clippy::too_many_arguments)]
#[pyfunction]
#[pyo3(signature = (x, anchors, bytes, backend, iterations, seed, metric, exact, tolerance, ids, progress, refine))]
fn compress(
    py: Python<'_>,
    x: PyReadonlyArray2<'_, f32>,
    anchors: usize,
    bytes: usize,
    backend: &str,
    iterations: usize,
    seed: u64,
    metric: &str,
    exact: bool,
    tolerance: f64,
    ids: Option<PyReadonlyArray1<'_, i64>>,
    progress: Option<Py<PyAny>>,
    refine: bool,
) -> PyResult<PyIndex> {
    let metric: vlc_anneal::Metric = metric.parse().map_err(PyValueError::new_err)?;
    let ids = ids.as_ref().map(self::ids).transpose()?;
    let (n, d, data) = rows(&x, "the vectors")?;
    if let Some(ids) = &ids
        && ids.len() != n
    {
        return Err(PyValueError::new_err(format!(
            "{} ids for {n} vectors",
            ids.len()
        )));
    }
    let mut cfg = vlc_anneal::Config::new(anchors);
    cfg.pq_bytes = bytes;
    cfg.iterations = iterations;
    cfg.seed = seed;
    cfg.tolerance = tolerance;
    cfg.metric = metric;
    cfg.mode = if exact {
        vlc_anneal::Mode::Exact
    } else {
        vlc_anneal::Mode::Fast
    };
    cfg.report_each_iteration = progress.is_some();
    // The callback's first exception, raised once the work is done.
    let mut raised: Option<PyErr> = None;
    let (index, seconds) =
        py.detach(|| -> PyResult<(vlc_anneal::Index, vlc_anneal::Timings)> {
            // The array itself, not a copy (checked for non-finite values on every core): a
            // GPU compression then holds the array and the device's copy, nothing more.
            let rows = vlc_anneal::MatrixRef::new(n, d, data).map_err(py_err)?;
            let mut report = |p: vlc_anneal::Progress<'_>| {
                let Some(cb) = &progress else { return };
                if raised.is_some() {
                    return;
                }
                Python::attach(|py| {
                    let args = match p {
                        vlc_anneal::Progress::Phase { name, steps } => (name, 0, steps, None),
                        vlc_anneal::Progress::Iteration(r) => {
                            ("annealing", r.iteration, cfg.iterations, Some(r.energy))
                        }
                        vlc_anneal::Progress::Step(done) => {
                            ("coding", done, cfg.pq_iterations, None)
                        }
                    };
                    if let Err(e) = cb.call1(py, args) {
                        raised = Some(e);
                    }
                });
            };
            let (index, seconds) = backend::run(
                backend,
                backend::Compress {
                    data: rows,
                    cfg: &cfg,
                    progress: &mut report,
                },
            )?;
            let index = match ids {
                Some(ids) => index.with_ids(ids).map_err(py_err)?,
                None => index,
            };
            let index = match refine {
                true => index.with_refine_rows(rows).map_err(py_err)?,
                false => index,
            };
            Ok((index, seconds))
        })?;
    if let Some(e) = raised {
        return Err(e);
    }
    let mut index = PyIndex::new(index);
    index.seconds = Some(seconds);
    Ok(index)
}

/// Sets how many threads search and the CPU backend use (0: one per core). Rayon's pool is
/// built once per process: this must come before the first compression or search.
#[pyfunction]
fn set_threads(threads: usize) -> PyResult<()> {
    vlc_anneal::index::set_threads(threads);
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()
        .map_err(|e| {
            PyRuntimeError::new_err(format!(
                "set_threads({threads}): {e} (call it before the first compression or search)"
            ))
        })
}

/// The backends this process can start, best first (`cuda`, `wgpu` on a hardware GPU or a
/// software one, `cpu`).
#[pyfunction]
fn backends_present(py: Python<'_>) -> Vec<&'static str> {
    py.detach(backend::present)
}

#[pymodule]
fn _vlc(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(compress, m)?)?;
    m.add_function(wrap_pyfunction!(set_threads, m)?)?;
    m.add_function(wrap_pyfunction!(backends_present, m)?)?;
    m.add_class::<PyIndex>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
