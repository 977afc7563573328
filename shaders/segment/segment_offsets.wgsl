// Sorted segment sums, pass 2 of 5: one thread per segment turns its column of
// counts[chunk, segment] into exclusive offsets (where the chunk's rows of this segment start
// within the segment) and writes the segment's total. The column is read eight chunks at a
// time, so eight loads are in flight before the first offset is written.
// Scalars: 1 m, 3 chunks.

// @slot bindings
@group(0) @binding(1) var<storage, read_write> B1: array<u32>;
fn bits1(i: i32) -> u32 { return B1[i]; }
fn stbits1(i: i32, v: u32) { B1[i] = v; }
@group(0) @binding(2) var<storage, read_write> B2: array<u32>;
fn stbits2(i: i32, v: u32) { B2[i] = v; }
// @end

const OFFSETS_AT_ONCE: u32 = 8u;

fn kernel(t: u32) {
    let m = s(1u);
    let chunks = s(3u);
    var running = 0u;
    for (var c0 = 0u; c0 < chunks; c0 = c0 + OFFSETS_AT_ONCE) {
        var v: array<u32, 8>;
        for (var k = 0u; k < OFFSETS_AT_ONCE; k = k + 1u) {
            if (c0 + k < chunks) {
                v[k] = bits1(i32((c0 + k) * m + t));
            }
        }
        for (var k = 0u; k < OFFSETS_AT_ONCE; k = k + 1u) {
            if (c0 + k < chunks) {
                stbits1(i32((c0 + k) * m + t), running);
                running = running + v[k];
            }
        }
    }
    stbits2(i32(t), running);
}
