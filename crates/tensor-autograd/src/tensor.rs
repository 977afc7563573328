//! [`Tensor`]: a device buffer seen through a [`Layout`], plus what autograd needs.

use crate::autograd::Node;
use crate::error::{Result, invalid};
use hal::{Backend, BackendExt, DType, DeviceBuffer, Distribution, Layout, View};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// An n-dimensional array on a device, with optional gradient tracking.
///
/// Cloning is cheap (a reference count); clones are the same tensor, with the same gradient.
/// Results of operations on tensors that require gradients remember how they were made, so
/// [`Tensor::backward`] can run the chain rule back to the leaves.
pub struct Tensor<B: Backend> {
    pub(crate) inner: Arc<Inner<B>>,
}

pub(crate) struct Inner<B: Backend> {
    /// Identity for the autograd graph walk (buffers may be shared by several tensors).
    pub(crate) id: u64,
    pub(crate) backend: B,
    pub(crate) buffer: B::Buffer,
    pub(crate) layout: Layout,
    pub(crate) requires_grad: bool,
    /// How this tensor was computed; `None` for leaves and for results made without tracking.
    pub(crate) node: Option<Node<B>>,
    /// The accumulated gradient of a leaf that requires one.
    pub(crate) grad: Mutex<Option<Tensor<B>>>,
}

impl<B: Backend> Clone for Tensor<B> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<B: Backend> std::fmt::Debug for Tensor<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tensor(shape {:?}, {}, {}{})",
            self.shape(),
            self.dtype(),
            self.inner.backend.info().backend,
            if self.requires_grad_flag() {
                ", requires grad"
            } else {
                ""
            }
        )
    }
}

impl<B: Backend> Tensor<B> {
    // ----- construction -----

    /// A tensor with no history over `buffer` seen through `layout`.
    pub(crate) fn from_parts(backend: &B, buffer: B::Buffer, layout: Layout) -> Self {
        Self::with_node(backend, buffer, layout, false, None)
    }

