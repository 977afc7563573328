//! # backend-cuda (not implemented yet)
//!
//! This crate will implement [`hal::Backend`] on NVIDIA GPUs through cudarc (dynamic loading,
//! so it builds without CUDA), with kernels in the repository's `cuda/` folder compiled to
//! committed PTX by `cargo xtask ptx`, GEMM through cuBLAS, and the scalar program IR compiled
//! by NVRTC. It holds no code yet: the work is tracked by the project's backend-cuda issue.

/// Why this backend cannot run yet, as reported by the parity harness.
pub const NOT_IMPLEMENTED: &str = "backend-cuda is not implemented yet (its issue is open)";
