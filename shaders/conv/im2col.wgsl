// im2col: out[n, c*kh*kw + i*kw + j, oy*ow + ox] = x[n, c, oy*sy + i*dy - py, ox*sx + j*dx - px]
// (0 outside the image). One thread per (image, channel, output position), writing that
// position's kh*kw entries: the quotients are found once per position rather than once per
// entry (a thread per entry spent 78 us a call on a small CNN's second convolution on an H200).
// Blocks: 0 out, 1 x (both indexed by coordinates and strides).
// Scalars: conv_params.wgsl.

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
    let pos = t % (oh * ow);
    let nc = t / (oh * ow);
    let c = nc % C;
    let n = nc / C;
    let y0 = i32((pos / ow) * p.stride_h) - i32(p.pad_h);
    let x0 = i32((pos % ow) * p.stride_w) - i32(p.pad_w);
    var row = c * kh * kw;
    for (var i = 0u; i < kh; i = i + 1u) {
        let iy = y0 + i32(i * p.dilation_h);
        for (var j = 0u; j < kw; j = j + 1u) {
            let ix = x0 + i32(j * p.dilation_w);
            var v = 0.0;
            if (iy >= 0 && ix >= 0 && u32(iy) < H && u32(ix) < W) {
                // By coordinates and strides: `off` would divide once more per dimension.
                v = ld1(at4(1u, n, c, u32(iy), u32(ix)));
            }
            st2(at3(0u, n, row, pos), v);
            row = row + 1u;
        }
    }
}
