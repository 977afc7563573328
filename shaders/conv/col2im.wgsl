// col2im, the adjoint of im2col: each image pixel sums every column entry that im2col would
// have read from it. One thread per pixel gathers them (no atomics, a fixed order).
// Blocks: 0 out (NCHW), 1 cols. Scalars as im2col.

// @slot bindings
@group(0) @binding(1) var<storage, read> B1: array<u32>;
fn ld1(i: i32) -> f32 { return bitcast<f32>(B1[i]); }
@group(0) @binding(2) var<storage, read_write> B2: array<u32>;
fn st2(i: i32, v: f32) { B2[i] = bitcast<u32>(v); }
// @end

fn kernel(t: u32) {
    let C = s(1u); let H = s(2u); let W = s(3u);
    let kh = s(4u); let kw = s(5u); let oh = s(12u); let ow = s(13u);
    let x = t % W;
    let y = (t / W) % H;
    let c = (t / (W * H)) % C;
    let n = t / (W * H * C);
    // Column entries by coordinates and strides (`off` would divide per dimension per term).
    let cs0 = block_stride(1u, 0u); let cs1 = block_stride(1u, 1u); let cs2 = block_stride(1u, 2u);
    let cbase = block_offset(1u) + i32(n) * cs0;
    // Stride 1 (the common case) needs no quotient per window entry.
    let unit = s(6u) == 1u && s(7u) == 1u;
    var acc = 0.0;
    for (var i = 0u; i < kh; i = i + 1u) {
        let ty = i32(y + s(8u)) - i32(i * s(10u));
        if (ty < 0) { continue; }
        var oy = u32(ty);
        if (!unit) {
            if (oy % s(6u) != 0u) { continue; }
            oy = oy / s(6u);
        }
        if (oy >= oh) { continue; }
        for (var j = 0u; j < kw; j = j + 1u) {
            let tx = i32(x + s(9u)) - i32(j * s(11u));
            if (tx < 0) { continue; }
            var ox = u32(tx);
            if (!unit) {
                if (ox % s(7u) != 0u) { continue; }
                ox = ox / s(7u);
            }
            if (ox >= ow) { continue; }
            acc = acc + ld1(cbase + i32((c * kh + i) * kw + j) * cs1 + i32(oy * ow + ox) * cs2);
        }
    }
    st2(at4(0u, n, c, y, x), acc);
}