    pub(crate) fn with_node(
        backend: &B,
        buffer: B::Buffer,
        layout: Layout,
        requires_grad: bool,
        node: Option<Node<B>>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
                backend: backend.clone(),
                buffer,
                layout,
                requires_grad,
                node,
                grad: Mutex::new(None),
            }),
        }
    }

    /// A new contiguous tensor of `shape` and `dtype`, zero-filled.
    pub fn zeros(backend: &B, shape: &[usize], dtype: DType) -> Result<Self> {
        let buffer = backend.alloc(dtype, hal::try_numel("Tensor::zeros", shape)?)?;
        Ok(Self::from_parts(backend, buffer, Layout::contiguous(shape)))
    }

    /// A new contiguous tensor of `shape` and `dtype` whose contents are unspecified, for the
    /// result of a call that writes every element ([`hal::Backend::alloc_for_write`]: no zero
    /// fill, one launch fewer on a GPU).
    pub(crate) fn for_write(backend: &B, shape: &[usize], dtype: DType) -> Result<Self> {
        Self::for_write_as(backend, Layout::contiguous(shape), dtype)
    }

    /// [`Tensor::for_write`] laid out as `layout`, a dense layout (it covers its buffer whole,
    /// in some order of its dimensions: see `Tensor::dense_layout`).
    pub(crate) fn for_write_as(backend: &B, layout: Layout, dtype: DType) -> Result<Self> {
        let buffer = backend.alloc_for_write(dtype, hal::try_numel("Tensor", &layout.shape)?)?;
        Ok(Self::from_parts(backend, buffer, layout))
    }

    /// A new contiguous tensor of `shape` with every element `value`.
    pub fn full(backend: &B, shape: &[usize], value: f64, dtype: DType) -> Result<Self> {
        if value == 0.0 {
            return Self::zeros(backend, shape, dtype);
        }
        // The fill writes every element: no zero fill first (on a GPU, one launch fewer; a
        // backward pass's seed is one of these).
        let t = Self::for_write(backend, shape, dtype)?;
        backend.fill(t.view(), value)?;
        Ok(t)
    }

    /// Ones of `shape` (f32).
    pub fn ones(backend: &B, shape: &[usize]) -> Result<Self> {
        Self::full(backend, shape, 1.0, DType::F32)
    }

    /// `0, 1, ..., n - 1` as f32.
    pub fn arange(backend: &B, n: usize) -> Result<Self> {
        let data: Vec<f32> = (0..n).map(|i| i as f32).collect();
        Self::from_slice(backend, &data, &[n])
    }

    /// An f32 tensor of `shape` holding `data` (row-major).
    pub fn from_slice(backend: &B, data: &[f32], shape: &[usize]) -> Result<Self> {
        Self::from_elements(backend, data, shape)
    }

    /// A tensor of `shape` holding `data` in `T`'s dtype (`f32`, `f16`, `bf16`, `u32`, `i32`).
    pub fn from_elements<T: hal::Element>(
        backend: &B,
        data: &[T],
        shape: &[usize],
    ) -> Result<Self> {
        if data.len() != hal::numel(shape) {
            return Err(invalid(
                "from_slice",
                format!(
                    "{} values cannot fill shape {:?} ({} elements)",
                    data.len(),
                    shape,
                    hal::numel(shape)
                ),
            ));
        }
        let buffer = backend.upload(data)?;
        Ok(Self::from_parts(backend, buffer, Layout::contiguous(shape)))
    }

    /// Uniform on `[0, 1)` from the counter-based stream of `seed` (the same on every backend).
    pub fn rand(backend: &B, shape: &[usize], seed: u64) -> Result<Self> {
        Self::random(
            backend,
            shape,
            Distribution::Uniform {
                low: 0.0,
                high: 1.0,
            },
            seed,
        )
    }

    /// Standard normal values from the counter-based stream of `seed`.
    pub fn randn(backend: &B, shape: &[usize], seed: u64) -> Result<Self> {
        Self::random(
            backend,
            shape,
            Distribution::Normal {
                mean: 0.0,
                std: 1.0,
            },
            seed,
        )
    }

    /// Values of `dist` from the counter-based stream of `seed` (f32).
    pub fn random(backend: &B, shape: &[usize], dist: Distribution, seed: u64) -> Result<Self> {
        let t = Self::zeros(backend, shape, DType::F32)?;
        backend.random(t.view(), dist, seed, 0)?;
        Ok(t)
    }

    // ----- accessors -----

    pub fn shape(&self) -> &[usize] {
        &self.inner.layout.shape
    }
    pub fn rank(&self) -> usize {
        self.inner.layout.rank()
    }
    pub fn numel(&self) -> usize {
        self.inner.layout.numel()
    }
    pub fn dtype(&self) -> DType {
        self.inner.buffer.dtype()
    }
    pub fn layout(&self) -> &Layout {
        &self.inner.layout
    }
    /// The device handle this tensor lives on.
    pub fn backend(&self) -> &B {
        &self.inner.backend
    }
    /// The backing buffer (shared with views of this tensor).
    pub fn buffer(&self) -> &B::Buffer {
        &self.inner.buffer
    }
    /// The tensor as a `hal` operand.
    pub fn view(&self) -> View<'_, B::Buffer> {
        View::new(&self.inner.buffer, &self.inner.layout)
    }
    pub fn is_contiguous(&self) -> bool {
        self.inner.layout.is_contiguous()
    }
    /// True when the tensor covers its whole buffer in row-major order from element 0: what
    /// the fused optimiser steps and the scalar-program kernels need.
    pub fn is_dense(&self) -> bool {
        self.is_contiguous()
            && self.inner.layout.offset == 0
            && self.inner.buffer.len() == self.numel()
    }
    /// The size of dimension `axis`, counted from the end when negative.
    pub fn dim(&self, axis: isize) -> Result<usize> {
        Ok(self.shape()[self.axis(axis)?])
    }
    /// Resolves a possibly negative axis.
    pub fn axis(&self, axis: isize) -> Result<usize> {
        let rank = self.rank() as isize;
        let a = if axis < 0 { axis + rank } else { axis };
        if a < 0 || a >= rank.max(1) {
            return Err(invalid(
                "axis",
                format!("axis {axis} is out of range for shape {:?}", self.shape()),
            ));
        }
        Ok(a as usize)
    }
    /// A process-unique identity (clones share it, views do not).
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    // ----- host transfer -----

    /// Waits for the device and returns the elements in row-major order as f32.
    pub fn to_vec(&self) -> Result<Vec<f32>> {
        let dense = self.dense()?;
        Ok(self.inner.backend.read_f32(&dense.inner.buffer)?)
    }

    /// Waits for the device and returns the elements as `f64` (exactly, from any dtype).
    pub fn to_vec_f64(&self) -> Result<Vec<f64>> {
        let dense = self.dense()?;
        Ok(self.inner.backend.read_f64(&dense.inner.buffer)?)
    }

    /// Waits for the device and returns the elements of a `u32` tensor (indices, argmax).
    pub fn to_vec_u32(&self) -> Result<Vec<u32>> {
        let dense = self.dense()?;
        if dense.dtype() != DType::U32 {
            return Err(invalid(
                "to_vec_u32",
                format!("the tensor holds {}, not u32", dense.dtype()),
            ));
        }
        Ok(self.inner.backend.read::<u32>(&dense.inner.buffer)?)
    }

    /// The value of a one-element tensor.
    pub fn item(&self) -> Result<f32> {
        if self.numel() != 1 {
            return Err(invalid(
                "item",
                format!(
                    "a tensor of shape {:?} has {} elements, not 1",
                    self.shape(),
                    self.numel()
                ),
            ));
        }
        Ok(self.to_vec()?[0])
    }

    /// This tensor if it is dense ([`Tensor::is_dense`]), else a dense copy (no history).
    pub(crate) fn dense(&self) -> Result<Self> {
        if self.is_dense() {
            return Ok(self.clone());
        }
        let out = Self::for_write(self.backend(), self.shape(), self.dtype())?;
        self.backend().copy(self.view(), out.view())?;
        Ok(out)
    }

    /// The same data on another handle of this backend type (another GPU, or a handle with
    /// another precision policy). A leaf keeps `requires_grad`; history is not carried over.
    pub fn to_device(&self, backend: &B) -> Result<Self> {
        let dense = self.dense()?;
        let bytes = self.backend().read_bytes(&dense.inner.buffer)?;
        let buffer = backend.upload_bytes(self.dtype(), &bytes)?;
        Ok(Self::with_node(
            backend,
            buffer,
            Layout::contiguous(self.shape()),
            self.inner.requires_grad && self.inner.node.is_none(),
            None,
        ))
    }

    // ----- gradient tracking -----

    /// This tensor as a leaf that requires a gradient (sharing its buffer). Gradients
    /// accumulate into [`Tensor::grad`] on [`Tensor::backward`].
    pub fn requires_grad(&self) -> Self {
        Self::with_node(
            self.backend(),
            self.inner.buffer.clone(),
            self.inner.layout.clone(),
            true,
            None,
        )
    }

    /// True when gradients flow to or through this tensor.
    pub fn requires_grad_flag(&self) -> bool {
        self.inner.requires_grad
    }

    /// The same data with no history and no gradient (shares the buffer).
    pub fn detach(&self) -> Self {
        Self::from_parts(
            self.backend(),
            self.inner.buffer.clone(),
            self.inner.layout.clone(),
        )
    }

    /// The gradient accumulated so far by backward passes (leaves only).
    pub fn grad(&self) -> Option<Self> {
        self.inner
            .grad
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Forgets the accumulated gradient.
    pub fn zero_grad(&self) {
        *self.inner.grad.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Replaces the accumulated gradient (used by gradient clipping).
    pub(crate) fn set_grad(&self, grad: Option<Self>) {
        *self.inner.grad.lock().unwrap_or_else(|p| p.into_inner()) = grad;
    }

    /// Overwrites this tensor's elements with `src`'s (same shape; dtype converted), in place,
    /// without history. Used for parameter loading and running statistics.
    pub fn assign(&self, src: &Self) -> Result<()> {
        if src.shape() != self.shape() {
            return Err(crate::error::shape_error(
                "assign",
                self.shape(),
                src.shape(),
                "the source must have the destination's shape",
            ));
        }
        Ok(self.backend().copy(src.view(), self.view())?)
    }
}
