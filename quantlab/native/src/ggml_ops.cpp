/* The ggml library's decode-step products as torch ops' CPU kernels (quantlab/native/src/torch_ops.h):
   quantlab::ggml_matmul_q8 and quantlab::ggml_matmul_repacked (quant/forms/ggml/kernel.py). */
#include "torch_ops.h"

extern "C" {
int64_t ggml_q8_scratch_bytes(int type, int64_t m, int64_t n_in);
int ggml_matmul_q8(int type, const uint8_t* w, const float* x, float* y, int64_t m, int64_t out, int64_t n_in,
                   int64_t row_bytes, uint8_t* scratch);
int ggml_matmul_repacked(int type, const uint8_t* w, const float* x, float* y, int64_t m, int64_t out, int64_t n_in,
                         int64_t row_bytes, uint8_t* scratch);
}

namespace {

using Entry = int (*)(int, const uint8_t*, const float*, float*, int64_t, int64_t, int64_t, int64_t, uint8_t*);

/* The product against the activations in the type's 8-bit blocks, with its scratch. */
at::Tensor q8_product(Entry entry, const at::Tensor& x, const at::Tensor& blocks, int64_t ggml_id) {
    at::Tensor xf = quantlab::rows_f32(x), y = quantlab::output_f32(xf.size(0), blocks.size(0));
    int type = static_cast<int>(ggml_id);
    at::Tensor scratch = at::empty({ggml_q8_scratch_bytes(type, xf.size(0), xf.size(1))}, at::kByte);
    entry(type, blocks.const_data_ptr<uint8_t>(), xf.const_data_ptr<float>(), y.mutable_data_ptr<float>(), xf.size(0),
          blocks.size(0), xf.size(1), blocks.size(1), scratch.mutable_data_ptr<uint8_t>());
    return y;
}

at::Tensor matmul_q8(const at::Tensor& x, const at::Tensor& blocks, int64_t ggml_id) {
    return q8_product(&ggml_matmul_q8, x, blocks, ggml_id);
}

at::Tensor matmul_repacked(const at::Tensor& x, const at::Tensor& packed, int64_t ggml_id) {
    return q8_product(&ggml_matmul_repacked, x, packed, ggml_id);
}

}  // namespace

TORCH_LIBRARY_IMPL(quantlab, CPU, m) {
    m.impl("ggml_matmul_q8", &matmul_q8);
    m.impl("ggml_matmul_repacked", &matmul_repacked);
}
