// The extension's entry points, declared once: small_gemm.cpp binds them for Python, decode_layer.cpp calls the
// others from C++. Definitions: small_gemm.cpp (linear, linears, gated_mlp), layer_ops.cpp (rms_norm, rotary),
// tree_attention.cpp, decode_layer.cpp.
#pragma once
#include <torch/extension.h>

#include <vector>

namespace drafttree_kernels {
std::vector<torch::Tensor> linears(const torch::Tensor& x, const std::vector<torch::Tensor>& ws,
                                   const std::vector<c10::optional<torch::Tensor>>& biases);
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& w, const c10::optional<torch::Tensor>& bias);
torch::Tensor gated_mlp(const torch::Tensor& x, const torch::Tensor& gate, const torch::Tensor& up,
                        const torch::Tensor& down, const std::vector<c10::optional<torch::Tensor>>& biases);
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& w, double eps);
std::vector<torch::Tensor> rotary(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& cos,
                                  const torch::Tensor& sin);
torch::Tensor tree_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& mask, const torch::Tensor& q_row, const torch::Tensor& q_node,
                             const torch::Tensor& key_len, int64_t per_row, double scale);
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
                                        const std::vector<c10::optional<torch::Tensor>>& mlp_biases);
}  // namespace drafttree_kernels
