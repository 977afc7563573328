//! The backend a call names (`cpu`, `wgpu`, `cuda`, `auto`), started once per process.
//!
//! Starting a GPU backend costs a context and a device (tenths of a second); a Python session
//! calls `compress`, `add` and `search` many times, so each backend is kept once started.
//! Work is a [`Job`], generic over the backend, so that each runs monomorphised.

use crate::py_err;
use backends::{backend_cpu::CpuBackend, backend_cuda::CudaBackend, backend_wgpu::WgpuBackend};
use hal::Backend;
use pyo3::PyResult;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use std::sync::{Arc, Mutex, OnceLock};
use vlc_anneal::index::DeviceSearch;

/// Work to run on whichever backend a call names.
pub(crate) trait Job {
    type Out;
    fn run<B: Backend>(self, backend: &B) -> vlc_anneal::Result<Self::Out>;
}

/// The backend started once, or why it could not start (kept, so that `auto` does not retry
/// an absent GPU on every call). `OnceLock` runs one start even when threads race to it.
struct Slot<B>(OnceLock<Result<B, String>>);

impl<B: Clone> Slot<B> {
    const fn new() -> Self {
        Self(OnceLock::new())
    }

    fn get(&self, start: impl FnOnce() -> Result<B, String>) -> Result<B, String> {
        self.0.get_or_init(start).clone()
    }
}

static CUDA: Slot<CudaBackend> = Slot::new();
static WGPU: Slot<WgpuBackend> = Slot::new();

fn cuda() -> Result<CudaBackend, String> {
    CUDA.get(|| CudaBackend::new().map_err(|e| e.to_string()))
}

fn wgpu() -> Result<WgpuBackend, String> {
    WGPU.get(|| WgpuBackend::new().map_err(|e| e.to_string()))
}

/// The backends that start here, best first.
pub(crate) fn present() -> Vec<&'static str> {
    let mut out = Vec::new();
    if cuda().is_ok() {
        out.push("cuda");
    }
    if wgpu().is_ok() {
        out.push("wgpu");
    }
    out.push("cpu");
    out
}

/// What `auto` picks: CUDA where it starts, else wgpu on a hardware GPU (not a software
/// rasteriser such as lavapipe), else the CPU.
fn resolve(name: &str) -> &str {
    if name != "auto" {
        return name;
    }
    if cuda().is_ok() {
        "cuda"
    } else if wgpu().is_ok_and(|b| b.info().kind.is_hardware_gpu()) {
        "wgpu"
    } else {
        "cpu"
    }
}

/// Runs `job` on the backend `name` names; a backend that does not start is a `RuntimeError`
/// with the reason, an unknown name a `ValueError`.
pub(crate) fn run<J: Job>(name: &str, job: J) -> PyResult<J::Out> {
    let unavailable = |which: &str, e: String| {
        PyRuntimeError::new_err(format!("the {which} backend is not available here: {e}"))
    };
    match resolve(name) {
        "cpu" => job.run(&CpuBackend::new()).map_err(py_err),
        "wgpu" => {
            let b = wgpu().map_err(|e| unavailable("wgpu", e))?;
            job.run(&b).map_err(py_err)
        }
        "cuda" => {
            let b = cuda().map_err(|e| unavailable("cuda", e))?;
            job.run(&b).map_err(py_err)
        }
        other => Err(PyValueError::new_err(format!(
            "unknown backend {other:?} (expected \"cpu\", \"wgpu\", \"cuda\" or \"auto\")"
        ))),
    }
}

/// A compression.
pub(crate) struct Compress<'a> {
    pub data: vlc_anneal::MatrixRef<'a>,
    pub cfg: &'a vlc_anneal::Config,
    pub progress: &'a mut dyn FnMut(vlc_anneal::Progress<'_>),
}

impl Job for Compress<'_> {
    type Out = (vlc_anneal::Index, vlc_anneal::Timings);
    fn run<B: Backend>(self, backend: &B) -> vlc_anneal::Result<Self::Out> {
        let out = vlc_anneal::compress_rows(backend, self.data, self.cfg, self.progress)?;
        Ok((out.index, out.seconds))
    }
}

/// Vectors added to an index.
pub(crate) struct Add<'a> {
    pub index: &'a vlc_anneal::Index,
    pub data: &'a vlc_anneal::Matrix,
    pub ids: Option<&'a [u64]>,
}

