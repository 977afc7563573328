// One SGD step per element (PyTorch's update rule). Bindings: 1 param, 2 grad, 3 momentum
// buffer (a 1-element dummy without momentum). Scalars: 0 lr, 1 momentum, 2 dampening,
// 3 weight decay, 4 nesterov, 5 first step (the buffer starts as the gradient), 6 momentum on.

@group(0) @binding(1) var<storage, read_write> B1: array<f32>;
@group(0) @binding(2) var<storage, read> B2: array<f32>;
@group(0) @binding(3) var<storage, read_write> B3: array<f32>;

fn kernel(t: u32) {
    let p = B1[t];
    var g = B2[t] + sf(3u) * p;
    if (s(6u) == 1u) {
        var b = g;
        if (s(5u) == 0u) { b = sf(1u) * B3[t] + (1.0 - sf(2u)) * g; }
        B3[t] = b;
        g = select(b, g + sf(1u) * b, s(4u) == 1u);
    }
    B1[t] = p - sf(0u) * g;
}
