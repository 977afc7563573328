// Sorted segment sums, pass 2 of 5: one thread per segment turns its column of
// counts[chunk, segment] into exclusive offsets (where the chunk's rows of this segment start
// within the segment) and writes the segment's total.
// Scalars: 1 m, 3 chunks.

// @slot bindings
@group(0) @binding(1) var<storage, read_write> B1: array<u32>;
fn bits1(i: i32) -> u32 { return B1[i]; }
fn stbits1(i: i32, v: u32) { B1[i] = v; }
@group(0) @binding(2) var<storage, read_write> B2: array<u32>;
fn stbits2(i: i32, v: u32) { B2[i] = v; }
// @end

fn kernel(t: u32) {
    var running = 0u;
    for (var c = 0u; c < s(3u); c = c + 1u) {
        let at = i32(c * s(1u) + t);
        let v = bits1(at);
        stbits1(at, running);
        running = running + v;
    }
    stbits2(i32(t), running);
}
