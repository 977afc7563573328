//! gather, scatter_add and the index checks they run first.

use crate::buffer::CudaBuffer;
use crate::device::Args;
use crate::walk::Walk;
use crate::{CudaBackend, V};
use hal::fault::{fault_code, index_fault};
use hal::{DType, Result, validate};
use std::sync::atomic::Ordering;

pub(crate) fn gather(
    gpu: &CudaBackend,
    x: V<'_>,
    axis: usize,
    index: V<'_>,
    out: V<'_>,
) -> Result<()> {
    validate::gather(x, axis, index, out)?;
    gpu.indexed("gather", "gather_kernel", out, index, x, axis)
}

pub(crate) fn scatter_add(
    gpu: &CudaBackend,
    src: V<'_>,
    axis: usize,
    index: V<'_>,
    out: V<'_>,
) -> Result<()> {
    validate::scatter_add(src, axis, index, out)?;
    gpu.indexed("scatter_add", "scatter_add_kernel", src, index, out, axis)
}

impl CudaBackend {
    /// Gather and scatter-add, which share one shape: a walk over `walked` (gather's output,
    /// scatter's source) and `index`, into `target` (gather's source, scatter's output) along
    /// `axis` at the position the index gives. The kernel's parameters are
    /// `(walk, walked, dtype, index, dtype, target, dtype, target's axis stride, verdict)`.
    pub(crate) fn indexed(
        &self,
        op: &'static str,
        kernel: &'static str,
        walked: V<'_>,
        index: V<'_>,
        target: V<'_>,
        axis: usize,
    ) -> Result<()> {
        self.dev.bind()?;
        let verdict = self.check_indices(op, index, target.layout.shape[axis])?;
        let mut ts = target.layout.strides.clone();
        ts[axis] = 0;
        let w = Walk::new(
            op,
            &walked.layout.shape,
            &[
                (&walked.layout.strides, walked.layout.offset),
                (&index.layout.strides, index.layout.offset),
                (&ts, target.layout.offset),
            ],
        )?;
        self.dev.launch(
            kernel,
            w.n as usize,
            Args::new()
                .arg(w)
                .operand(walked.buffer)
                .operand(index.buffer)
                .operand(target.buffer)
                .arg(target.layout.strides[axis] as i64)
                .arg(verdict.ptr()),
        )
    }

    /// Runs an index check over `index` against `bound`; the returned verdict word is read by
    /// the guarded kernel.
    pub(crate) fn check_indices(
        &self,
        op: &'static str,
        index: V<'_>,
        bound: usize,
    ) -> Result<CudaBuffer> {
        let verdict = self.scratch(DType::U32, 1)?;
        let w = Walk::of(op, &index.layout.shape, &[index.layout])?;
        self.dev.launch(
            "check_index",
            w.n as usize,
            Args::new()
                .arg(w)
                .operand(index.buffer)
                .arg(bound as i64)
                .arg(fault_code(op, index_fault(index.dtype())))
                .arg(self.dev.fault.ptr)
                .arg(verdict.ptr()),
        )?;
        self.dev.fault_pending.store(true, Ordering::Release);
        Ok(verdict)
    }
}
