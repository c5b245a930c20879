#include <immintrin.h>
#include <stdio.h>
#include <omp.h>
int main(int argc,char**argv){
  long iters=100000000;
  double t0=omp_get_wtime();
  float sink=0;
  #pragma omp parallel reduction(+:sink)
  {
    __m512 a[12]; __m512bh y[12];
    for(int j=0;j<12;j++){a[j]=_mm512_setzero_ps(); y[j]=(__m512bh)_mm512_set1_epi16(0x3f80+j);}
    __m512bh x=(__m512bh)_mm512_set1_epi16(0x3f80);
    for(long i=0;i<iters;i++){
      #pragma GCC unroll 12
      for(int j=0;j<12;j++) a[j]=_mm512_dpbf16_ps(a[j],x,y[j]);
      __asm__ volatile("" : "+v"(x));
    }
    __m512 s=a[0]; for(int j=1;j<12;j++) s=_mm512_add_ps(s,a[j]);
    sink+=_mm512_reduce_add_ps(s);
  }
  double t=omp_get_wtime()-t0;
  printf("sink %g time %.3f s  GF/s total %.1f\n",sink,t, (double)omp_get_max_threads()*iters*12*64/t/1e9);
}
