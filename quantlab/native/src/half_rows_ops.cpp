/* The half_rows library's product as a torch op's CPU kernel (quantlab/native/src/torch_ops.h):
   quantlab::half_rows_matmul (quant/kernels/half_rows.py). */
#include "torch_ops.h"

extern "C" void half_rows_matmul(const uint16_t* w, const uint16_t* x, float* y, int kind, int M, int N, int K);

namespace {

at::Tensor half_rows(const at::Tensor& x, const at::Tensor& weight) {
    at::Tensor xc = x.to(weight.scalar_type()).contiguous(), y = quantlab::output_f32(xc.size(0), weight.size(0));
    half_rows_matmul(static_cast<const uint16_t*>(weight.const_data_ptr()),
                     static_cast<const uint16_t*>(xc.const_data_ptr()), y.mutable_data_ptr<float>(),
                     quantlab::scale_kind(weight), xc.size(0), weight.size(0), xc.size(1));
    return y;
}

}  // namespace

TORCH_LIBRARY_IMPL(quantlab, CPU, m) { m.impl("half_rows_matmul", &half_rows); }
