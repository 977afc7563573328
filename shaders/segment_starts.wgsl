// Sorted segment sums, pass 3 of 5: one thread writes the segments' start positions (an
// exclusive scan of the totals) for segments [scalar 4, scalar 5), continuing from the
// previous range (several dispatches keep each loop under lavapipe's cap).
// Scalars: 4 first segment, 5 end segment.

// @slot bindings
@group(0) @binding(1) var<storage, read> B1: array<u32>;
fn bits1(i: i32) -> u32 { return B1[i]; }
@group(0) @binding(2) var<storage, read_write> B2: array<u32>;
fn bits2(i: i32) -> u32 { return B2[i]; }
fn stbits2(i: i32, v: u32) { B2[i] = v; }
// @end

fn kernel(t: u32) {
    var carry = 0u;
    let first = s(4u);
    if (first > 0u) {
        carry = bits2(i32(first - 1u)) + bits1(i32(first - 1u));
    }
    for (var j = first; j < s(5u); j = j + 1u) {
        stbits2(i32(j), carry);
        carry = carry + bits1(i32(j));
    }
}
