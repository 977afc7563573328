//! The primitives, one module per family (the names of `cuda/` and `hal`).

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
