// Attention backward, pass 1 of 3: delta = dout . out for each query row, into a contiguous
// f32 scratch [b * h * tq] that both gradient passes read. One thread per row.
// Blocks: 0 out, 1 dout. Scalars: attention_params.wgsl.

// @include attention_params.wgsl

@group(0) @binding(1) var<storage, read> B1: array<u32>;
@group(0) @binding(2) var<storage, read> B2: array<u32>;
@group(0) @binding(3) var<storage, read_write> B3: array<u32>;

fn kernel(t: u32) {
    let a = attention_params();
    let i = t % a.tq;
    let bh = t / a.tq;
    let b = bh / a.heads;
    let h = bh % a.heads;
    var sum = 0.0;
    for (var c = 0u; c < a.dv; c = c + 1u) {
        sum = fma(bitcast<f32>(B2[at4(1u, b, h, i, c)]), bitcast<f32>(B1[at4(0u, b, h, i, c)]), sum);
    }
    B3[t] = bitcast<u32>(sum);
}
