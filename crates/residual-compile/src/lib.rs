//! # residual-compile (not implemented yet)
//!
//! This crate will trace scalar residual functions, group them by graph topology, compile each
//! group once (values and Jacobians) to the `hal` scalar program IR, and solve nonlinear least
//! squares with Levenberg-Marquardt. It holds no code yet; the work is tracked by the project's
//! residual-compile issue.
