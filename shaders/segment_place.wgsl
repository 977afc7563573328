// Sorted segment sums, pass 4 of 5: one thread per chunk walks its rows in order and writes
// each row's index to its place in `order` (segment start + the chunk's offset within the
// segment + the rows of this segment the chunk placed so far): a stable counting sort, so
// each segment's rows stay in ascending order and the sums are the same on every run.
// Blocks: 0 segment ids. Scalars: 0 n, 1 m, 2 chunk length.

// @slot bindings
@group(0) @binding(1) var<storage, read> B1: array<u32>;
fn bits1(i: i32) -> u32 { return B1[i]; }
@group(0) @binding(2) var<storage, read> B2: array<u32>;
fn bits2(i: i32) -> u32 { return B2[i]; }
@group(0) @binding(3) var<storage, read_write> B3: array<u32>;
fn bits3(i: i32) -> u32 { return B3[i]; }
fn stbits3(i: i32, v: u32) { B3[i] = v; }
@group(0) @binding(4) var<storage, read_write> B4: array<u32>;
fn stbits4(i: i32, v: u32) { B4[i] = v; }
// @end

// @slot guard
fn skipped() -> bool { return false; }
// @end

fn kernel(t: u32) {
    if (skipped()) { return; }
    let end = min(s(0u), (t + 1u) * s(2u));
    for (var i = t * s(2u); i < end; i = i + 1u) {
        let seg = bits1(off(0u, i));
        let at = i32(t * s(1u) + seg);
        let within = bits3(at);
        stbits3(at, within + 1u);
        stbits4(i32(bits2(i32(seg)) + within), i);
    }
}
