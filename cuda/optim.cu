// Fused optimiser steps over contiguous f32 buffers: one read and one write of each state per
// element, no host traffic. The formulas are hal's (SgdParams, AdamParams); the host passes the
// bias corrections, computed as the CPU reference computes them.
#include "common.cuh"

extern "C" __global__ void sgd_kernel(i64 n, float* p, const float* g, float* buf, int has_buf, float lr, float momentum,
                                      float dampening, float weight_decay, int nesterov, int first) {
    GRID_STRIDE(i, n) {
        float gi = g[i] + weight_decay * p[i];
        if (has_buf) {
            float b = first ? gi : momentum * buf[i] + (1.0f - dampening) * gi;
            buf[i] = b;
            gi = nesterov ? gi + momentum * b : b;
        }
        p[i] -= lr * gi;
    }
}

extern "C" __global__ void adam_kernel(i64 n, float* p, const float* g, float* m, float* v, float lr, float beta1,
                                       float beta2, float eps, float weight_decay, int decoupled, float bc1, float bc2) {
    GRID_STRIDE(i, n) {
        float pi = p[i], gi = g[i];
        if (decoupled) pi *= 1.0f - lr * weight_decay;
        else gi += weight_decay * pi;
        float mi = beta1 * m[i] + (1.0f - beta1) * gi;
        float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = pi - lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
    }
}
