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

// The same steps on f64 buffers, the hyperparameters widened (as backend-cpu's sgd_f64 and
// adam_f64): the host passes them, and the bias corrections, as doubles.
extern "C" __global__ void sgd_wide_kernel(i64 n, double* p, const double* g, double* buf, int has_buf, double lr,
                                           double momentum, double dampening, double weight_decay, int nesterov,
                                           int first) {
    GRID_STRIDE(i, n) {
        double gi = g[i] + weight_decay * p[i];
        if (has_buf) {
            double b = first ? gi : momentum * buf[i] + (1.0 - dampening) * gi;
            buf[i] = b;
            gi = nesterov ? gi + momentum * b : b;
        }
        p[i] -= lr * gi;
    }
}

extern "C" __global__ void adam_wide_kernel(i64 n, double* p, const double* g, double* m, double* v, double lr,
                                            double beta1, double beta2, double eps, double weight_decay,
                                            int decoupled, double bc1, double bc2) {
    GRID_STRIDE(i, n) {
        double pi = p[i], gi = g[i];
        if (decoupled) pi *= 1.0 - lr * weight_decay;
        else gi += weight_decay * pi;
        double mi = beta1 * m[i] + (1.0 - beta1) * gi;
        double vi = beta2 * v[i] + (1.0 - beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = pi - lr * (mi / bc1) / (sqrt(vi / bc2) + eps);
    }
}
