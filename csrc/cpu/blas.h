// The BLAS entry points the CPU plans call from their own worker threads, where ATen's dispatcher
// state is not set up: the Fortran sgemm_/dgemm_ ATen itself calls (MKL in the x86-64 wheels) and
// MKL's packed-GEMM API (what oneDNN's RNNs use on Intel; torch's x86-64 wheels export it). All
// weak: without them the callers take another engine (plan_choice.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <c10/util/Exception.h>

extern "C" {
void sgemm_(const char* ta, const char* tb, const int* m, const int* n, const int* k, const float* alpha,
            const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c,
            const int* ldc) __attribute__((weak));
void dgemm_(const char* ta, const char* tb, const int* m, const int* n, const int* k, const double* alpha,
            const double* a, const int* lda, const double* b, const int* ldb, const double* beta, double* c,
            const int* ldc) __attribute__((weak));
size_t cblas_sgemm_pack_get_size(int identifier, int m, int n, int k) __attribute__((weak));
void cblas_sgemm_pack(int layout, int identifier, int trans, int m, int n, int k, float alpha, const float* src,
                      int ld, float* dest) __attribute__((weak));
void cblas_sgemm_compute(int layout, int transa, int transb, int m, int n, int k, const float* a, int lda,
                         const float* b, int ldb, float beta, float* c, int ldc) __attribute__((weak));
// MKL's per-thread thread count for the GEMMs a thread issues (the C entry point; mkl.h maps
// mkl_set_num_threads_local to it).
int MKL_Set_Num_Threads_Local(int n) __attribute__((weak));
}

namespace cudnn_rnn {
namespace cpu {

constexpr int kCblasRowMajor = 101, kCblasNoTrans = 111, kCblasTrans = 112, kCblasPacked = 151,
              kCblasBMatrix = 162;

template <typename T>
bool have_blas() {
  return std::is_same_v<T, float> ? sgemm_ != nullptr : dgemm_ != nullptr;
}

inline bool have_mkl_packed() {
  return cblas_sgemm_pack_get_size != nullptr && cblas_sgemm_pack != nullptr && cblas_sgemm_compute != nullptr;
}

// Row-major C[M, N] = A[M, K] · op(B) + beta · C on the calling thread, where op(B) is B [K, N]
// or, with trans_b, the transpose of B [N, K]. (In BLAS's column-major terms: C^T = op(B)^T A^T.)
template <typename T>
void blas_gemm(bool trans_b, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* Bm, int64_t ldb,
               T beta, T* C, int64_t ldc) {
  const int m = static_cast<int>(N), n = static_cast<int>(M), k = static_cast<int>(K);
  const int la = static_cast<int>(ldb), lb = static_cast<int>(lda), lc = static_cast<int>(ldc);
  const T one = 1;
  const char* ta = trans_b ? "T" : "N";
  if constexpr (std::is_same_v<T, float>) {
    sgemm_(ta, "N", &m, &n, &k, &one, Bm, &la, A, &lb, &beta, C, &lc);
  } else {
    dgemm_(ta, "N", &m, &n, &k, &one, Bm, &la, A, &lb, &beta, C, &lc);
  }
}

// Row-major C[M, N] = A[M, K] · op(B) + beta · C with op(B) packed by cblas_sgemm_pack.
inline void mkl_packed_gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* packed,
                            float beta, float* C, int64_t ldc) {
  cblas_sgemm_compute(kCblasRowMajor, kCblasNoTrans, kCblasPacked, int(M), int(N), int(K), A, int(lda), packed,
                      int(N), beta, C, int(ldc));
}

}  // namespace cpu
}  // namespace cudnn_rnn
