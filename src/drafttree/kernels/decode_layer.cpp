// One Llama-style decoder layer of a decode step (a token, a draft tree, rows side by side) in one call.
//
// Why: at one token per step a SmolLM2-135M layer's kernels take ~0.42 ms and the Python between them (views,
// transposes, the cache write, the attention interface, residual adds: ~25 torch ops and calls from Python) another
// ~0.1 ms: ~3.5 ms of a ~16.5 ms step. Here the same kernels and the same torch ops run in the same order from C++,
// so the result is bitwise that of kernels/layers.py's LeanLayer.forward (which calls this only where it applies and
// checks the bits before it is installed).
#include "kernels.h"

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
    k_rows.index_put_({scatter_row, Slice(), scatter_slot}, qk[1].transpose(1, 2));
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
