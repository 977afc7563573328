//! Layer normalisation's operands ([`crate::Backend::layer_norm`],
//! [`crate::Backend::layer_norm_backward`]).
//!
//! Over each row `r` of `x: [rows, n]`: `mean_r = sum_c x_rc / n`,
//! `rstd_r = 1 / sqrt(sum_c (x_rc - mean_r)^2 / n + eps)` (the biased variance, as PyTorch),
//! `xhat_rc = (x_rc - mean_r) rstd_r`, `out_rc = xhat_rc w_c + b_c` (`w = 1`, `b = 0` where
//! absent). Backward, with `g = dout` and `gw_rc = g_rc w_c`:
//! `dx_rc = rstd_r (gw_rc - mean_c(gw_r) - xhat_rc mean_c(gw_r xhat_r))`,
//! `dw_c = sum_r g_rc xhat_rc`, `db_c = sum_r g_rc` (rows summed in order: deterministic).

use crate::View;

/// `x: [rows, n]` and the optional affine parameters `weight`, `bias: [n]` (any strides).
#[derive(Debug)]
pub struct NormInputs<'a, Buf> {
    pub x: View<'a, Buf>,
    pub weight: Option<View<'a, Buf>>,
    pub bias: Option<View<'a, Buf>>,
}

impl<Buf> Clone for NormInputs<'_, Buf> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<Buf> Copy for NormInputs<'_, Buf> {}

/// The backward pass's outputs, overwritten: `dx` shaped as `x`; `dweight`, `dbias: [n]` where
/// wanted.
#[derive(Debug)]
pub struct NormGrads<'a, Buf> {
    pub dx: View<'a, Buf>,
    pub dweight: Option<View<'a, Buf>>,
    pub dbias: Option<View<'a, Buf>>,
}

impl<Buf> Clone for NormGrads<'_, Buf> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<Buf> Copy for NormGrads<'_, Buf> {}
