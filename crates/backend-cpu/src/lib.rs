//! # backend-cpu: the reference backend
//!
//! Implements every [`hal::Backend`] primitive and the scalar program IR on the CPU. It is the
//! reference the GPU backends are checked against, and a real fallback for users without a
//! GPU: kernels run on all cores (rayon), GEMM uses the `gemm` crate's SIMD micro-kernels, and
//! `f16`/`bf16` storage goes through `half`.
//!
//! ```
//! use backend_cpu::CpuBackend;
//! use hal::{Backend, BackendExt, BinaryOp, Layout, View};
//! let cpu = CpuBackend::new();
//! let a = cpu.upload(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
//! let b = cpu.upload(&[10.0f32, 20.0, 30.0]).unwrap();
//! let out = cpu.alloc(hal::DType::F32, 6).unwrap();
//! let (la, lb) = (Layout::contiguous(&[2, 3]), Layout::contiguous(&[3]));
//! // b broadcasts along the rows of a
//! cpu.binary(BinaryOp::Add, View::new(&a, &la), View::new(&b, &lb), View::new(&out, &la)).unwrap();
//! assert_eq!(cpu.read::<f32>(&out).unwrap(), vec![11.0, 22.0, 33.0, 14.0, 25.0, 36.0]);
//! ```
//!
//! Execution model: a call runs to completion before it returns (the "queue" is the calling
//! thread), using rayon's pool inside. Calls are serialised process-wide by one lock, which is
//! what makes the raw-pointer kernels sound; do not call the backend from inside a rayon
//! parallel iterator of your own, where a stolen task could try to take the lock again.

// Kernels take each operand as a pointer plus a layout, so eight arguments are the norm, not a
// smell; bundling them into structs would only rename the problem.
#![allow(clippy::too_many_arguments)]

mod cluster;
mod elementwise;
mod indexing;
mod linalg;
mod optim;
mod program;
mod reduce;
mod storage;
mod walk;

pub use program::CpuKernel;
pub use storage::CpuBuffer;

use hal::ir::Program;
use hal::{
    AdamParams, ArgReduceOp, Backend, BinaryOp, Capabilities, Conv2dGeometry, Csr, DType,
    DeviceBuffer, DeviceInfo, DeviceKind, Distribution, Error, Layout, ReduceOp, Result, SgdParams,
    TernaryOp, UnaryOp, View,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

static EXEC: Mutex<()> = Mutex::new(());

fn exec() -> MutexGuard<'static, ()> {
    // A panic inside a kernel poisons the lock but leaves no state to repair.
    EXEC.lock().unwrap_or_else(|p| p.into_inner())
}

/// The CPU device handle. Cheap to clone; clones share the kernel cache.
#[derive(Clone, Default)]
pub struct CpuBackend {
    kernels: Arc<Mutex<HashMap<u64, Vec<CpuKernel>>>>,
}

impl std::fmt::Debug for CpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CpuBackend({} threads)", rayon::current_num_threads())
    }
}

impl CpuBackend {
    pub fn new() -> Self {
        Self::default()
    }
    /// Kernels compiled so far (structurally distinct programs).
    pub fn cached_kernels(&self) -> usize {
        self.kernels
            .lock()
            .map(|k| k.values().map(Vec::len).sum())
            .unwrap_or(0)
    }
}

/// `(total, available)` system memory in bytes, from `/proc/meminfo` where it exists.
fn memory() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<u64>().ok())
            .map(|kb| kb * 1024)
    };
    let total = field("MemTotal:").unwrap_or(16 << 30);
    (total, field("MemAvailable:").unwrap_or(total))
}

// ----- argument checks shared by the primitives -----

fn fits(op: &'static str, v: View<'_, CpuBuffer>) -> Result<()> {
    v.layout.check_fits(op, v.buffer.len())
}

fn same_shape(op: &'static str, expected: &[usize], got: &[usize], what: &str) -> Result<()> {
    if expected != got {
        return Err(Error::ShapeMismatch {
            op,
            expected: expected.to_vec(),
            got: got.to_vec(),
            detail: what.to_string(),
        });
    }
    Ok(())
}

fn float(op: &'static str, dtype: DType) -> Result<()> {
    if !dtype.is_float() {
        return Err(Error::UnsupportedDType {
            op,
            dtype,
            detail: " (a float dtype is required)".into(),
        });
    }
    Ok(())
}

