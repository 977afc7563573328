// The launch parameters of the layer-norm kernels by name: field i is scalar slot i.
// `NormLaunch` in crates/backend-wgpu/src/ops/norm.rs is the same struct on the host; `cargo
// xtask wgsl` checks the two field by field, and that the constructor reads each field from
// its own slot.
struct NormLaunch {
    rows: u32,
    n: u32,
    eps: f32,
    has_w: u32,
    has_b: u32,
    want_w: u32,
    want_b: u32,
    chunks: u32,
    per: u32,
}

fn norm_params() -> NormLaunch {
    return NormLaunch(s(0u), s(1u), sf(2u), s(3u), s(4u), s(5u), s(6u), s(7u), s(8u));
}

// Element (i, j) of rank-2 layout block k, and element i of rank-1 block k.
fn at2(k: u32, i: u32, j: u32) -> i32 {
    return block_offset(k) + i32(i) * block_stride(k, 0u) + i32(j) * block_stride(k, 1u);
}
fn at1(k: u32, i: u32) -> i32 {
    return block_offset(k) + i32(i) * block_stride(k, 0u);
}
