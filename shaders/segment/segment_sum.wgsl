// segment sums, first pass: one thread per (row chunk, segment, column) plus one per
// (row chunk, segment) for the count (column d), summing its chunk's rows in order with Kahan
// compensation into partials laid out [chunk, segment, d + 1]; the backend then reduces the
// chunks. Deterministic, no atomics.
// Blocks: 0 segment ids, 1 weights. Scalars: 0 n, 1 d, 2 m, 3 x's offset, 4-5 x's strides,
// 6 chunk length, 7 whether there are weights (without, B3 is bound but not read).

// @slot bindings
@group(0) @binding(1) var<storage, read> B1: array<u32>;
fn ld1(i: i32) -> f32 { return bitcast<f32>(B1[i]); }
@group(0) @binding(2) var<storage, read> B2: array<u32>;
fn bits2(i: i32) -> u32 { return B2[i]; }
@group(0) @binding(3) var<storage, read> B3: array<u32>;
fn ld3(i: i32) -> f32 { return bitcast<f32>(B3[i]); }
@group(0) @binding(4) var<storage, read_write> B4: array<u32>;
fn st4(i: i32, v: f32) { B4[i] = bitcast<u32>(v); }
// @end

fn kernel(t: u32) {
    let d = s(1u);
    let m = s(2u);
    let chunk = t / (m * (d + 1u));
    let r = t % (m * (d + 1u));
    let seg = r / (d + 1u);
    let col = r % (d + 1u);
    let counting = col == d;
    var sum = 0.0;
    var comp = 0.0;
    let end = min(s(0u), (chunk + 1u) * s(6u));
    for (var i = chunk * s(6u); i < end; i = i + 1u) {
        if (bits2(off(0u, i)) != seg) { continue; }
        var v = 1.0;
        if (s(7u) == 1u) { v = ld3(off(1u, i)); }
        if (!counting) { v = v * ld1(si(3u) + i32(i) * si(4u) + i32(col) * si(5u)); }
        let y = v - comp;
        let tt = sum + y;
        comp = (tt - sum) - y;
        sum = tt;
    }
    st4(i32(t), sum);
}