fn dtype_is(op: &'static str, expected: DType, got: DType) -> Result<()> {
    if expected != got {
        return Err(Error::DTypeMismatch { op, expected, got });
    }
    Ok(())
}

fn index_dtype(op: &'static str, dtype: DType) -> Result<()> {
    if !matches!(dtype, DType::U32 | DType::I32) {
        return Err(Error::UnsupportedDType {
            op,
            dtype,
            detail: " (indices are u32 or i32)".into(),
        });
    }
    Ok(())
}

fn rank(op: &'static str, v: View<'_, CpuBuffer>, r: usize, what: &str) -> Result<()> {
    if v.layout.rank() != r {
        return Err(Error::InvalidArgument {
            op,
            detail: format!("{what} must have rank {r}, got shape {:?}", v.layout.shape),
        });
    }
    Ok(())
}

/// `v`'s layout broadcast to the output's shape.
fn broadcast(op: &'static str, v: View<'_, CpuBuffer>, shape: &[usize]) -> Result<Layout> {
    fits(op, v)?;
    v.layout
        .broadcast_to(shape)
        .map_err(|_| Error::ShapeMismatch {
            op,
            expected: shape.to_vec(),
            got: v.layout.shape.clone(),
            detail: "operand cannot be broadcast to the output shape".into(),
        })
}

/// Checks that every index in `index` lies in `0..bound`; the first one that does not is the error.
fn check_indices(op: &'static str, index: View<'_, CpuBuffer>, bound: usize) -> Result<()> {
    let walk = walk::Walk::new(&index.layout.shape, [index.layout]);
    let src = index.buffer.src();
    let mut bad: Option<i64> = None;
    walk.runs(0, walk.numel(), |_, [o], [s], len| {
        for j in 0..len as isize {
            // SAFETY: the view was checked to lie inside its buffer.
            let v = unsafe { src.load_index(o + j * s) };
            if bad.is_none() && (v < 0 || v as u64 >= bound as u64) {
                bad = Some(v);
            }
        }
    });
    match bad {
        Some(index) => Err(Error::IndexOutOfRange { op, index, bound }),
        None => Ok(()),
    }
}

fn f32_slice(buf: &CpuBuffer) -> &[f32] {
    // SAFETY: dtype checked by callers; the memory lives as long as the buffer handle.
    unsafe { std::slice::from_raw_parts(buf.typed::<f32>(), buf.len()) }
}

fn u32_slice(buf: &CpuBuffer) -> &[u32] {
    unsafe { std::slice::from_raw_parts(buf.typed::<u32>(), buf.len()) }
}

/// A contiguous `u32` copy of an index view (for kernels that want a slice).
fn indices_u32(v: View<'_, CpuBuffer>) -> Vec<u32> {
    let mut out = vec![0u32; v.layout.numel()];
    let dst = storage::Dst {
        ptr: out.as_mut_ptr() as *mut u8,
        dtype: DType::U32,
    };
    elementwise::copy(
        v.buffer.src(),
        v.layout,
        dst,
        &Layout::contiguous(&v.layout.shape),
    );
    out
}

impl Backend for CpuBackend {
    type Buffer = CpuBuffer;
    type Kernel = CpuKernel;

