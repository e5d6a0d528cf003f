/* The int8_act library's decode-step product as a torch op's CPU kernel (quantlab/native/src/torch_ops.h):
   quantlab::int8_act_matmul (quant/forms/affine/int8_act.py). */
#include "torch_ops.h"

extern "C" void int8_act_matmul(const uint8_t* w, const void* scales, int scale_kind, const uint8_t* zeros,
                                int zero_row_bytes, const float* x, float static_scale, float divisor, float* y, int M,
                                int N, int K, int bits, int group);

namespace {

at::Tensor matmul(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                  const std::optional<at::Tensor>& zeros, const std::optional<at::Tensor>& static_scale,
                  double divisor, int64_t bits, int64_t group) {
    at::Tensor xf = quantlab::rows_f32(x), y = quantlab::output_f32(xf.size(0), codes.size(0));
    float stat = static_scale ? static_scale->item<float>() : 0.0f;
    int zero_row_bytes = zeros ? static_cast<int>(zeros->size(1)) : 0;
    int8_act_matmul(codes.const_data_ptr<uint8_t>(), scales.const_data_ptr(), quantlab::scale_kind(scales),
                    static_cast<const uint8_t*>(quantlab::data_or_null(zeros)), zero_row_bytes,
                    xf.const_data_ptr<float>(), stat, static_cast<float>(divisor), y.mutable_data_ptr<float>(),
                    xf.size(0), codes.size(0), xf.size(1), bits, group);
    return y;
}

}  // namespace

TORCH_LIBRARY_IMPL(quantlab, CPU, m) { m.impl("int8_act_matmul", &matmul); }
