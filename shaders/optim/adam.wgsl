// One Adam / AdamW step per element. Bindings: 1 param, 2 grad, 3 first moment, 4 second
// moment. Scalars: 0 lr, 1 beta1, 2 beta2, 3 eps, 4 weight decay, 5 decoupled (AdamW),
// 6 and 7 the bias corrections 1 - beta^t.

@group(0) @binding(1) var<storage, read_write> B1: array<f32>;
@group(0) @binding(2) var<storage, read> B2: array<f32>;
@group(0) @binding(3) var<storage, read_write> B3: array<f32>;
@group(0) @binding(4) var<storage, read_write> B4: array<f32>;

fn kernel(t: u32) {
    var p = B1[t];
    var g = B2[t];
    if (s(5u) == 1u) { p = p * (1.0 - sf(0u) * sf(4u)); } else { g = g + sf(4u) * p; }
    let m = sf(1u) * B3[t] + (1.0 - sf(1u)) * g;
    let v = sf(2u) * B4[t] + (1.0 - sf(2u)) * g * g;
    B3[t] = m;
    B4[t] = v;
    B1[t] = p - sf(0u) * (m / sf(6u)) / (sqrt(v / sf(7u)) + sf(3u));
}
