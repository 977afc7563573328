// The launch parameters of the attention kernels by name: field i is scalar slot i.
// `AttentionLaunch` in crates/backend-wgpu/src/ops/attention.rs is the same struct on the
// host; `cargo xtask wgsl` checks the two field by field, and that the constructor reads each
// field from its own slot.
struct AttentionLaunch {
    heads: u32,
    tq: u32,
    tk: u32,
    d: u32,
    dv: u32,
    causal: u32,
    has_mask: u32,
    dropout_on: u32,
    scale: f32,
    keep_scale: f32,
    seed_lo: u32,
    seed_hi: u32,
    threshold: u32,
    offset_lo: u32,
    offset_hi: u32,
}

fn attention_params() -> AttentionLaunch {
    return AttentionLaunch(s(0u), s(1u), s(2u), s(3u), s(4u), s(5u), s(6u), s(7u), sf(8u), sf(9u),
        s(10u), s(11u), s(12u), s(13u), s(14u));
}

fn neg_inf() -> f32 { return f32_bits(0xff800000u); }
fn is_neg_inf(v: f32) -> bool { return bitcast<u32>(v) == 0xff800000u; }
