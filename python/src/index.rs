//! `vlc._vlc.Index`: an index held by Python, searched, grown and shrunk in place.

use crate::{backend, py_err, rows};
use numpy::{IntoPyArray, PyArray1, PyArray2, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2};
use pyo3::exceptions::{PyIndexError, PyMemoryError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// A compressed, searchable index (see the `vlc` package for the documented API).
#[pyclass(name = "Index", module = "vlc._vlc")]
pub struct PyIndex {
    inner: vlc_anneal::Index,
    /// The compression's phases, for an index this process compressed.
    pub(crate) seconds: Option<vlc_anneal::Timings>,
    /// Search structures on the GPU backends, made on first use.
    searches: crate::backend::Searches,
}

impl PyIndex {
    pub(crate) fn new(inner: vlc_anneal::Index) -> Self {
        Self {
            inner,
            seconds: None,
            searches: Default::default(),
        }
    }
}

type Hits<'py> = (Bound<'py, PyArray2<f32>>, Bound<'py, PyArray2<i64>>);

#[pymethods]
impl PyIndex {
    /// Maps and validates an index file.
    #[staticmethod]
    fn load(py: Python<'_>, path: std::path::PathBuf) -> PyResult<Self> {
        let inner = py
            .detach(|| vlc_anneal::Index::open(&path))
            .map_err(py_err)?;
        Ok(Self::new(inner))
    }

    /// Writes the index to `path` atomically.
    fn save(&self, py: Python<'_>, path: std::path::PathBuf) -> PyResult<()> {
        py.detach(|| self.inner.save(&path)).map_err(py_err)
    }

    /// `(distances, ids)`, each `queries x k`; rows a query's probed lists could not fill are
    /// padded with id -1 and distance `missing`. `backend`: where the search runs (`cpu`: the
    /// host's threads; `cuda`, `wgpu`: every step on the device; `auto`). `rerank`: the
    /// candidates re-ranked by exact distance (0: none; the index must keep its vectors).
    #[pyo3(signature = (queries, k, nprobe, backend, rerank))]
    fn search<'py>(
        &self,
        py: Python<'py>,
        queries: PyReadonlyArray2<'_, f32>,
        k: usize,
        nprobe: usize,
        backend: &str,
        rerank: usize,
    ) -> PyResult<Hits<'py>> {
        let (nq, d, data) = rows(&queries, "the queries")?;
        let index = &self.inner;
        let missing = index.header.metric.unfound();
        // The results' arrays are checked against the memory there is before any work (a
        // huge k is padding, not an error, but must not take the process down).
        let len = nq
            .checked_mul(k)
            .filter(|l| {
                let bytes = (*l as u64).saturating_mul(12);
                bytes <= isize::MAX as u64
                    && vlc_anneal::index::available_memory().is_none_or(|a| bytes <= a)
            })
            .ok_or_else(|| {
                PyMemoryError::new_err(format!(
                    "{nq} queries x k = {k} results need more memory than is available"
                ))
            })?;
        let (dist, ids) = py.detach(|| -> PyResult<(Vec<f32>, Vec<i64>)> {
            let hits = self
                .searches
                .search(backend, index, (nq, d, data), [k, nprobe, rerank])?;
            let mut dist = vec![missing; len];
            let mut ids = vec![-1i64; len];
            for (row, found) in hits.iter().enumerate() {
                for (j, &(i, dv)) in found.iter().enumerate() {
                    dist[row * k + j] = dv;
                    ids[row * k + j] = index.id(i as usize) as i64;
                }
            }
            Ok((dist, ids))
        })?;
        Ok((
            dist.into_pyarray(py).reshape([nq, k])?,
            ids.into_pyarray(py).reshape([nq, k])?,
        ))
    }

    /// Adds `x`'s vectors (assigned to the current anchors, residuals coded with the current
    /// codebooks) on `backend`.
    #[pyo3(signature = (x, ids, backend))]
    fn add(
        &mut self,
        py: Python<'_>,
        x: PyReadonlyArray2<'_, f32>,
        ids: Option<PyReadonlyArray1<'_, i64>>,
        backend: &str,
    ) -> PyResult<()> {
        let ids = ids.as_ref().map(crate::ids).transpose()?;
        let (n, d, data) = rows(&x, "the vectors")?;
        let index = &self.inner;
        let grown = py.detach(|| {
            let data = vlc_anneal::Matrix::from_slice(n, d, data).map_err(py_err)?;
            backend::run(
                backend,
                backend::Add {
                    index,
                    data: &data,
                    ids: ids.as_deref(),
                },
            )
        })?;
        self.inner = grown;
        self.searches.clear();
        Ok(())
    }

    /// Keeps `x` (the index's vectors, in order) for re-ranking.
    fn set_refine(&mut self, py: Python<'_>, x: PyReadonlyArray2<'_, f32>) -> PyResult<()> {
        let (n, d, data) = rows(&x, "the vectors")?;
        let index = &self.inner;
        let kept = py.detach(|| {
            let data = vlc_anneal::Matrix::from_slice(n, d, data).map_err(py_err)?;
            index.with_refine(&data).map_err(py_err)
        })?;
        self.inner = kept;
        self.searches.clear();
        Ok(())
    }

    /// Drops the vectors kept for re-ranking.
    fn drop_refine(&mut self, py: Python<'_>) -> PyResult<()> {
        let index = &self.inner;
        self.inner = py.detach(|| index.without_refine()).map_err(py_err)?;
        self.searches.clear();
        Ok(())
    }

    /// Whether the index keeps its vectors for re-ranking.
    #[getter]
    fn has_refine(&self) -> bool {
        self.inner.has_refine()
    }

    /// Removes the vectors whose ids are given; returns how many went.
    fn remove(&mut self, py: Python<'_>, ids: PyReadonlyArray1<'_, i64>) -> PyResult<usize> {
        let ids = crate::ids(&ids)?;
        let index = &self.inner;
        let (smaller, removed) = py.detach(|| index.remove(&ids)).map_err(py_err)?;
        self.inner = smaller;
        self.searches.clear();
        Ok(removed)
    }

    /// Every vector reconstructed, `n x d` float32.
    fn decompress<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let index = &self.inner;
        let m = py.detach(|| index.decompress()).map_err(py_err)?;
        m.data.into_pyarray(py).reshape([m.rows, m.cols])
    }

    /// Vector `i`'s reconstruction (by position, 0 to n - 1).
    fn reconstruct<'py>(&self, py: Python<'py>, i: usize) -> PyResult<Bound<'py, PyArray1<f32>>> {
        let n = self.inner.header.n;
        if i >= n {
            return Err(PyIndexError::new_err(format!(
                "position {i} is out of range for {n} vectors"
            )));
        }
        let mut out = vec![0f32; self.inner.header.d];
        self.inner.reconstruct(i, &mut out);
        Ok(out.into_pyarray(py))
    }

    /// The vectors' ids in position order (positions where the index stores none).
    #[getter]
    fn ids<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i64>> {
        let index = &self.inner;
        let ids: Vec<i64> = (0..index.header.n).map(|i| index.id(i) as i64).collect();
        ids.into_pyarray(py)
    }

    /// Each vector's anchor, in position order.
    #[getter]
    fn assignments<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<u32>> {
        let index = &self.inner;
        let a: Vec<u32> = (0..index.header.n).map(|i| index.assignment(i)).collect();
        a.into_pyarray(py)
    }

    /// The anchors, `anchors x d` float32 (stored as float16).
    #[getter]
    fn anchor_vectors<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let h = &self.inner.header;
        self.inner
            .anchors
            .clone()
            .into_pyarray(py)
            .reshape([h.m, h.d])
    }

    /// Seconds the compression spent seeding, annealing, coding and in all (`None` for an
    /// index loaded from a file).
    #[getter]
    fn seconds<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(t) = self.seconds else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        d.set_item("seeding", t.seeding)?;
        d.set_item("annealing", t.annealing)?;
        d.set_item("coding", t.coding)?;
        d.set_item("total", t.total)?;
        Ok(Some(d))
    }

    #[getter]
    fn ntotal(&self) -> usize {
        self.inner.header.n
    }

    #[getter]
    fn d(&self) -> usize {
        self.inner.header.d
    }

    #[getter]
    fn anchors(&self) -> usize {
        self.inner.header.m
    }

    #[getter]
    fn bytes(&self) -> usize {
        self.inner.header.pq_bytes
    }

    #[getter]
    fn metric(&self) -> &'static str {
        self.inner.header.metric.name()
    }

    #[getter]
    fn energy(&self) -> f64 {
        self.inner.header.energy
    }

    #[getter]
    fn mse(&self) -> f64 {
        self.inner.header.mse
    }

    #[getter]
    fn exact(&self) -> bool {
        self.inner.header.exact
    }

    #[getter]
    fn has_ids(&self) -> bool {
        self.inner.has_ids()
    }

    #[getter]
    fn file_size(&self) -> usize {
        self.inner.file_size()
    }

    fn __len__(&self) -> usize {
        self.inner.header.n
    }

    fn __repr__(&self) -> String {
        let h = &self.inner.header;
        format!(
            "vlc.Index({} vectors of dimension {}, {} anchors, {} bytes per vector, metric {}, {} bytes)",
            h.n,
            h.d,
            h.m,
            h.pq_bytes,
            h.metric.name(),
            self.inner.file_size()
        )
    }
}
