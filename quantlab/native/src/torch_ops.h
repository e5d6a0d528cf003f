/* What the C kernels' torch ops share in C++ (src/<name>_ops.cpp, built by quantlab.native.load_ops against torch's
   headers): each op's CPU kernel does what its Python function does (quantlab/quant/forms/.../kernel.py) with the
   same arguments to the same C function, from the dispatcher without entering Python. */
#ifndef QUANTLAB_TORCH_OPS_H
#define QUANTLAB_TORCH_OPS_H
#include <ATen/ATen.h>
#include <torch/library.h>

#include <optional>

namespace quantlab {

/* x as the float32, row-major [M, K] the C kernels read. */
inline at::Tensor rows_f32(const at::Tensor& x) { return x.to(at::kFloat).contiguous(); }

/* A new float32 [M, N] output. */
inline at::Tensor output_f32(int64_t m, int64_t n) { return at::empty({m, n}, at::TensorOptions().dtype(at::kFloat)); }

/* A scale array's dtype as the kernels' code (common.h: F32, F16, BF16). */
inline int scale_kind(const at::Tensor& scales) {
    switch (scales.scalar_type()) {
        case at::kHalf: return 1;
        case at::kBFloat16: return 2;
        default: return 0;
    }
}

/* The data of an optional tensor, or null. */
inline const void* data_or_null(const std::optional<at::Tensor>& t) { return t ? t->const_data_ptr() : nullptr; }

}  // namespace quantlab
#endif
