// One SGD step per element (PyTorch's update rule). Bindings: 1 param, 2 grad, 3 momentum
// buffer (a 1-element dummy without momentum). Scalars: SgdStepParams, mirrored by the struct
// of that name in crates/backend-wgpu/src/ops/optim.rs (`cargo xtask wgsl` checks the two).

struct SgdStepParams {
    lr: f32,
    momentum: f32,
    dampening: f32,
    weight_decay: f32,
    nesterov: u32,
    // The first step: the momentum buffer starts as the gradient.
    first: u32,
    use_momentum: u32,
}

fn sgd_params() -> SgdStepParams {
    return SgdStepParams(sf(0u), sf(1u), sf(2u), sf(3u), s(4u), s(5u), s(6u));
}

@group(0) @binding(1) var<storage, read_write> B1: array<f32>;
@group(0) @binding(2) var<storage, read> B2: array<f32>;
@group(0) @binding(3) var<storage, read_write> B3: array<f32>;

fn kernel(t: u32) {
    let h = sgd_params();
    let p = B1[t];
    var g = B2[t] + h.weight_decay * p;
    if (h.use_momentum == 1u) {
        var b = g;
        if (h.first == 0u) { b = h.momentum * B3[t] + (1.0 - h.dampening) * g; }
        B3[t] = b;
        g = select(b, g + h.momentum * b, h.nesterov == 1u);
    }
    B1[t] = p - h.lr * g;
}
