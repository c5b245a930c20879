// One Llama-style decoder layer of a decode step (a token, a draft tree, rows side by side) in one call.
//
// Why: at one token per step a SmolLM2-135M layer's kernels take ~0.42 ms and the Python between them (views,
// transposes, the cache write, the attention interface, residual adds: ~25 torch ops and calls from Python) another
// ~0.1 ms: ~3.5 ms of a ~16.5 ms step. Here the same kernels and the same torch ops run in the same order from C++,
// so the result is bitwise that of kernels/layers.py's LeanLayer.forward (which calls this only where it applies and
// checks the bits before it is installed).
#include <cstring>

#include "kernels.h"

namespace {
// buf[row[0, t], h, slot[0, t], :] = states[0, h, t, :] for every new state t and head h, as index_put_ does
// (a copy: the same bits), without index_put_'s generic indexing machinery: for 16 rows of one token that took
// ~24 us a call, two calls a layer, ~1.5 ms of a ~28 ms SmolLM2-135M round. Returns false (the caller uses
// index_put_) where the layout is not the plain one: each state's head_dim values contiguous in both tensors.
bool scatter_states(const torch::Tensor& buf, const torch::Tensor& row, const torch::Tensor& slot,
                    const torch::Tensor& states) {
  const int64_t T = states.size(2), Hkv = states.size(1), D = states.size(3);
  if (buf.scalar_type() != states.scalar_type() || buf.stride(3) != 1 || states.stride(3) != 1 || buf.size(1) != Hkv ||
      buf.size(3) != D || states.size(0) != 1 || row.scalar_type() != at::kLong || slot.scalar_type() != at::kLong ||
      row.numel() != T || slot.numel() != T || !row.is_contiguous() || !slot.is_contiguous())
    return false;
  const int64_t* r = row.data_ptr<int64_t>();
  const int64_t* s = slot.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t)
    TORCH_CHECK(r[t] >= 0 && r[t] < buf.size(0) && s[t] >= 0 && s[t] < buf.size(2),
                "decode_layer: a state's row or slot is out of range");
  const int64_t size = buf.element_size();
  char* dst = static_cast<char*>(buf.data_ptr());
  const char* src = static_cast<const char*>(states.data_ptr());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < Hkv; ++h)
      std::memcpy(dst + (r[t] * buf.stride(0) + h * buf.stride(1) + s[t] * buf.stride(2)) * size,
                  src + (h * states.stride(1) + t * states.stride(2)) * size, D * size);
  return true;
}
}  // namespace

namespace drafttree_kernels {

// hidden [B, T, H]; norm1 absent for a layer without an input norm (an EAGLE-1 head's); q/k/v weights in one call;
// cos/sin [B or 1, T, D]; k_buf/v_buf [>= rows, Hkv, capacity, D], the layer's cache buffers (the caller made room):
// the new states go to slots [start, start + T) of every row, or, for a batch packed in one sequence (B = 1), state t
// to row scatter_row[0, t], slot scatter_slot[0, t] (GrowingLayer._update_rows); the keys are then the first `rows`
// rows' first `length` slots. mask additive, the layer dtype; q_row/q_node/key_len as tree_attention takes them
// (empty: query t of row b is node t). Returns the layer's output and those keys and values (views of the buffers).
std::vector<torch::Tensor> decode_layer(const torch::Tensor& hidden, const c10::optional<torch::Tensor>& norm1,
                                        double eps1, const std::vector<torch::Tensor>& qkv,
                                        const std::vector<c10::optional<torch::Tensor>>& qkv_biases,
                                        const torch::Tensor& cos, const torch::Tensor& sin, const torch::Tensor& k_buf,
                                        const torch::Tensor& v_buf, int64_t start, int64_t length, int64_t rows,
                                        const torch::Tensor& scatter_row, const torch::Tensor& scatter_slot,
                                        const torch::Tensor& mask, const torch::Tensor& q_row,
                                        const torch::Tensor& q_node, const torch::Tensor& key_len,
                                        double scale, int64_t head_dim, const torch::Tensor& o_w,
                                        const c10::optional<torch::Tensor>& o_b, const torch::Tensor& norm2,
                                        double eps2, const std::vector<torch::Tensor>& mlp,
                                        const std::vector<c10::optional<torch::Tensor>>& mlp_biases) {
  TORCH_CHECK(hidden.dim() == 3 && qkv.size() == 3 && mlp.size() == 3 && head_dim > 0, "decode_layer: bad arguments");
  const int64_t B = hidden.size(0), T = hidden.size(1);
  const bool scatter = scatter_row.numel() > 0;
  TORCH_CHECK(k_buf.dim() == 4 && v_buf.sizes() == k_buf.sizes() && rows > 0 && rows <= k_buf.size(0) && start >= 0 &&
              length <= k_buf.size(2) && (scatter ? B == 1 : (rows == B && start + T == length)) &&
              k_buf.scalar_type() == hidden.scalar_type() && v_buf.scalar_type() == hidden.scalar_type(),
              "decode_layer: the cache buffers do not fit");
  const auto x = norm1.has_value() ? drafttree_kernels::rms_norm(hidden, *norm1, eps1) : hidden;
  const auto proj = drafttree_kernels::linears(x, qkv, qkv_biases);
  auto heads = [&](const torch::Tensor& t) { return t.view({B, T, -1, head_dim}).transpose(1, 2); };
  const auto v = heads(proj[2]);
  const auto qk = drafttree_kernels::rotary(heads(proj[0]), heads(proj[1]), cos, sin);
  if (scatter) {  // as GrowingLayer._update_rows: buffer[row, :, slot] = state, [1, T, Hkv, D] at [1, T] places
    using torch::indexing::Slice;
    torch::Tensor k_rows = k_buf, v_rows = v_buf;  // handles to the same buffers (index_put_ is not const)
    if (!scatter_states(k_buf, scatter_row, scatter_slot, qk[1]))
      k_rows.index_put_({scatter_row, Slice(), scatter_slot}, qk[1].transpose(1, 2));
    if (!scatter_states(v_buf, scatter_row, scatter_slot, v))
      v_rows.index_put_({scatter_row, Slice(), scatter_slot}, v.transpose(1, 2));
  } else {
    k_buf.narrow(2, start, T).copy_(qk[1]);
    v_buf.narrow(2, start, T).copy_(v);
  }
  const auto keys = k_buf.narrow(0, 0, rows).narrow(2, 0, length);
  const auto values = v_buf.narrow(0, 0, rows).narrow(2, 0, length);
  const int64_t H = qk[0].size(1);
  const auto q = qk[0].transpose(1, 2).reshape({B * T, H, head_dim}).contiguous();
  const int64_t per_row = q_row.numel() > 0 ? 0 : T;
  const auto att = drafttree_kernels::tree_attention(q, keys, values, mask, q_row, q_node, key_len, per_row, scale)
                       .view({B, T, H, head_dim});
  const auto h = hidden + drafttree_kernels::linear(att.reshape({B, T, -1}).contiguous(), o_w, o_b);
  const auto y = drafttree_kernels::rms_norm(h, norm2, eps2);
  return {h + drafttree_kernels::gated_mlp(y, mlp[0], mlp[1], mlp[2], mlp_biases), keys, values};
}

}  // namespace drafttree_kernels
