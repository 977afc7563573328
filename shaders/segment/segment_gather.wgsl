// Sorted segment sums, pass 5 of 5: one thread per (segment, part, column), column d being
// the weight total, sums its part of the segment's rows (in ascending row order, with Kahan
// compensation, kept from the compiler by keep.wgsl: a part of one long segment can hold
// thousands of rows) into partials laid out [segment, part, d + 1]; the backend then sums the
// parts. Work is O(n d), whatever the number of segments.
// Blocks: 0 weights. Scalars: 1 d, 3 x's offset, 4-5 x's strides, 6 parts, 7 whether there
// are weights (without, B2 is bound but not read), 12 zero (keep.wgsl).

// @include keep.wgsl

// @slot bindings
@group(0) @binding(1) var<storage, read> B1: array<u32>;
fn ld1(i: i32) -> f32 { return bitcast<f32>(B1[i]); }
@group(0) @binding(2) var<storage, read> B2: array<u32>;
fn ld2(i: i32) -> f32 { return bitcast<f32>(B2[i]); }
@group(0) @binding(3) var<storage, read> B3: array<u32>;
fn bits3(i: i32) -> u32 { return B3[i]; }
@group(0) @binding(4) var<storage, read> B4: array<u32>;
fn bits4(i: i32) -> u32 { return B4[i]; }
@group(0) @binding(5) var<storage, read> B5: array<u32>;
fn bits5(i: i32) -> u32 { return B5[i]; }
@group(0) @binding(6) var<storage, read_write> B6: array<u32>;
fn st6(i: i32, v: f32) { B6[i] = bitcast<u32>(v); }
// @end

fn kernel(t: u32) {
    let d = s(1u);
    let parts = s(6u);
    let col = t % (d + 1u);
    let part = (t / (d + 1u)) % parts;
    let seg = t / ((d + 1u) * parts);
    let start = bits3(i32(seg));
    let len = bits4(i32(seg));
    let per = (len + parts - 1u) / parts;
    let lo = start + min(len, part * per);
    let hi = start + min(len, (part + 1u) * per);
    // (sum, compensation)
    var acc = vec2<f32>(0.0, 0.0);
    for (var q = lo; q < hi; q = q + 1u) {
        let row = bits5(i32(q));
        var v = 1.0;
        if (s(7u) == 1u) { v = ld2(off(0u, row)); }
        if (col != d) { v = v * ld1(si(3u) + i32(row) * si(4u) + i32(col) * si(5u)); }
        acc = kahan_add(acc, v);
    }
    st6(i32(t), acc.x);
}
