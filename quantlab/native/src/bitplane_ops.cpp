/* The bitplane library's decode-step product as a torch op's CPU kernel (quantlab/native/src/torch_ops.h):
   quantlab::bitplane_matmul (quant/forms/affine/bitplane.py). */
#include "torch_ops.h"

extern "C" void bitplane_matmul(const uint8_t* w, const void* scales, int scale_kind, const uint8_t* zeros,
                                int zero_row_bytes, int sym_zero, const float* x, float* y, int M, int N, int K,
                                int bits, int group);
extern "C" int bitplane_matmul_bf16(const uint8_t* w, const void* scales, int scale_kind, const uint8_t* zeros,
                                    int zero_row_bytes, int sym_zero, const uint16_t* x, float* y, int M, int N, int K,
                                    int bits, int group);

namespace {

at::Tensor matmul(const at::Tensor& x, const at::Tensor& planes, const at::Tensor& scales,
                  const std::optional<at::Tensor>& zeros, int64_t bits, int64_t group) {
    /* zero points packed as codes (uint8, their bytes per row) or stored like the scales (-1); none: symmetric */
    int zero_row_bytes = !zeros ? 0 : zeros->scalar_type() == at::kByte ? static_cast<int>(zeros->size(1)) : -1;
    if (x.scalar_type() == at::kBFloat16) {  /* a bf16 model's activations, as they are */
        at::Tensor xb = x.contiguous(), y = quantlab::output_f32(xb.size(0), planes.size(0));
        int failed = bitplane_matmul_bf16(
            planes.const_data_ptr<uint8_t>(), scales.const_data_ptr(), quantlab::scale_kind(scales),
            static_cast<const uint8_t*>(quantlab::data_or_null(zeros)), zero_row_bytes, 1 << (bits - 1),
            static_cast<const uint16_t*>(xb.const_data_ptr()), y.mutable_data_ptr<float>(), xb.size(0), planes.size(0),
            xb.size(1), bits, group);
        TORCH_CHECK(!failed, "bitplane_matmul: out of memory");
        return y;
    }
    at::Tensor xf = quantlab::rows_f32(x), y = quantlab::output_f32(xf.size(0), planes.size(0));
    bitplane_matmul(planes.const_data_ptr<uint8_t>(), scales.const_data_ptr(), quantlab::scale_kind(scales),
                    static_cast<const uint8_t*>(quantlab::data_or_null(zeros)), zero_row_bytes, 1 << (bits - 1),
                    xf.const_data_ptr<float>(), y.mutable_data_ptr<float>(), xf.size(0), planes.size(0), xf.size(1),
                    bits, group);
    return y;
}

}  // namespace

TORCH_LIBRARY_IMPL(quantlab, CPU, m) { m.impl("bitplane_matmul", &matmul); }
