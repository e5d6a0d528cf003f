/* The ggml library's decode-step ops as torch ops' CPU kernels (quantlab/native/src/torch_ops.h):
   quantlab::ggml_matmul_q8, quantlab::ggml_matmul_repacked and quantlab::ggml_dequantize (a step's embedding rows;
   quant/forms/ggml/kernel.py). */
#include "torch_ops.h"

#include <algorithm>
#include <vector>

extern "C" {
int ggml_dequantize_rows(int type, const uint8_t* src, float* dst, int64_t row0, int64_t row1, int64_t n_per_row,
                         int64_t row_bytes);
int64_t ggml_q8_scratch_bytes(int type, int64_t m, int64_t n_in);
int ggml_matmul_q8(int type, const uint8_t* w, const float* x, float* y, int64_t m, int64_t out, int64_t n_in,
                   int64_t row_bytes, uint8_t* scratch);
int ggml_matmul_repacked(int type, const uint8_t* w, const float* x, float* y, int64_t m, int64_t out, int64_t n_in,
                         int64_t row_bytes, uint8_t* scratch);
}

namespace {

using Entry = int (*)(int, const uint8_t*, const float*, float*, int64_t, int64_t, int64_t, int64_t, uint8_t*);

/* The product against the activations in the type's 8-bit blocks. Their scratch is the calling thread's own buffer,
   grown to the largest step seen: no allocation a call. */
at::Tensor q8_product(Entry entry, const at::Tensor& x, const at::Tensor& blocks, int64_t ggml_id) {
    thread_local std::vector<uint8_t> scratch;
    at::Tensor xf = quantlab::rows_f32(x), y = quantlab::output_f32(xf.size(0), blocks.size(0));
    int type = static_cast<int>(ggml_id);
    const int64_t bytes = ggml_q8_scratch_bytes(type, xf.size(0), xf.size(1));
    TORCH_CHECK(bytes >= 0, "ggml type ", type, " has no 8-bit activation product here");
    if (scratch.size() < static_cast<size_t>(bytes)) scratch.resize(bytes);
    entry(type, blocks.const_data_ptr<uint8_t>(), xf.const_data_ptr<float>(), y.mutable_data_ptr<float>(), xf.size(0),
          blocks.size(0), xf.size(1), blocks.size(1), scratch.data());
    return y;
}

at::Tensor matmul_q8(const at::Tensor& x, const at::Tensor& blocks, int64_t ggml_id) {
    return q8_product(&ggml_matmul_q8, x, blocks, ggml_id);
}

at::Tensor matmul_repacked(const at::Tensor& x, const at::Tensor& packed, int64_t ggml_id) {
    return q8_product(&ggml_matmul_repacked, x, packed, ggml_id);
}

/* Rows [row0, row1) of the blocks as dtype. */
at::Tensor dequantize(const at::Tensor& blocks, int64_t ggml_id, int64_t n_in, int64_t row0, int64_t row1,
                      at::ScalarType dtype) {
    at::Tensor source = blocks.contiguous();
    at::Tensor out = quantlab::output_f32(std::max<int64_t>(row1 - row0, 0), n_in);
    if (out.numel()) {
        ggml_dequantize_rows(static_cast<int>(ggml_id), source.const_data_ptr<uint8_t>(), out.mutable_data_ptr<float>(),
                             row0, row1, n_in, source.size(1));
    }
    return out.to(dtype);
}

}  // namespace

TORCH_LIBRARY_IMPL(quantlab, CPU, m) {
    m.impl("ggml_dequantize", &dequantize);
    m.impl("ggml_matmul_q8", &matmul_q8);
    m.impl("ggml_matmul_repacked", &matmul_repacked);
}
