#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
// w: [N, K] uint8 u in [0,127] meaning (u - 64); bf16 word 0x4300|u == 128 + u. out = s[n] * (sum x*(128+u) - 192*sum x)
template <int M>
static void rows4(const uint8_t* w, int64_t K, const uint16_t* x, const float* xsum, const float* scale, float* out,
                  int64_t N, int64_t n) {
  __m512 acc[4][M];
  for (int r = 0; r < 4; ++r)
    for (int m = 0; m < M; ++m) acc[r][m] = _mm512_setzero_ps();
  const __m512i magic = _mm512_set1_epi16(0x4300);
  for (int64_t k = 0; k < K; k += 32) {
    __m512i wv[4];
    for (int r = 0; r < 4; ++r)
      wv[r] = _mm512_or_si512(_mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + (n + r) * K + k))), magic);
    for (int m = 0; m < M; ++m) {
      const __m512i xv = _mm512_loadu_si512(x + m * K + k);
      for (int r = 0; r < 4; ++r) acc[r][m] = _mm512_dpbf16_ps(acc[r][m], (__m512bh)xv, (__m512bh)wv[r]);
    }
  }
  for (int r = 0; r < 4; ++r)
    for (int m = 0; m < M; ++m) out[m * N + n + r] = (_mm512_reduce_add_ps(acc[r][m]) - 192.0f * xsum[m]) * scale[n + r];
}

torch::Tensor int7_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& scale) {
  auto x2 = x.reshape({-1, x.size(-1)}).contiguous();
  const int64_t M = x2.size(0), K = x2.size(1), N = w.size(0);
  TORCH_CHECK(K % 32 == 0 && N % 4 == 0 && x2.scalar_type() == torch::kBFloat16);
  auto xs = x2.to(torch::kFloat32).sum(1).contiguous();
  auto out = torch::empty({M, N}, x2.options().dtype(torch::kFloat32));
  const uint8_t* wp = w.data_ptr<uint8_t>();
  const float* sp = scale.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const uint16_t* xb = reinterpret_cast<const uint16_t*>(x2.data_ptr());
  for (int64_t m0 = 0; m0 < M; m0 += 4) {
    const int64_t mm = std::min<int64_t>(4, M - m0);
    const uint16_t* xp = xb + m0 * K;
    const float* xsp = xs.data_ptr<float>() + m0;
    float* o = op + m0 * N;
    at::parallel_for(0, N / 4, 8, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        switch (mm) {
          case 1: rows4<1>(wp, K, xp, xsp, sp, o, N, i * 4); break;
          case 2: rows4<2>(wp, K, xp, xsp, sp, o, N, i * 4); break;
          case 3: rows4<3>(wp, K, xp, xsp, sp, o, N, i * 4); break;
          default: rows4<4>(wp, K, xp, xsp, sp, o, N, i * 4); break;
        }
      }
    });
  }
  auto shape = x.sizes().vec(); shape.back() = N;
  return out.to(x.scalar_type()).view(shape);
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("int7_linear", &int7_linear); }
