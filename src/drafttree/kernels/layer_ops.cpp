// The small per-layer ops of a decode step around the products: RMSNorm and rotary embeddings. At one token per
// step torch's ops cost more in dispatch than in arithmetic; one call each here.
//
// RMSNorm as Llama-family models compute it (weight * (x * rsqrt(mean(x^2) + eps)) in the input's dtype), one
// call instead of ~eight small torch ops per norm: at one token per step the ops' overhead is most of a norm's
// time. Each row's sum of squares in float32 in one fixed order: a row's result does not depend on the rows
// normalised with it.
#include <limits>
#include <ATen/Parallel.h>

#include <vector>

#include "kernels.h"
#include "simd.h"

namespace {
using namespace drafttree_simd;

inline float narrow(float v, float) { return v; }
inline float narrow(float v, at::BFloat16) { return static_cast<float>(at::BFloat16(v)); }

template <typename T>
void norm_row(const T* x, const T* w, int64_t H, float eps, T* out) {
  vec a0 = vzero(), a1 = vzero();
  int64_t i = 0;
  for (; i + 2 * LANES <= H; i += 2 * LANES) {
    const vec v0 = vload(x + i), v1 = vload(x + i + LANES);
    a0 = vfma(v0, v0, a0);
    a1 = vfma(v1, v1, a1);
  }
  for (; i + LANES <= H; i += LANES) {
    const vec v = vload(x + i);
    a0 = vfma(v, v, a0);
  }
  float ss = hsum(vadd(a0, a1));
  for (; i < H; ++i) ss = std::fma(widen(x[i]), widen(x[i]), ss);
  const float r = 1.0f / std::sqrt(ss / static_cast<float>(H) + eps);
  // as torch does it: the normalised value rounded to the input's dtype, then times the weight in that dtype
  for (int64_t j = 0; j < H; ++j) out[j] = static_cast<T>(widen(w[j]) * narrow(widen(x[j]) * r, T{}));
}

}  // namespace

namespace drafttree_kernels {

// x [..., H] (contiguous), w [H], same dtype (float32 or bf16). Returns x's shape and dtype.
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "rms_norm: CPU tensors only");
  TORCH_CHECK(x.scalar_type() == w.scalar_type(), "rms_norm: x and w must share a dtype");
  TORCH_CHECK(w.dim() == 1 && w.is_contiguous() && x.dim() >= 1 && x.size(-1) == w.size(0), "rms_norm: bad shapes");
  auto xc = x.contiguous();
  auto out = torch::empty_like(xc);
  const int64_t H = w.size(0), rows = H == 0 ? 0 : xc.numel() / H;
  const float e = static_cast<float>(eps);
  auto each = [&](auto tag) {
    using T = decltype(tag);
    const T *xp = xc.data_ptr<T>(), *wp = w.data_ptr<T>();
    T* op = out.data_ptr<T>();
    at::parallel_for(0, rows, std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(H, 1)), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) norm_row<T>(xp + r * H, wp, H, e, op + r * H);
    });
  };
  if (x.scalar_type() == torch::kFloat32) {
    each(float{});
  } else {
    TORCH_CHECK(x.scalar_type() == torch::kBFloat16, "rms_norm: float32 or bfloat16 only");
    each(at::BFloat16{});
  }
  return out;
}

}  // namespace drafttree_kernels

// Rotary position embedding as Llama-family models apply it (x * cos + rotate_half(x) * sin, each product and the
// sum rounded to the input's dtype as torch's three ops do; no fused multiply-add), for q and k in one call instead
// of ~fourteen small ops.
namespace {

#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
template <typename T>
void rotate_one(const T* x, int64_t x_step, const T* c, const T* s, int64_t D, T* out, int64_t out_step) {
  const int64_t half = D / 2;
  int64_t i = 0;
  if (x_step == 1 && out_step == 1) {  // LANES pairs at a time: the same roundings, lane by lane
    const T zero{};
    for (; i + LANES <= half; i += LANES) {
      const vec a = vload(x + i), b = vload(x + i + half);
      const vec lo = vsub(vnarrow(vmul(a, vload(c + i)), zero), vnarrow(vmul(b, vload(s + i)), zero));
      const vec hi = vadd(vnarrow(vmul(b, vload(c + i + half)), zero), vnarrow(vmul(a, vload(s + i + half)), zero));
      vstore(out + i, vnarrow(lo, zero));
      vstore(out + i + half, vnarrow(hi, zero));
    }
  }
  for (; i < half; ++i) {
    const float a = widen(x[i * x_step]), b = widen(x[(i + half) * x_step]);
    const float lo = narrow(narrow(a * widen(c[i]), T{}) + narrow(-b * widen(s[i]), T{}), T{});
    const float hi = narrow(narrow(b * widen(c[i + half]), T{}) + narrow(a * widen(s[i + half]), T{}), T{});
    out[i * out_step] = static_cast<T>(lo);
    out[(i + half) * out_step] = static_cast<T>(hi);
  }
}
#pragma GCC pop_options

// Every (b, h, t) vector of D on its own; many of them (a prompt's) split over the threads: each output is computed
// the same way whichever thread computes it.
template <typename T>
void rotate_all(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin, torch::Tensor& out) {
  const int64_t B = x.size(0), H = x.size(1), Tn = x.size(2), D = x.size(3);
  const T *xp = x.data_ptr<T>(), *cp = cos.data_ptr<T>(), *sp = sin.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const int64_t cb = cos.size(0) == 1 ? 0 : cos.stride(0);
  at::parallel_for(0, B * H * Tn, std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(D, 1)), [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t b = u / (H * Tn), h = (u / Tn) % H, t = u % Tn;
      rotate_one<T>(xp + b * x.stride(0) + h * x.stride(1) + t * x.stride(2), x.stride(3),
                    cp + b * cb + t * cos.stride(1), sp + b * cb + t * sin.stride(1), D,
                    op + b * out.stride(0) + h * out.stride(1) + t * out.stride(2), out.stride(3));
    }
  });
}

}  // namespace

