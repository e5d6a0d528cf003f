/* The kv_attention library's products as torch ops' CPU kernels (quantlab/native/src/torch_ops.h):
   quantlab::kv_scores and quantlab::kv_values, and their forms with a ring, kv_scores_ring and kv_values_ring
   (kv/code_attention.py). */
#include "torch_ops.h"

extern "C" {
void kv_scores(int kind, int bits, int D, int group, int row_bytes, int zero_bytes, const void* data,
               const void* scales, const void* zeros, int BH, int S, const int64_t* n_valid, const float* q, int G,
               int ring_kind, const void* ring, int R, float* out);
void kv_values(int kind, int bits, int D, int group, int row_bytes, int zero_bytes, const void* data,
               const void* scales, const void* zeros, int BH, int S, const int64_t* n_valid, const float* p, int G,
               int ring_kind, const void* ring, int R, float* out);
}

namespace {

constexpr int64_t INT_CHANNEL = 5;  /* code_attention.INT_CHANNEL: keys per channel, [blocks, b*h*d, .] */

/* A ring's cast kind (code_attention.CASTS). */
int cast_kind(at::ScalarType dtype) {
    if (dtype == at::kFloat) return 1;
    if (dtype == at::kHalf) return 2;
    return 3;  /* bfloat16 */
}

/* Positions per head of a ring [b, h, R, d] (0: none). */
int64_t ring_slots(const std::optional<at::Tensor>& ring) { return ring ? ring->size(2) : 0; }

using Entry = decltype(&kv_scores);

/* (batch x heads, slots) of a store's main tensor (code_attention._heads_and_slots). */
std::pair<int64_t, int64_t> heads_and_slots(int64_t kind, int64_t group, int64_t d, const at::Tensor& data) {
    if (kind == INT_CHANNEL) return {data.size(1) / d, data.size(0) * group};
    return {data.size(0) * data.size(1), data.size(2)};
}

void call(Entry entry, int64_t kind, int64_t bits, int64_t group, int64_t d, const at::Tensor& data,
          const std::optional<at::Tensor>& scales, const std::optional<at::Tensor>& zeros, const at::Tensor& n_valid,
          const at::Tensor& x, const std::optional<at::Tensor>& ring, at::Tensor& out) {
    auto [bh, s] = heads_and_slots(kind, group, d, data);
    at::Tensor valid = n_valid.to(at::kLong);
    int row_bytes = static_cast<int>(data.size(-1) * data.element_size());
    int zero_bytes = zeros ? static_cast<int>(zeros->size(-1)) : 0;
    entry(kind, bits, d, group, row_bytes, zero_bytes, data.const_data_ptr(), quantlab::data_or_null(scales),
          quantlab::data_or_null(zeros), bh, s, valid.const_data_ptr<int64_t>(), x.const_data_ptr<float>(), x.size(1),
          ring ? cast_kind(ring->scalar_type()) : 0, quantlab::data_or_null(ring), static_cast<int>(ring_slots(ring)),
          out.mutable_data_ptr<float>());
}

at::Tensor ring_scores(int64_t kind, int64_t bits, int64_t group, int64_t d, const at::Tensor& data,
                       const std::optional<at::Tensor>& scales, const std::optional<at::Tensor>& zeros,
                       const at::Tensor& n_valid, const at::Tensor& q, const std::optional<at::Tensor>& ring) {
    at::Tensor qc = q.contiguous();
    std::optional<at::Tensor> rc = ring ? std::optional<at::Tensor>(ring->contiguous()) : std::nullopt;
    at::Tensor out = at::empty({qc.size(0), qc.size(1), heads_and_slots(kind, group, d, data).second + ring_slots(rc)},
                               at::kFloat);
    call(&kv_scores, kind, bits, group, d, data, scales, zeros, n_valid, qc, rc, out);
    return out;
}

at::Tensor ring_values(int64_t kind, int64_t bits, int64_t group, int64_t d, const at::Tensor& data,
                       const std::optional<at::Tensor>& scales, const std::optional<at::Tensor>& zeros,
                       const at::Tensor& n_valid, const at::Tensor& p, const std::optional<at::Tensor>& ring) {
    at::Tensor pc = p.contiguous();
    std::optional<at::Tensor> rc = ring ? std::optional<at::Tensor>(ring->contiguous()) : std::nullopt;
    at::Tensor out = at::empty({pc.size(0), pc.size(1), d}, at::kFloat);
    call(&kv_values, kind, bits, group, d, data, scales, zeros, n_valid, pc, rc, out);
    return out;
}

/* quantlab::kv_scores and kv_values: the stored slots alone; kv_scores_ring and kv_values_ring: with a ring. */
at::Tensor scores(int64_t kind, int64_t bits, int64_t group, int64_t d, const at::Tensor& data,
                  const std::optional<at::Tensor>& scales, const std::optional<at::Tensor>& zeros,
                  const at::Tensor& n_valid, const at::Tensor& q) {
    return ring_scores(kind, bits, group, d, data, scales, zeros, n_valid, q, std::nullopt);
}

at::Tensor values(int64_t kind, int64_t bits, int64_t group, int64_t d, const at::Tensor& data,
                  const std::optional<at::Tensor>& scales, const std::optional<at::Tensor>& zeros,
                  const at::Tensor& n_valid, const at::Tensor& p) {
    return ring_values(kind, bits, group, d, data, scales, zeros, n_valid, p, std::nullopt);
}

at::Tensor scores_with_ring(int64_t kind, int64_t bits, int64_t group, int64_t d, const at::Tensor& data,
                            const std::optional<at::Tensor>& scales, const std::optional<at::Tensor>& zeros,
                            const at::Tensor& n_valid, const at::Tensor& q, const at::Tensor& ring) {
    return ring_scores(kind, bits, group, d, data, scales, zeros, n_valid, q, ring);
}

at::Tensor values_with_ring(int64_t kind, int64_t bits, int64_t group, int64_t d, const at::Tensor& data,
                            const std::optional<at::Tensor>& scales, const std::optional<at::Tensor>& zeros,
                            const at::Tensor& n_valid, const at::Tensor& p, const at::Tensor& ring) {
    return ring_values(kind, bits, group, d, data, scales, zeros, n_valid, p, ring);
}

}  // namespace

TORCH_LIBRARY_IMPL(quantlab, CPU, m) {
    m.impl("kv_scores", &scores);
    m.impl("kv_values", &values);
    m.impl("kv_scores_ring", &scores_with_ring);
    m.impl("kv_values_ring", &values_with_ring);
}
