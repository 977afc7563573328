// Sorted segment sums, pass 1 of 5 (large segment counts): one thread per row adds one to
// counts[chunk, segment] (zeroed before) of its chunk of rows. The counts are the same
// whatever order the atomic adds land in.
// Blocks: 0 segment ids. Scalars: 0 n, 1 m, 2 chunk length.

@group(0) @binding(1) var<storage, read> B1: array<u32>;
@group(0) @binding(2) var<storage, read_write> B2: array<atomic<u32>>;

// @slot guard
fn skipped() -> bool { return false; }
// @end

fn kernel(t: u32) {
    if (skipped()) { return; }
    let seg = B1[off(0u, t)];
    atomicAdd(&B2[(t / s(2u)) * s(1u) + seg], 1u);
}
