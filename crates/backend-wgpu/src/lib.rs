//! # backend-wgpu (not implemented yet)
//!
//! This crate will implement [`hal::Backend`] on wgpu, with every primitive written in WGSL
//! under the repository's `shaders/` folder and the scalar program IR lowered to WGSL. It holds
//! no code yet: the work is tracked by the project's backend-wgpu issue. Until then the parity
//! harness and `xtask` report this backend as "not present".

/// Why this backend cannot run yet, as reported by the parity harness.
pub const NOT_IMPLEMENTED: &str = "backend-wgpu is not implemented yet (its issue is open)";
