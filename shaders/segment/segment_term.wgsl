// One row's term of a segment sum in the reproducible form, shared by segment_scan.wgsl and
// segment_sum_ordered.wgsl so that both add exactly the same thing: column `col` of row `row`
// times its weight, added to `acc` with one correctly rounded fused multiply-add
// (fma_exact.wgsl); column d, the count, adds the weight alone. The including file binds x as
// B1 and the weights as B3 (block 1), with x's offset and strides in scalars 3-5 and whether
// there are weights in scalar 7.
fn add_row_term(acc: f32, row: u32, col: u32, d: u32) -> f32 {
    var w = 1.0;
    if (s(7u) == 1u) { w = ld3(off(1u, row)); }
    if (col == d) { return acc + w; }
    return fma_exact(w, ld1(si(3u) + i32(row) * si(4u) + i32(col) * si(5u)), acc);
}
