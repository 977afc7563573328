// Sorted segment sums, pass 1 of 5 (large segment counts): one thread per chunk of rows
// counts its rows per segment into its own row of counts[chunk, segment] (zeroed before).
// Blocks: 0 segment ids. Scalars: 0 n, 1 m, 2 chunk length.

// @slot bindings
@group(0) @binding(1) var<storage, read> B1: array<u32>;
fn bits1(i: i32) -> u32 { return B1[i]; }
@group(0) @binding(2) var<storage, read_write> B2: array<u32>;
fn bits2(i: i32) -> u32 { return B2[i]; }
fn stbits2(i: i32, v: u32) { B2[i] = v; }
// @end

// @slot guard
fn skipped() -> bool { return false; }
// @end

fn kernel(t: u32) {
    if (skipped()) { return; }
    let end = min(s(0u), (t + 1u) * s(2u));
    for (var i = t * s(2u); i < end; i = i + 1u) {
        let at = i32(t * s(1u) + bits1(off(0u, i)));
        stbits2(at, bits2(at) + 1u);
    }
}
