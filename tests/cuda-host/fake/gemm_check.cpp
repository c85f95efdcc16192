// The fake cuBLAS' GEMM against hand-computed column-major results and its
// argument checks (tests/cuda/fake-cublas.test): the e2e tests alone could
// not tell a transposition error of the device from a compensating one here.
#include <cublas_v2.h>
#include <cuda.h>
#include <cstdio>
#include <cmath>
int main() {
  cuInit(0);
  cublasHandle_t h; cublasCreate(&h);
  // Column-major: A is 2x3 (m=2,k=3) stored as op(A)=A^T with lda=3 (A stored 3x2 col-major)
  // C = op(A) op(B), op(A)=T of stored [k x m] (lda=k), op(B)=N stored [k x n] (ldb=k)
  int m=2,n=2,k=3;
  float As[6] = {1,2,3, 4,5,6};   // stored k x m col-major: col0=(1,2,3) col1=(4,5,6) -> op(A)=A^T rows (1,2,3),(4,5,6)
  float Bs[6] = {1,0,1, 0,1,0};   // k x n col-major: col0=(1,0,1), col1=(0,1,0)
  float C[4]; float a=1,b=0;
  int r = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m,n,k,&a,As,CUDA_R_32F,3,Bs,CUDA_R_32F,3,&b,C,CUDA_R_32F,2,CUBLAS_COMPUTE_32F,CUBLAS_GEMM_DEFAULT);
  // C(0,0)=1+3=4, C(1,0)=4+6=10, C(0,1)=2, C(1,1)=5 -> col-major {4,10,2,5}
  printf("rc=%d C={%g,%g,%g,%g} want {4,10,2,5}\n", r, C[0],C[1],C[2],C[3]);
  r = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m,n,k,&a,As,CUDA_R_16BF,3,Bs,CUDA_R_32F,3,&b,C,CUDA_R_32F,2,CUBLAS_COMPUTE_32F,CUBLAS_GEMM_DEFAULT);
  printf("mixed types rc=%d (want 15)\n", r);
  r = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m,n,k,&a,As,CUDA_R_32F,2,Bs,CUDA_R_32F,3,&b,C,CUDA_R_32F,2,CUBLAS_COMPUTE_32F,CUBLAS_GEMM_DEFAULT);
  printf("lda too small rc=%d (want 7)\n", r);
  return 0;
}
