// Sorted segment sums, pass 3 of 5: one workgroup writes the segments' start positions, the
// exclusive scan of their totals, 256 segments at a time (workgroup_scan.wgsl, then the running
// total carried to the next 256).
// Scalars: 1 m.

// @include workgroup_scan.wgsl

@group(0) @binding(1) var<storage, read> B1: array<u32>;
@group(0) @binding(2) var<storage, read_write> B2: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32) {
    let m = s(1u);
    var carry = 0u;
    for (var base = 0u; base < m; base = base + SCAN_WIDTH) {
        let j = base + li;
        var v = 0u;
        if (j < m) {
            v = B1[j];
        }
        let incl = inclusive_scan(li, v);
        if (j < m) {
            B2[j] = carry + incl - v;
        }
        carry = carry + scan_total();
    }
}
