// col2im, the adjoint of im2col: each image pixel sums every column entry that im2col would
// have read from it. One thread per pixel gathers them (no atomics, a fixed order).
// Blocks: 0 out (NCHW), 1 cols. Scalars: conv_params.wgsl.

// @include conv_params.wgsl

// @slot bindings
@group(0) @binding(1) var<storage, read> B1: array<u32>;
fn ld1(i: i32) -> f32 { return bitcast<f32>(B1[i]); }
@group(0) @binding(2) var<storage, read_write> B2: array<u32>;
fn st2(i: i32, v: f32) { B2[i] = bitcast<u32>(v); }
// @end

fn kernel(t: u32) {
    let p = conv_params();
    let C = p.channels; let H = p.height; let W = p.width;
    let kh = p.kernel_h; let kw = p.kernel_w; let oh = p.out_h; let ow = p.out_w;
    let x = t % W;
    let y = (t / W) % H;
    let c = (t / (W * H)) % C;
    let n = t / (W * H * C);
    // Column entries by coordinates and strides (`off` would divide per dimension per term).
    let cs0 = block_stride(1u, 0u); let cs1 = block_stride(1u, 1u); let cs2 = block_stride(1u, 2u);
    let cbase = block_offset(1u) + i32(n) * cs0;
    // Stride 1 (the common case) needs no quotient per window entry.
    let unit = p.stride_h == 1u && p.stride_w == 1u;
    var acc = 0.0;
    for (var i = 0u; i < kh; i = i + 1u) {
        let ty = i32(y + p.pad_h) - i32(i * p.dilation_h);
        if (ty < 0) { continue; }
        var oy = u32(ty);
        if (!unit) {
            if (oy % p.stride_h != 0u) { continue; }
            oy = oy / p.stride_h;
        }
        if (oy >= oh) { continue; }
        for (var j = 0u; j < kw; j = j + 1u) {
            let tx = i32(x + p.pad_w) - i32(j * p.dilation_w);
            if (tx < 0) { continue; }
            var ox = u32(tx);
            if (!unit) {
                if (ox % p.stride_w != 0u) { continue; }
                ox = ox / p.stride_w;
            }
            if (ox >= ow) { continue; }
            acc = acc + ld1(cbase + i32((c * kh + i) * kw + j) * cs1 + i32(oy * ow + ox) * cs2);
        }
    }
    st2(at4(0u, n, c, y, x), acc);
}
