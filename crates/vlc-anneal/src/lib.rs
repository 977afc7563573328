//! # vlc-anneal (not implemented yet)
//!
//! This crate will compress embedding vectors by annealed, robust k-means (anchors,
//! bit-packed assignments and product-quantised residual codes) and search the compressed
//! index, on any [`hal::Backend`]. It holds no code yet; the work is tracked by the project's
//! vlc-anneal issue.
