// The launch parameters of im2col.wgsl and col2im.wgsl by name: field i is scalar slot i.
// `ConvParams` in crates/backend-wgpu/src/ops/conv.rs is the same struct on the host; `cargo
// xtask wgsl` checks the two field by field, and that the constructor reads each field from
// its own slot.
struct ConvParams {
    batch: u32,
    channels: u32,
    height: u32,
    width: u32,
    kernel_h: u32,
    kernel_w: u32,
    stride_h: u32,
    stride_w: u32,
    pad_h: u32,
    pad_w: u32,
    dilation_h: u32,
    dilation_w: u32,
    out_h: u32,
    out_w: u32,
}

fn conv_params() -> ConvParams {
    return ConvParams(s(0u), s(1u), s(2u), s(3u), s(4u), s(5u), s(6u), s(7u), s(8u), s(9u), s(10u),
        s(11u), s(12u), s(13u));
}