namespace drafttree_kernels {

// q [B, H, T, D], k [B, Hkv, T, D] (any strides), cos and sin [B or 1, T, D] (D contiguous), one dtype. Returns the
// rotated q and k, each laid out as its input is (a transposed view in, the same transposed layout out).
std::vector<torch::Tensor> rotary(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& cos,
                                  const torch::Tensor& sin) {
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && cos.device().is_cpu() && sin.device().is_cpu(),
              "rotary: CPU tensors only");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && cos.dim() == 3 && sin.sizes() == cos.sizes() &&
              sin.strides() == cos.strides() && cos.stride(2) == 1, "rotary: bad shapes");
  const int64_t D = q.size(3);
  TORCH_CHECK(D % 2 == 0 && k.size(3) == D && cos.size(2) == D && q.size(2) == cos.size(1) && k.size(2) == cos.size(1)
              && q.size(0) == k.size(0) && (cos.size(0) == 1 || cos.size(0) == q.size(0)), "rotary: bad shapes");
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && cos.scalar_type() == q.scalar_type() &&
              sin.scalar_type() == q.scalar_type(), "rotary: q, k, cos and sin must share a dtype");
  std::vector<torch::Tensor> outs;
  for (const auto& x : {q, k}) {
    auto out = torch::empty_like(x);  // dense inputs keep their layout
    if (x.scalar_type() == torch::kFloat32) {
      rotate_all<float>(x, cos, sin, out);
    } else {
      TORCH_CHECK(x.scalar_type() == torch::kBFloat16, "rotary: float32 or bfloat16 only");
      rotate_all<at::BFloat16>(x, cos, sin, out);
    }
    outs.push_back(out);
  }
  return outs;
}

// Structured output (grammar.py): -inf in float32 logits [n, V] wherever the int32 bitmasks [n, ceil(V / 32)] have a
// 0 bit (token t: bit t % 32 of word t / 32), in place. Whole words allowed are skipped, whole words forbidden filled
// at once: a row costs what its grammar forbids (torch's masked_fill over a bool mask: ~30 ns a word here).
void apply_token_bitmask(torch::Tensor& logits, const torch::Tensor& bits) {
  TORCH_CHECK(logits.device().is_cpu() && bits.device().is_cpu(), "apply_token_bitmask: CPU tensors only");
  TORCH_CHECK(logits.scalar_type() == torch::kFloat32 && bits.scalar_type() == torch::kInt32,
              "apply_token_bitmask: float32 logits, int32 bitmasks");
  TORCH_CHECK(logits.dim() == 2 && bits.dim() == 2 && logits.is_contiguous() && bits.is_contiguous() &&
                  logits.size(0) == bits.size(0) && bits.size(1) * 32 >= logits.size(1),
              "apply_token_bitmask: logits [n, V] and bitmasks [n, >= V / 32], contiguous");
  const int64_t n = logits.size(0), V = logits.size(1), W = bits.size(1);
  const float ninf = -std::numeric_limits<float>::infinity();
  float* z = logits.data_ptr<float>();
  const uint32_t* b = reinterpret_cast<const uint32_t*>(bits.data_ptr<int32_t>());
  for (int64_t r = 0; r < n; ++r) {
    float* row = z + r * V;
    const uint32_t* words = b + r * W;
    for (int64_t w = 0; w * 32 < V; ++w) {
      const uint32_t word = words[w];
      if (word == 0xFFFFFFFFu) continue;
      const int64_t end = std::min<int64_t>(32, V - w * 32);
      float* p = row + w * 32;
      for (int64_t j = 0; j < end; ++j)
        if (!((word >> j) & 1u)) p[j] = ninf;
    }
  }
}

}  // namespace drafttree_kernels