    fn info(&self) -> DeviceInfo {
        let (total, available) = memory();
        let name = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|t| {
                t.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split(':').nth(1))
                    .map(|s| s.trim().to_string())
            })
            .unwrap_or_else(|| std::env::consts::ARCH.to_string());
        DeviceInfo {
            backend: "cpu",
            name: format!("{name} ({} threads)", rayon::current_num_threads()),
            kind: DeviceKind::Cpu,
            memory_total: total,
            memory_available: available,
        }
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            dtypes: DType::ALL.to_vec(),
            max_buffer_bytes: memory().0,
            parallelism: rayon::current_num_threads(),
            native_float_atomics: false,
            subgroups: false,
            matrix_units: false,
            graph_capture: false,
        }
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    fn alloc(&self, dtype: DType, len: usize) -> Result<CpuBuffer> {
        let requested = len as u128 * dtype.size_in_bytes() as u128;
        let (total, _) = memory();
        if requested > total as u128 {
            return Err(Error::AllocationTooLarge {
                requested_bytes: requested,
                limit_bytes: total,
                what: format!(
                    "{len} elements of {dtype}; the CPU backend's limit is the system memory"
                ),
            });
        }
        storage::Storage::zeroed(dtype, len)
            .map(|s| CpuBuffer(Arc::new(s)))
            .ok_or(Error::OutOfMemory {
                requested_bytes: requested,
            })
    }

    fn upload_bytes(&self, dtype: DType, bytes: &[u8]) -> Result<CpuBuffer> {
        let size = dtype.size_in_bytes();
        if bytes.len() % size != 0 {
            return Err(Error::InvalidArgument {
                op: "upload",
                detail: format!(
                    "{} bytes is not a whole number of {dtype} elements",
                    bytes.len()
                ),
            });
        }
        let buf = self.alloc(dtype, bytes.len() / size)?;
        let _g = exec();
        // SAFETY: the new buffer has exactly `bytes.len()` bytes.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.0.as_ptr(), bytes.len()) };
        Ok(buf)
    }

    fn write_bytes(&self, dst: &CpuBuffer, bytes: &[u8]) -> Result<()> {
        if bytes.len() != dst.0.bytes() {
            return Err(Error::InvalidArgument {
                op: "write",
                detail: format!(
                    "{} bytes written to a buffer of {} bytes",
                    bytes.len(),
                    dst.0.bytes()
                ),
            });
        }
        let _g = exec();
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst.0.as_ptr(), bytes.len()) };
        Ok(())
    }

    fn read_bytes(&self, src: &CpuBuffer) -> Result<Vec<u8>> {
        let _g = exec();
        // SAFETY: the storage holds `bytes()` initialised bytes.
        Ok(unsafe { std::slice::from_raw_parts(src.0.as_ptr(), src.0.bytes()) }.to_vec())
    }

    fn fill(&self, out: View<'_, CpuBuffer>, value: f64) -> Result<()> {
        fits("fill", out)?;
        let _g = exec();
        elementwise::fill(out.buffer.dst(), out.layout, value);
        Ok(())
    }

    fn copy(&self, src: View<'_, CpuBuffer>, out: View<'_, CpuBuffer>) -> Result<()> {
        fits("copy", src)?;
        fits("copy", out)?;
        same_shape(
            "copy",
            &out.layout.shape,
            &src.layout.shape,
            "copy needs equal shapes",
        )?;
        let _g = exec();
        elementwise::copy(src.buffer.src(), src.layout, out.buffer.dst(), out.layout);
        Ok(())
    }

    fn unary(&self, op: UnaryOp, x: View<'_, CpuBuffer>, out: View<'_, CpuBuffer>) -> Result<()> {
        fits("unary", out)?;
        float("unary", x.dtype())?;
        float("unary", out.dtype())?;
        let xl = broadcast("unary", x, &out.layout.shape)?;
        let _g = exec();
        elementwise::unary(op, x.buffer.src(), &xl, out.buffer.dst(), out.layout);
        Ok(())
    }

    fn binary(
        &self,
        op: BinaryOp,
        a: View<'_, CpuBuffer>,
        b: View<'_, CpuBuffer>,
        out: View<'_, CpuBuffer>,
    ) -> Result<()> {
        fits("binary", out)?;
        let al = broadcast("binary", a, &out.layout.shape)?;
        let bl = broadcast("binary", b, &out.layout.shape)?;
        let _g = exec();
        elementwise::binary(
            op,
            a.buffer.src(),
            &al,
            b.buffer.src(),
            &bl,
            out.buffer.dst(),
            out.layout,
        );
        Ok(())
    }

    fn ternary(
        &self,
        op: TernaryOp,
        a: View<'_, CpuBuffer>,
        b: View<'_, CpuBuffer>,
        c: View<'_, CpuBuffer>,
        out: View<'_, CpuBuffer>,
    ) -> Result<()> {
        fits("ternary", out)?;
        let s = &out.layout.shape;
        let (al, bl, cl) = (
            broadcast("ternary", a, s)?,
            broadcast("ternary", b, s)?,
            broadcast("ternary", c, s)?,
        );
        let _g = exec();
        elementwise::ternary(
            op,
            a.buffer.src(),
            &al,
            b.buffer.src(),
            &bl,
            c.buffer.src(),
            &cl,
            out.buffer.dst(),
            out.layout,
        );
        Ok(())
    }

    fn reduce(
        &self,
        op: ReduceOp,
        x: View<'_, CpuBuffer>,
        axes: &[usize],
        out: View<'_, CpuBuffer>,
    ) -> Result<()> {
        fits("reduce", x)?;
        fits("reduce", out)?;
        float("reduce", out.dtype())?;
        let mut expected = x.layout.shape.clone();
        for (i, &a) in axes.iter().enumerate() {
            if a >= x.layout.rank() || axes[..i].contains(&a) {
                return Err(Error::InvalidArgument {
                    op: "reduce",
                    detail: format!(
                        "axes {axes:?} are not distinct axes of rank {}",
                        x.layout.rank()
                    ),
                });
            }
            expected[a] = 1;
        }
        same_shape(
            "reduce",
            &expected,
            &out.layout.shape,
            "the output keeps reduced axes as size 1",
        )?;
        let reduced: usize = axes.iter().map(|&a| x.layout.shape[a]).product();
        if reduced == 0 && out.layout.numel() > 0 && matches!(op, ReduceOp::Max | ReduceOp::Min) {
            return Err(Error::Empty {
                op: "reduce",
                detail: format!(
                    "{op:?} over axes {axes:?} of shape {:?} has no elements",
                    x.layout.shape
                ),
            });
        }
        let _g = exec();
        reduce::reduce(
            op,
            x.buffer.src(),
            x.layout,
            axes,
            out.buffer.dst(),
            out.layout,
        );
        Ok(())
    }

    fn arg_reduce(
        &self,
        op: ArgReduceOp,
        x: View<'_, CpuBuffer>,
        axis: usize,
        out: View<'_, CpuBuffer>,
    ) -> Result<()> {
        fits("arg_reduce", x)?;
        fits("arg_reduce", out)?;
        dtype_is("arg_reduce", DType::U32, out.dtype())?;
        if axis >= x.layout.rank() {
            return Err(Error::InvalidArgument {
                op: "arg_reduce",
                detail: format!("axis {axis} is out of range for shape {:?}", x.layout.shape),
            });
        }
        let mut expected = x.layout.shape.clone();
        expected[axis] = 1;
        same_shape(
            "arg_reduce",
            &expected,
            &out.layout.shape,
            "the output keeps the reduced axis as size 1",
        )?;
        if x.layout.shape[axis] == 0 && out.layout.numel() > 0 {
            return Err(Error::Empty {
                op: "arg_reduce",
                detail: format!("axis {axis} of shape {:?} has no elements", x.layout.shape),
            });
        }
        let _g = exec();
        reduce::arg_reduce(
            op,
            x.buffer.src(),
            x.layout,
            axis,
            out.buffer.dst(),
            out.layout,
        );
        Ok(())
    }

    fn matmul(
        &self,
        a: View<'_, CpuBuffer>,
        b: View<'_, CpuBuffer>,
        out: View<'_, CpuBuffer>,
        alpha: f32,
        beta: f32,
    ) -> Result<()> {
        for (v, what) in [(a, "a"), (b, "b"), (out, "out")] {
            fits("matmul", v)?;
            float("matmul", v.dtype())?;
            if !(2..=3).contains(&v.layout.rank()) {
                return Err(Error::InvalidArgument {
                    op: "matmul",
                    detail: format!(
                        "{what} must have rank 2 or 3, got shape {:?}",
                        v.layout.shape
                    ),
                });
            }
        }
        dtype_is("matmul", a.dtype(), b.dtype())?;
        let (am, bm, om) = (
            linalg::Mat::of(a.layout),
            linalg::Mat::of(b.layout),
            linalg::Mat::of(out.layout),
        );
        let batch_ok = |x: usize| x == om.batch || x == 1;
        if am.cols != bm.rows
            || am.rows != om.rows
            || bm.cols != om.cols
            || !batch_ok(am.batch)
            || !batch_ok(bm.batch)
        {
            return Err(Error::ShapeMismatch {
                op: "matmul",
                expected: a.layout.shape.clone(),
                got: b.layout.shape.clone(),
                detail: format!(
                    "[batch, m, k] @ [batch, k, n] cannot produce an output of shape {:?}",
                    out.layout.shape
                ),
            });
        }
        if out.buffer.same_memory(a.buffer) || out.buffer.same_memory(b.buffer) {
            return Err(Error::InvalidArgument {
                op: "matmul",
                detail: "the output must not share memory with an operand".into(),
            });
        }
        let _g = exec();
        linalg::matmul(a.buffer, am, b.buffer, bm, out.buffer, om, alpha, beta);
        Ok(())
    }

    fn spmv_csr(
        &self,
        a: Csr<'_, CpuBuffer>,
        x: &CpuBuffer,
        y: &CpuBuffer,
        alpha: f32,
        beta: f32,
    ) -> Result<()> {
        const OP: &str = "spmv_csr";
        dtype_is(OP, DType::U32, a.row_offsets.dtype())?;
        dtype_is(OP, DType::U32, a.col_indices.dtype())?;
        for buf in [a.values, x, y] {
            dtype_is(OP, DType::F32, buf.dtype())?;
        }
        if a.row_offsets.len() != a.rows + 1
            || x.len() != a.cols
            || y.len() != a.rows
            || a.col_indices.len() != a.values.len()
        {
            return Err(Error::ShapeMismatch {
                op: OP,
                expected: vec![a.rows + 1, a.cols, a.rows],
                got: vec![a.row_offsets.len(), x.len(), y.len()],
                detail: "row_offsets needs rows + 1 entries, x cols, y rows; col_indices and values one length".into(),
            });
        }
        let _g = exec();
        let offsets = u32_slice(a.row_offsets);
        let nnz = a.values.len();
        if offsets[0] != 0
            || offsets.windows(2).any(|w| w[0] > w[1])
            || offsets[a.rows] as usize > nnz
        {
            return Err(Error::InvalidArgument {
                op: OP,
                detail:
                    "row_offsets must start at 0, never decrease and end within the stored entries"
                        .into(),
            });
        }
        let cols = u32_slice(a.col_indices);
        if let Some(&bad) = cols[..offsets[a.rows] as usize]
            .iter()
            .find(|&&c| c as usize >= a.cols)
        {
            return Err(Error::IndexOutOfRange {
                op: OP,
                index: bad as i64,
                bound: a.cols,
            });
        }
        linalg::spmv(
            a.rows,
            offsets,
            cols,
            f32_slice(a.values),
            f32_slice(x),
            y.typed::<f32>(),
            alpha,
            beta,
        );
        Ok(())
    }

    fn gather(
        &self,
        x: View<'_, CpuBuffer>,
        axis: usize,
        index: View<'_, CpuBuffer>,
        out: View<'_, CpuBuffer>,
    ) -> Result<()> {
        check_gather_shapes("gather", x, axis, index)?;
        fits("gather", out)?;
        same_shape(
            "gather",
            &index.layout.shape,
            &out.layout.shape,
            "the output has the index's shape",
        )?;
        let _g = exec();
        check_indices("gather", index, x.layout.shape[axis])?;
        indexing::gather(
            x.buffer.src(),
            x.layout,
            axis,
            index.buffer.src(),
            index.layout,
            out.buffer.dst(),
            out.layout,
        );
        Ok(())
    }

    fn scatter_add(
        &self,
        src: View<'_, CpuBuffer>,
        axis: usize,
        index: View<'_, CpuBuffer>,
        out: View<'_, CpuBuffer>,
    ) -> Result<()> {
        check_gather_shapes("scatter_add", out, axis, index)?;
        fits("scatter_add", src)?;
        float("scatter_add", out.dtype())?;
        same_shape(
            "scatter_add",
            &index.layout.shape,
            &src.layout.shape,
            "the source has the index's shape",
        )?;
        let _g = exec();
        check_indices("scatter_add", index, out.layout.shape[axis])?;
        indexing::scatter_add(
            src.buffer.src(),
            src.layout,
            axis,
            index.buffer.src(),
            index.layout,
            out.buffer.dst(),
            out.layout,
        );
        Ok(())
    }

    fn im2col(
        &self,
        x: View<'_, CpuBuffer>,
        g: &Conv2dGeometry,
        out: View<'_, CpuBuffer>,
    ) -> Result<()> {
        let cols = check_conv("im2col", g)?;
        fits("im2col", x)?;
        fits("im2col", out)?;
        same_shape(
            "im2col",
            &g.image_shape(),
            &x.layout.shape,
            "the input has the geometry's image shape",
        )?;
        same_shape(
            "im2col",
            &cols,
            &out.layout.shape,
            "the output has the geometry's columns shape",
        )?;
        let _g = exec();
        indexing::im2col(x.buffer.src(), x.layout, g, out.buffer.dst(), out.layout);
        Ok(())
    }

    fn col2im(
        &self,
        cols: View<'_, CpuBuffer>,
        g: &Conv2dGeometry,
        out: View<'_, CpuBuffer>,
    ) -> Result<()> {
        let shape = check_conv("col2im", g)?;
        fits("col2im", cols)?;
        fits("col2im", out)?;
        same_shape(
            "col2im",
            &shape,
            &cols.layout.shape,
            "the input has the geometry's columns shape",
        )?;
        same_shape(
            "col2im",
            &g.image_shape(),
            &out.layout.shape,
            "the output has the geometry's image shape",
        )?;
        let _g = exec();
        indexing::col2im(
            cols.buffer.src(),
            cols.layout,
            g,
            out.buffer.dst(),
            out.layout,
        );
        Ok(())
    }

    fn nearest_centroid(
        &self,
        x: View<'_, CpuBuffer>,
        c: View<'_, CpuBuffer>,
        out_index: View<'_, CpuBuffer>,
        out_distance: View<'_, CpuBuffer>,
    ) -> Result<()> {
        const OP: &str = "nearest_centroid";
        for v in [x, c, out_index, out_distance] {
            fits(OP, v)?;
        }
        rank(OP, x, 2, "x")?;
        rank(OP, c, 2, "centroids")?;
        float(OP, x.dtype())?;
        float(OP, c.dtype())?;
        dtype_is(OP, DType::U32, out_index.dtype())?;
        dtype_is(OP, DType::F32, out_distance.dtype())?;
        let (n, d) = (x.layout.shape[0], x.layout.shape[1]);
        same_shape(
            OP,
            &[c.layout.shape[0], d],
            &c.layout.shape,
            "centroids have the points' dimension",
        )?;
        same_shape(OP, &[n], &out_index.layout.shape, "one index per point")?;
        same_shape(
            OP,
            &[n],
            &out_distance.layout.shape,
            "one distance per point",
        )?;
        if c.layout.shape[0] == 0 && n > 0 {
            return Err(Error::Empty {
                op: OP,
                detail: "no centroids to search".into(),
            });
        }
        let _g = exec();
        cluster::nearest_centroid(
            x.buffer.src(),
            x.layout,
            c.buffer.src(),
            c.layout,
            out_index.buffer.dst(),
            out_index.layout,
            out_distance.buffer.dst(),
            out_distance.layout,
        );
        Ok(())
    }

    fn segment_sum(
        &self,
        x: View<'_, CpuBuffer>,
        segment: View<'_, CpuBuffer>,
        weights: Option<View<'_, CpuBuffer>>,
        sums: View<'_, CpuBuffer>,
        counts: View<'_, CpuBuffer>,
    ) -> Result<()> {
        const OP: &str = "segment_sum";
        for v in [x, segment, sums, counts].into_iter().chain(weights) {
            fits(OP, v)?;
        }
        rank(OP, x, 2, "x")?;
        rank(OP, sums, 2, "sums")?;
        dtype_is(OP, DType::U32, segment.dtype())?;
        float(OP, sums.dtype())?;
        float(OP, counts.dtype())?;
        let (n, d, m) = (x.layout.shape[0], x.layout.shape[1], sums.layout.shape[0]);
        same_shape(OP, &[n], &segment.layout.shape, "one segment id per row")?;
        same_shape(
            OP,
            &[m, d],
            &sums.layout.shape,
            "sums are [segments, columns]",
        )?;
        same_shape(OP, &[m], &counts.layout.shape, "one count per segment")?;
        if let Some(w) = weights {
            same_shape(OP, &[n], &w.layout.shape, "one weight per row")?;
        }
        let _g = exec();
        check_indices(OP, segment, m)?;
        let seg = indices_u32(segment);
        let w = weights.map(|w| {
            let mut v = vec![0f32; n];
            elementwise::copy(
                w.buffer.src(),
                w.layout,
                storage::Dst {
                    ptr: v.as_mut_ptr() as *mut u8,
                    dtype: DType::F32,
                },
                &Layout::contiguous(&[n]),
            );
            v
        });
        cluster::segment_sum(
            x.buffer.src(),
            x.layout,
            &seg,
            w.as_deref(),
            sums.buffer.dst(),
            sums.layout,
            counts.buffer.dst(),
            counts.layout,
        );
        Ok(())
    }

    fn sgd_step(
        &self,
        param: &CpuBuffer,
        grad: &CpuBuffer,
        momentum_buffer: Option<&CpuBuffer>,
        p: &SgdParams,
    ) -> Result<()> {
        let bufs: Vec<&CpuBuffer> = [param, grad].into_iter().chain(momentum_buffer).collect();
        check_optimizer("sgd_step", &bufs)?;
        if p.momentum != 0.0 && momentum_buffer.is_none() {
            return Err(Error::InvalidArgument {
                op: "sgd_step",
                detail: "momentum != 0 needs a momentum buffer".into(),
            });
        }
        let _g = exec();
        let sh = |b: &CpuBuffer| optim::Shared(b.typed::<f32>());
        let buf = if p.momentum != 0.0 {
            momentum_buffer.map(sh)
        } else {
            None
        };
        optim::sgd(param.len(), sh(param), sh(grad), buf, p);
        Ok(())
    }

    fn adam_step(
        &self,
        param: &CpuBuffer,
        grad: &CpuBuffer,
        m: &CpuBuffer,
        v: &CpuBuffer,
        p: &AdamParams,
    ) -> Result<()> {
        check_optimizer("adam_step", &[param, grad, m, v])?;
        let _g = exec();
        let sh = |b: &CpuBuffer| optim::Shared(b.typed::<f32>());
        optim::adam(param.len(), sh(param), sh(grad), sh(m), sh(v), p);
        Ok(())
    }

    fn random(
        &self,
        out: View<'_, CpuBuffer>,
        dist: Distribution,
        seed: u64,
        offset: u64,
    ) -> Result<()> {
        fits("random", out)?;
        float("random", out.dtype())?;
        let _g = exec();
        optim::random(out.buffer.dst(), out.layout, dist, seed, offset);
        Ok(())
    }

    fn compile(&self, program: &Program) -> Result<CpuKernel> {
        let hash = program.structural_hash();
        let mut cache = self.kernels.lock().unwrap_or_else(|p| p.into_inner());
        let bucket = cache.entry(hash).or_default();
        if let Some(k) = bucket
            .iter()
            .find(|k| k.0.program.buffers == program.buffers && k.0.program.insts == program.insts)
        {
            return Ok(k.clone());
        }
        let kernel = CpuKernel(Arc::new(program::compile(program)?));
        bucket.push(kernel.clone());
        Ok(kernel)
    }

    fn launch(&self, kernel: &CpuKernel, args: &[&CpuBuffer], n: usize) -> Result<()> {
        let _g = exec();
        program::launch(&kernel.0, args, n)
    }
}

