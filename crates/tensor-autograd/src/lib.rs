//! # tensor-autograd (not implemented yet)
//!
//! This crate will be a PyTorch-like tensor library over any [`hal::Backend`]: strided tensors,
//! define-by-run autograd, nn layers, optimisers and data loading. It holds no code yet; the
//! work is tracked by the project's tensor-autograd issue.
