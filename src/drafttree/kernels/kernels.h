// The extension's entry points, declared once: small_gemm.cpp binds them for Python, decode_layer.cpp calls the
// others from C++. Definitions: small_gemm.cpp (linear, linears, gated_mlp), layer_ops.cpp (rms_norm, rotary),
// tree_attention.cpp, decode_layer.cpp.
#pragma once
#include <torch/extension.h>
#include <xmmintrin.h>

#include <cstring>
#include <vector>

namespace drafttree_kernels {
// n float32 sums (plus the bias) rounded to bf16 as torch's vectorised conversion does (to nearest even, denormals
// kept, NaN as 0xFFFF); written so that the compiler vectorises it.
inline void round_run(const float* o, const float* bias, at::BFloat16* r, int64_t n) {
  uint16_t* out = reinterpret_cast<uint16_t*>(r);
  auto round = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return f != f ? uint16_t{0xFFFF} : static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
  };
  if (bias != nullptr) {
    for (int64_t c = 0; c < n; ++c) out[c] = round(o[c] + bias[c]);
  } else {
    for (int64_t c = 0; c < n; ++c) out[c] = round(o[c]);
  }
}

// bf16 products flush denormal inputs and results to zero (MXCSR DAZ + FTZ, for this thread while it lives), as
// vdpbf16ps and AMX tiles do, so that the FMA paths give the instruction's bits; float32 keeps IEEE denormals.
struct FlushDenormals {
  unsigned saved;
  bool on;
  explicit FlushDenormals(bool flush) : saved(_mm_getcsr()), on(flush) {
    if (on) _mm_setcsr(saved | 0x8040);
  }
  ~FlushDenormals() {
    if (on) _mm_setcsr(saved);
  }
};

// AMX tiles (amx_gemm.cpp): whether this build and this process can use them, whether they are switched on (at module
// load: DRAFTTREE_AMX=0 keeps the vector path), whether a weight takes them, its tiles, and the bf16 product on them.
extern const bool AMX_READY;
extern bool AMX_ON;
bool amx_packable(const torch::Tensor& w);
torch::Tensor amx_pack(const torch::Tensor& w);
std::vector<torch::Tensor> amx_linears(const torch::Tensor& x2, const std::vector<torch::Tensor>& ws,
                                       const std::vector<torch::Tensor>& fbias);
// Panels (panel_gemm.cpp): bf16 products on AVX2 over weights repacked 16 columns at a time; on where this build's
// vector path is AVX2 (set_panels switches them), never with AMX.
extern const bool PANELS_READY;
extern bool PANELS_ON;
bool panel_packable(const torch::Tensor& w);
torch::Tensor panel_pack(const torch::Tensor& w);
std::vector<torch::Tensor> panel_linears(const torch::Tensor& x2, const std::vector<torch::Tensor>& ws,
                                         const std::vector<torch::Tensor>& fbias);
// Packed weights (packed_weights.cpp), for whichever of the two is on: whether a weight takes them, its packed copy
// (made once, kept), a copy packed by the caller, forgetting them all, and the product (bf16 sums rounded, plus bias).
bool packable(const torch::Tensor& w);
torch::Tensor pack_weight(const torch::Tensor& w);
torch::Tensor packed_weight(const torch::Tensor& w);
void register_packed(const torch::Tensor& w, const torch::Tensor& packed);
void forget_packed();
std::vector<torch::Tensor> packed_linears(const torch::Tensor& x2, const std::vector<torch::Tensor>& ws,
                                          const std::vector<torch::Tensor>& fbias);
std::vector<torch::Tensor> linears(const torch::Tensor& x, const std::vector<torch::Tensor>& ws,
                                   const std::vector<c10::optional<torch::Tensor>>& biases);
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& w, const c10::optional<torch::Tensor>& bias);
torch::Tensor gated_mlp(const torch::Tensor& x, const torch::Tensor& gate, const torch::Tensor& up,
                        const torch::Tensor& down, const std::vector<c10::optional<torch::Tensor>>& biases);
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& w, double eps);
void apply_token_bitmask(torch::Tensor& logits, const torch::Tensor& bits);
std::vector<torch::Tensor> rotary(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& cos,
                                  const torch::Tensor& sin);
torch::Tensor tree_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& mask, const torch::Tensor& q_row, const torch::Tensor& q_node,
                             const torch::Tensor& key_len, int64_t per_row, double scale);
// causal attention of a prompt over its own keys on AVX-512 bf16 (prompt_attention.cpp): whether this build has it
bool prompt_attention_ready();
torch::Tensor prompt_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, double scale);
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
