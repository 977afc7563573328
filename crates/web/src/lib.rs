//! # web: the icosphere solve live in a browser, on WebGPU
//!
//! residual-compile's icosphere problem (the native `examples/icosphere.rs`: the same mesh,
//! noise, residuals, options and solver) solved in a web page: `backend-wgpu` on the
//! browser's WebGPU, the solver loop as a future (`residual_compile::solve_async`) whose
//! reads await the page's event loop, and the mesh redrawn with WebGPU after every
//! iteration. Without WebGPU the page solves on `backend-cpu`, single-threaded.
//!
//! Built for `wasm32-unknown-unknown` only (natively the crate is empty). `cargo xtask web`
//! builds it, runs `wasm-bindgen`, and serves `www/` on localhost; `cargo xtask web --check`
//! runs the page in headless Chromium and checks its picture and final cost. The browser
//! tests in `tests/` (`wasm-bindgen-test`) check hal's primitives on WebGPU against the CPU
//! backend in the same page.
#![cfg(target_arch = "wasm32")]

mod page;
mod render;

pub use page::{LEVELS, icosphere_problem, options, start};