fn check_gather_shapes(
    op: &'static str,
    x: View<'_, CpuBuffer>,
    axis: usize,
    index: View<'_, CpuBuffer>,
) -> Result<()> {
    fits(op, x)?;
    fits(op, index)?;
    index_dtype(op, index.dtype())?;
    let (xs, is) = (&x.layout.shape, &index.layout.shape);
    if axis >= xs.len() || xs.len() != is.len() || (0..xs.len()).any(|d| d != axis && is[d] > xs[d])
    {
        return Err(Error::ShapeMismatch {
            op,
            expected: xs.clone(),
            got: is.clone(),
            detail: format!(
                "the index must have the data's rank, axis {axis} inside it, and no larger dimension off the axis"
            ),
        });
    }
    Ok(())
}

fn check_conv(op: &'static str, g: &Conv2dGeometry) -> Result<Vec<usize>> {
    g.cols_shape()
        .map(|s| s.to_vec())
        .ok_or_else(|| Error::InvalidArgument { op, detail: format!("{g:?} has a zero stride, dilation or kernel, or a kernel larger than the padded input") })
}

fn check_optimizer(op: &'static str, bufs: &[&CpuBuffer]) -> Result<()> {
    for b in bufs {
        dtype_is(op, DType::F32, b.dtype())?;
        if b.len() != bufs[0].len() {
            return Err(Error::ShapeMismatch {
                op,
                expected: vec![bufs[0].len()],
                got: vec![b.len()],
                detail: "optimizer buffers have one length".into(),
            });
        }
    }
    Ok(())
}
