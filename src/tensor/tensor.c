/* The BLAS thread setting and GEMM through OpenBLAS.
 * One BLAS thread per process unless asked: data-parallel ranks, not BLAS
 * threads, use the cores. The setting is applied lazily on the first GEMM
 * (or explicitly with mg_set_threads), so MG_THREADS works without any
 * call from the program; so is the check of the GEMM kernels (kernels.c). */
#include <pthread.h>
#include <cblas.h>
#include "multigrad/tensor.h"
#include "device/dk.h"

static pthread_once_t threads_once = PTHREAD_ONCE_INIT;
static int n_threads = 1;
static bool threads_explicit;

static void threads_init(void)
{
    mg_kernels();   /* the right GEMM kernels before the first GEMM */
    if (threads_explicit) return;
    n_threads = (int)mg_env_long("MG_THREADS", 1);
    openblas_set_num_threads(n_threads);
}

void mg_set_threads(int n)
{
    MG_ASSERT(n >= 1);
    threads_explicit = true;
    pthread_once(&threads_once, threads_init);
    n_threads = n;
    openblas_set_num_threads(n);
}

int mg_get_threads(void)
{
    pthread_once(&threads_once, threads_init);
    return n_threads;
}

void mg_gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
             const float *A, int lda, const float *B, int ldb, float beta,
             float *C, int ldc)
{
    if (mg__dk_cur) {
        mg_dk_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    mg__gemm_host(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* The CPU's GEMM (the device kind emu's too). */
void mg__gemm_host(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                   const float *A, int lda, const float *B, int ldb, float beta,
                   float *C, int ldc)
{
    pthread_once(&threads_once, threads_init);
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        /* BLAS would scale C by beta; do it here so empty batches behave. */
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++)
                C[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[(size_t)i * ldc + j];
        return;
    }
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B,
                ldb, beta, C, ldc);
}
