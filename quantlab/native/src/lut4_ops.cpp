/* The lut4 library's decode-step products as torch ops' CPU kernels (quantlab/native/src/torch_ops.h):
   quantlab::lut4_matmul (quant/forms/codebook/kernel.py) and quantlab::e2m1_matmul (quant/forms/microscaling). */
#include "torch_ops.h"

extern "C" void lut4_matmul(const uint8_t* w, const void* absmax, int kind, const float* scale2, const float* offset,
                            const float* dmap, const float* lut, const float* x, float* y, int M, int N, int K, int block);
extern "C" int lut4_matmul_bf16(const uint8_t* w, const void* absmax, int kind, const float* scale2,
                                const float* offset, const float* dmap, const float* lut, const uint16_t* x, float* y,
                                int M, int N, int K, int block);

namespace {

enum { ABSMAX_F32 = 0, ABSMAX_DQ = 1, SCALE_E8M0 = 2, SCALE_E4M3 = 3 };  /* the scale kinds of lut4.c */

/* lut4_matmul of x as given: bfloat16 (a bf16 model's activations, as they are) or widened to float32. */
at::Tensor product(const at::Tensor& x, const at::Tensor& packed, const void* scales, int kind, const float* scale2,
                   const float* offset, const at::Tensor& dmap, const at::Tensor& table, int64_t block) {
    if (x.scalar_type() == at::kBFloat16) {
        at::Tensor xb = x.contiguous(), y = quantlab::output_f32(xb.size(0), packed.size(0));
        int failed = lut4_matmul_bf16(packed.const_data_ptr<uint8_t>(), scales, kind, scale2, offset,
                                      dmap.const_data_ptr<float>(), table.const_data_ptr<float>(),
                                      static_cast<const uint16_t*>(xb.const_data_ptr()), y.mutable_data_ptr<float>(),
                                      xb.size(0), packed.size(0), xb.size(1), block);
        TORCH_CHECK(!failed, "lut4_matmul: out of memory");
        return y;
    }
    at::Tensor xf = quantlab::rows_f32(x), y = quantlab::output_f32(xf.size(0), packed.size(0));
    lut4_matmul(packed.const_data_ptr<uint8_t>(), scales, kind, scale2, offset, dmap.const_data_ptr<float>(),
                table.const_data_ptr<float>(), xf.const_data_ptr<float>(), y.mutable_data_ptr<float>(), xf.size(0),
                packed.size(0), xf.size(1), block);
    return y;
}

at::Tensor codebook_matmul(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& absmax,
                           const std::optional<at::Tensor>& scale2, const std::optional<at::Tensor>& offset,
                           const at::Tensor& table, const at::Tensor& dmap, int64_t block) {
    return product(x, packed, absmax.const_data_ptr(), scale2 ? ABSMAX_DQ : ABSMAX_F32,
                   static_cast<const float*>(quantlab::data_or_null(scale2)),
                   static_cast<const float*>(quantlab::data_or_null(offset)), dmap, table, block);
}

at::Tensor e2m1_matmul(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                       const std::optional<at::Tensor>& global_scale, const at::Tensor& table, const at::Tensor& e4m3,
                       int64_t block) {
    return product(x, codes, scales.const_data_ptr(), global_scale ? SCALE_E4M3 : SCALE_E8M0,
                   static_cast<const float*>(quantlab::data_or_null(global_scale)), nullptr, e4m3, table, block);
}

}  // namespace

TORCH_LIBRARY_IMPL(quantlab, CPU, m) {
    m.impl("lut4_matmul", &codebook_matmul);
    m.impl("e2m1_matmul", &e2m1_matmul);
}
