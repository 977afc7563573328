// The launch parameters of the GEMM kernels (gemm.wgsl, gemm_dot_body.wgsl) by name: field i
// is scalar slot i. `GemmParams` in crates/backend-wgpu/src/ops/matmul/params.rs is the same
// struct on the host; `cargo xtask wgsl` checks the two field by field, and that the
// constructor below reads each field from its own slot.
// Blocks 0, 1, 2 (not here): each batch's offset of A, B and out.
struct GemmParams {
    rows: u32,
    cols: u32,
    // The slice of k this dispatch adds (the backend slices long products).
    k_start: u32,
    k_end: u32,
    alpha: f32,
    // beta for the first slice, 1 for the later ones; 0 ignores out.
    beta: f32,
    // batch x rows x cols.
    outputs: u32,
    a_row_stride: i32,
    a_col_stride: i32,
    // As the f32 fallback of a cooperative-matrix product: where its range check's verdict is.
    verdict_word: u32,
    b_row_stride: i32,
    b_col_stride: i32,
    verdict_serial: u32,
    out_row_stride: i32,
    out_col_stride: i32,
    // A gated read: where the gate's output lies, in elements from A's.
    gate_shift: i32,
}

fn gemm_params() -> GemmParams {
    return GemmParams(s(0u), s(1u), s(2u), s(3u), sf(4u), sf(5u), s(6u), si(7u), si(8u), s(9u),
        si(10u), si(11u), s(12u), si(13u), si(14u), si(15u));
}
