// One Adam / AdamW step per element. Bindings: 1 param, 2 grad, 3 first moment, 4 second
// moment. Scalars: AdamStepParams, mirrored by the struct of that name in
// crates/backend-wgpu/src/ops/optim.rs (`cargo xtask wgsl` checks the two).

struct AdamStepParams {
    lr: f32,
    beta1: f32,
    beta2: f32,
    eps: f32,
    weight_decay: f32,
    // AdamW: the decay applies to the parameter, not the gradient.
    decoupled: u32,
    // The bias corrections 1 - beta^t.
    correction1: f32,
    correction2: f32,
}

fn adam_params() -> AdamStepParams {
    return AdamStepParams(sf(0u), sf(1u), sf(2u), sf(3u), sf(4u), s(5u), sf(6u), sf(7u));
}

@group(0) @binding(1) var<storage, read_write> B1: array<f32>;
@group(0) @binding(2) var<storage, read> B2: array<f32>;
@group(0) @binding(3) var<storage, read_write> B3: array<f32>;
@group(0) @binding(4) var<storage, read_write> B4: array<f32>;

fn kernel(t: u32) {
    let h = adam_params();
    var p = B1[t];
    var g = B2[t];
    if (h.decoupled == 1u) { p = p * (1.0 - h.lr * h.weight_decay); } else { g = g + h.weight_decay * p; }
    let m = h.beta1 * B3[t] + (1.0 - h.beta1) * g;
    let v = h.beta2 * B4[t] + (1.0 - h.beta2) * g * g;
    B3[t] = m;
    B4[t] = v;
    B1[t] = p - h.lr * (m / h.correction1) / (sqrt(v / h.correction2) + h.eps);
}