impl Job for Add<'_> {
    type Out = vlc_anneal::Index;
    fn run<B: Backend>(self, backend: &B) -> vlc_anneal::Result<vlc_anneal::Index> {
        self.index.add(backend, self.data, self.ids)
    }
}

/// An index's search structures on the GPU backends, made on the first search there and
/// dropped when the index changes ([`Searches::clear`]).
#[derive(Default)]
pub(crate) struct Searches {
    cuda: Mutex<Option<Arc<DeviceSearch<CudaBackend>>>>,
    wgpu: Mutex<Option<Arc<DeviceSearch<WgpuBackend>>>>,
}

/// The hits of a search, per query `(position, distance)`.
type Hits = Vec<Vec<(u32, f32)>>;

/// Below this many queries the host searches one query at a time; from it on, the coarse
/// step and the tables run as products on the CPU backend's GEMM.
const BATCH_FROM: usize = 32;

/// The host search: one query at a time, or batched; re-ranked where `rerank` > 0.
fn host_search(
    index: &vlc_anneal::Index,
    q: &vlc_anneal::Matrix,
    [k, nprobe, rerank]: [usize; 3],
) -> vlc_anneal::Result<Hits> {
    if rerank > 0 {
        index.search_reranked(&CpuBackend::new(), q, k, nprobe, rerank)
    } else if q.rows >= BATCH_FROM {
        index.search_batch(&CpuBackend::new(), q, k, nprobe)
    } else {
        index.search(q, k, nprobe)
    }
}

/// The search structures in `slot` (made on first use), or `None` where the index has no
/// device search.
fn structures<B: Backend>(
    slot: &Mutex<Option<Arc<DeviceSearch<B>>>>,
    index: &vlc_anneal::Index,
    backend: &B,
) -> vlc_anneal::Result<Option<Arc<DeviceSearch<B>>>> {
    let mut held = slot.lock().unwrap_or_else(|e| e.into_inner());
    if held.is_none() {
        *held = index.device_search(backend)?.map(Arc::new);
    }
    Ok(held.clone())
}

impl Searches {
    /// Drops the structures (the index changed).
    pub(crate) fn clear(&self) {
        *self.cuda.lock().unwrap_or_else(|e| e.into_inner()) = None;
        *self.wgpu.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// A search on the backend `name` names: `cpu` on the host's threads, `cuda` or `wgpu`
    /// with every step on the device, `auto` on the GPU where one starts (as `compress`);
    /// `[k, nprobe, rerank]` as [`DeviceSearch::search_reranked`] takes them.
    pub(crate) fn search(
        &self,
        name: &str,
        index: &vlc_anneal::Index,
        (nq, d, data): (usize, usize, &[f32]),
        sizes: [usize; 3],
    ) -> PyResult<Hits> {
        let [k, nprobe, rerank] = sizes;
        let unavailable = |which: &str, e: String| {
            PyRuntimeError::new_err(format!("the {which} backend is not available here: {e}"))
        };
        // The host searches take a copy; the device search reads the array in place.
        let host = || {
            let q = vlc_anneal::Matrix::from_slice(nq, d, data)?;
            host_search(index, &q, sizes)
        };
        fn on_device<B: Backend>(
            s: &DeviceSearch<B>,
            index: &vlc_anneal::Index,
            (nq, d, data): (usize, usize, &[f32]),
            [k, nprobe, rerank]: [usize; 3],
        ) -> vlc_anneal::Result<Hits> {
            if d == index.header.d {
                return s.search_rows(index, data, k, nprobe, rerank);
            }
            let q = vlc_anneal::Matrix::from_slice(nq, d, data)?;
            s.search_reranked(index, &q, k, nprobe, rerank)
        }
        let found = match resolve(name) {
            "cpu" => host(),
            "cuda" => {
                let b = cuda().map_err(|e| unavailable("cuda", e))?;
                match structures(&self.cuda, index, &b).map_err(py_err)? {
                    Some(s) => on_device(&s, index, (nq, d, data), [k, nprobe, rerank]),
                    None => host(),
                }
            }
            "wgpu" => {
                let b = wgpu().map_err(|e| unavailable("wgpu", e))?;
                match structures(&self.wgpu, index, &b).map_err(py_err)? {
                    Some(s) => on_device(&s, index, (nq, d, data), [k, nprobe, rerank]),
                    None => host(),
                }
            }
            other => {
                return Err(PyValueError::new_err(format!(
                    "unknown backend {other:?} (expected \"cpu\", \"wgpu\", \"cuda\" or \"auto\")"
                )));
            }
        };
        found.map_err(py_err)
    }
}
