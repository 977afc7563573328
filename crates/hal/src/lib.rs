//! # hal: the hardware abstraction layer
//!
//! The traits, types and kernel IR that every backend implements (`backend-cpu`,
//! `backend-wgpu`, `backend-cuda`) and every workload uses (`tensor-autograd`, `vlc-anneal`,
//! `residual-compile`). Workloads are written once, generic over [`Backend`], and run on
//! whichever device the user picks at run time.
//!
//! What lives here:
//! - [`Backend`]: a small closed set of primitives (elementwise over strided, broadcast views;
//!   reductions; batched matmul (with an optional bias and activation epilogue, and for the
//!   backward pass a gate on `a` and `a`'s row sums, which a backend may fuse);
//!   gather/scatter-add; im2col/col2im; nearest-centroid search and segment sums; k-means++
//!   seeding; top-k selection and the inverted-list scan of product-quantised codes; fused optimiser steps; counter-based random numbers; CSR mat-vec), each specified once in its rustdoc: semantics, NaN and tie rules, accumulation,
//!   and the tolerance a backend may differ from the CPU reference by.
//! - [`seeding`]: `kmeans_pp`'s default, built from the other primitives and IR kernels (the
//!   one primitive with a default; GPU backends fuse it).
//! - [`Backend::record`] / [`Backend::replay`]: a sequence of calls recorded once and replayed
//!   (a device graph where the backend can capture one, [`Replay`] elsewhere), and
//!   [`Precision`]: a handle's policy for matrix units in `matmul` and `nearest_centroid`.
//! - [`Layout`]: shape, strides and offset. Movement ops are metadata; only copies move data.
//! - [`ir`]: the scalar program IR, the open door for kernels that are not primitives.
//! - [`Error`]: the one error type; nothing here panics on bad input.
//! - [`DType::F64`] and [`F64Support`]: double precision as a compute type, what each device
//!   runs in it, and the rule that nothing is silently narrowed.
//! - [`attention`]: scaled dot-product attention's contract (fused, nothing `tq x tk` in
//!   memory), its parameters and its dropout rule.
//! - [`norm`]: layer normalisation's contract and operands.
//! - [`collective`]: [`Communicator`], several devices reducing and exchanging buffers
//!   (all-reduce, broadcast, all-gather, reduce-scatter): semantics, ordering, errors.
//! - [`topk`]: selection's order (IEEE totalOrder, ties to the lower index) and the
//!   inverted-list scan's distances.
//! - [`random`]: Philox 4x32-10, the random stream every backend reproduces.
//! - [`validate`]: every primitive's argument checks, called by every backend first.
//! - [`fault`]: the device fault record GPU backends report data-dependent errors through.
//! - [`profile`]: per-kernel time totals of the GPU backends' tuning profilers.
//! - [`durable`]: files written whole or not at all (temporary, `fsync`, rename), which every
//!   crate that writes a file uses.
//!
//! ```
//! use hal::{Layout, DType};
//! let x = Layout::contiguous(&[2, 3]);
//! let xt = x.transpose(0, 1).unwrap();          // a view: no data moves
//! assert_eq!(xt.shape, vec![3, 2]);
//! assert!(!xt.is_contiguous());
//! assert_eq!(DType::BF16.size_in_bytes(), 2);
//! let wide = Layout::contiguous(&[3]).broadcast_to(&[4, 3]).unwrap();
//! assert_eq!(wide.strides, vec![0, 1]);
//! ```
//!
//! The design and its invariants are in `docs/ARCHITECTURE.md` at the repository root.

pub mod attention;
mod backend;
pub mod collective;
mod device;
mod dtype;
pub mod durable;
mod epilogue;
mod error;
pub mod fault;
pub mod ir;
mod layout;
pub mod norm;
mod ops;
mod precision;
pub mod profile;
pub mod random;
pub mod reduction;
pub mod seeding;
pub mod topk;
pub mod tuning;
pub mod validate;

pub use attention::{AttentionGrads, AttentionInputs, AttentionParams};
pub use backend::{
    Backend, BackendExt, Csr, DeviceBuffer, RecordedSteps, Replay, View, nearest_per_group,
};
pub use collective::{CollectiveOp, Communicator};
pub use device::{Capabilities, DeviceInfo, DeviceKind, F64Support};
pub use dtype::{DType, Element};
pub use epilogue::{Epilogue, Gate, matmul_epilogue_steps};
pub use error::{Error, Result};
pub use layout::{
    Layout, broadcast_shapes, checked_numel, contiguous_strides, in_memory_order, numel, try_numel,
};
pub use norm::{NormGrads, NormInputs};
pub use ops::{
    AdamParams, ArgReduceOp, BinaryOp, Conv2dGeometry, Distribution, ReduceOp, SgdParams,
    TernaryOp, UnaryOp, erf_f32, erf_f32_with, erf_f64,
};
pub use precision::Precision;
pub use topk::{CandidateInputs, CandidateShape, IvfScanInputs, IvfScanShape};

/// Re-exported so users of buffers of 16-bit floats need not name the `half` crate.
pub use half::{bf16, f16};
