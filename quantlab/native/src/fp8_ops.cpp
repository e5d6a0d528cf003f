/* The fp8 library's decode-step products as torch ops' CPU kernels (quantlab/native/src/torch_ops.h):
   quantlab::fp8_matmul and quantlab::fp8_blocks_matmul (quant/forms/float8/kernel.py). */
#include "torch_ops.h"

extern "C" {
void fp8_matmul(const uint8_t* w, const float* scales, int per_tensor, int kind, const float* x, float* y, int M, int N,
                int K);
void fp8_blocks_matmul(const uint8_t* w, const void* scales, int scale_kind, int b, int rows_per_scale, const float* x,
                       float* y, int M, int N, int K);
}

namespace {

at::Tensor per_channel(const at::Tensor& x, const at::Tensor& data, const at::Tensor& scales) {
    at::Tensor xf = quantlab::rows_f32(x), y = quantlab::output_f32(xf.size(0), data.size(0));
    int kind = data.scalar_type() == at::kFloat8_e5m2 ? 1 : 0;  /* kernel.KINDS */
    fp8_matmul(static_cast<const uint8_t*>(data.const_data_ptr()), scales.const_data_ptr<float>(), scales.size(0) == 1,
               kind, xf.const_data_ptr<float>(), y.mutable_data_ptr<float>(), xf.size(0), data.size(0), xf.size(1));
    return y;
}

at::Tensor blocks(const at::Tensor& x, const at::Tensor& data, const at::Tensor& scales, int64_t block,
                  int64_t rows_per_scale) {
    at::Tensor xf = quantlab::rows_f32(x), y = quantlab::output_f32(xf.size(0), data.size(0));
    int scale_kind = scales.scalar_type() == at::kByte ? 1 : 0;  /* kernel.BLOCK_SCALE_KINDS */
    fp8_blocks_matmul(static_cast<const uint8_t*>(data.const_data_ptr()), scales.const_data_ptr(), scale_kind, block,
                      rows_per_scale, xf.const_data_ptr<float>(), y.mutable_data_ptr<float>(), xf.size(0),
                      data.size(0), xf.size(1));
    return y;
}

}  // namespace

TORCH_LIBRARY_IMPL(quantlab, CPU, m) {
    m.impl("fp8_matmul", &per_channel);
    m.impl("fp8_blocks_matmul", &blocks);
}
