// What every attention kernel that recomputes weights shares: the dropout decision, the
// score of (i, j) and the weight from the row's log-sum-exp. Needs attention_params.wgsl and
// the mask at binding 4 (block 3).

// The dropout factor of weight (bh, i, j): keep_scale where hal::attention::keeps, else 0.
fn drop_factor(a: AttentionLaunch, bh: u32, i: u32, j: u32) -> f32 {
    if (a.dropout_on == 0u) { return 1.0; }
    // position = offset + (bh * tq + i) * tk + j, in 64 bits.
    let row = mulhilo(bh * a.tq + i, a.tk);
    let lo0 = row.y + j;
    let hi0 = row.x + select(0u, 1u, lo0 < j);
    let lo = lo0 + a.offset_lo;
    let hi = hi0 + a.offset_hi + select(0u, 1u, lo < lo0);
    let w = philox(vec4<u32>(lo, hi, 0u, 0u), vec2<u32>(a.seed_lo, a.seed_hi));
    return select(0.0, a.keep_scale, (w.x >> 8u) >= a.threshold);
}

// Score (i, j) from a raw dot product: scaled, masked (block 3, binding 4), causal.
fn attention_score(a: AttentionLaunch, b: u32, h: u32, i: u32, j: u32, dot: f32) -> f32 {
    if (a.causal == 1u && j > i) { return neg_inf(); }
    var s = a.scale * dot;
    if (a.has_mask == 1u) { s = s + bitcast<f32>(B4[at4(3u, b, h, i, j)]); }
    return s;
}

// The weight (i, j) recomputed from the row's log-sum-exp: 0 where masked or lse = -inf.
fn recompute(s: f32, l: f32) -> f32 {
    if (is_neg_inf(s) || is_neg_inf(l)) { return 0.0; }
    return exp(s - l);
}
