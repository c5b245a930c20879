// The vdpbf16ps and FMA peaks of one core (stop 56, Zen 4: 3.58 vdpbf16ps/ns = 229 GFLOP/s, FMA 115 GFLOP/s).
// Build and run: g++ -O2 -march=native logs/s56_bf16_peak.cpp -o /tmp/peak && /tmp/peak
#include <immintrin.h>
#include <chrono>
#include <cstdio>
int main() {
  __m512 acc[16]; for (int i=0;i<16;++i) acc[i]=_mm512_set1_ps((float)i);
  __m512i a=_mm512_set1_epi32(0x3f803f80), b=_mm512_set1_epi32(0x00010001);
  long n=50000000;
  for (int rep=0; rep<2; ++rep) {
  auto t0=std::chrono::steady_clock::now();
  for (long i=0;i<n;++i){
#pragma GCC unroll 16
    for(int j=0;j<16;++j) acc[j]=_mm512_dpbf16_ps(acc[j],(__m512bh)a,(__m512bh)b);
  }
  auto t1=std::chrono::steady_clock::now();
  double s=std::chrono::duration<double>(t1-t0).count();
  __m512 t=acc[0]; for(int j=1;j<16;++j) t=_mm512_add_ps(t,acc[j]);
  float o[16]; _mm512_storeu_ps(o,t);
  printf("vdpbf16ps zmm: %.2f per ns (%.0f GFLOPS/core) %g\n", n*16/s/1e9, n*16*64/s/1e9, o[0]);
  __m512 f=_mm512_set1_ps(1.0000001f);
  t0=std::chrono::steady_clock::now();
  for (long i=0;i<n;++i){
#pragma GCC unroll 16
    for(int j=0;j<16;++j) acc[j]=_mm512_fmadd_ps(acc[j],f,f);
  }
  t1=std::chrono::steady_clock::now(); s=std::chrono::duration<double>(t1-t0).count();
  t=acc[0]; for(int j=1;j<16;++j) t=_mm512_add_ps(t,acc[j]); _mm512_storeu_ps(o,t);
  printf("fma zmm: %.2f per ns (%.0f GFLOPS/core) %g\n", n*16/s/1e9, n*16*32/s/1e9, o[0]);
  }
}
