//! The primitives, one module per family (the names of `hal`, `shaders/` and `cuda/`):
//! each takes its operands as raw views, already validated, under the backend's lock.

pub(crate) mod attention;
pub(crate) mod cluster;
pub(crate) mod conv;
pub(crate) mod elementwise;
pub(crate) mod index;
pub(crate) mod matmul;
pub(crate) mod norm;
pub(crate) mod optim;
pub(crate) mod random;
pub(crate) mod reduce;
pub(crate) mod segment;
pub(crate) mod topk;
