/* Adam and AdamW as torch.optim (1.13, foreach=False, amsgrad=False):
 *   g += wd*p (Adam) | p *= 1 - lr*wd (AdamW)
 *   m = beta1*m + (1-beta1)*g;  v = beta2*v + (1-beta2)*g*g
 *   p -= lr/(1-beta1^t) * m / (sqrt(v)/sqrt(1-beta2^t) + eps)
 * eps is added after the bias-corrected square root, as PyTorch does.
 *
 * GCC does not vectorize sqrtf while it must set errno (-fmath-errno is
 * the default, and a function attribute cannot lift it), so the loop is
 * written with AVX-512 or AVX2 intrinsics when the target has them, and
 * the scalar loop (the tail, or the whole on other targets) performs the
 * very same operations (explicit fmaf, correctly rounded sqrt and
 * division): an element's result does not depend on which path took it,
 * so updating ranges equals updating the whole arena bit for bit. */
#include <math.h>
#include "optim_impl.h"
#include "core/elem.h"
#include "device/dk.h"
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#if defined(__AVX512F__)
#define VW 16
#define VF __m512
#define VSET _mm512_set1_ps
#define VLOAD _mm512_loadu_ps
#define VSTORE _mm512_storeu_ps
#define VMUL _mm512_mul_ps
#define VDIV _mm512_div_ps
#define VADD _mm512_add_ps
#define VFMA _mm512_fmadd_ps
#define VSQRT _mm512_sqrt_ps
#elif defined(__AVX2__) && defined(__FMA__)
#define VW 8
#define VF __m256
#define VSET _mm256_set1_ps
#define VLOAD _mm256_loadu_ps
#define VSTORE _mm256_storeu_ps
#define VMUL _mm256_mul_ps
#define VDIV _mm256_div_ps
#define VADD _mm256_add_ps
#define VFMA _mm256_fmadd_ps
#define VSQRT _mm256_sqrt_ps
#endif

void mg__adam_update(float *restrict p, const float *restrict g, float *restrict m,
                     float *restrict v, size_t n, const mg__adam_coef *c)
{
    if (mg__dk_cur) {
        mg_dk_adam_update(p, g, m, v, n, c);
        return;
    }
    const float b1 = c->beta1, omb1 = c->one_minus_beta1, b2 = c->beta2,
                omb2 = c->one_minus_beta2, eps = c->eps, nss = c->neg_step_size,
                bc2s = c->bc2_sqrt, wd = c->wd, decay = c->decay;
    size_t i = 0;
#ifdef VW
    const VF vb1 = VSET(b1), vomb1 = VSET(omb1), vb2 = VSET(b2), vomb2 = VSET(omb2),
             veps = VSET(eps), vnss = VSET(nss), vbc2s = VSET(bc2s), vwd = VSET(wd),
             vdecay = VSET(decay);
    for (; i + VW <= n; i += VW) {
        VF pi = VMUL(VLOAD(p + i), vdecay);
        VF gi = VFMA(vwd, pi, VLOAD(g + i));
        VF mi = VFMA(vomb1, gi, VMUL(VLOAD(m + i), vb1));
        VF vi = VFMA(VMUL(vomb2, gi), gi, VMUL(VLOAD(v + i), vb2));
        VSTORE(m + i, mi);
        VSTORE(v + i, vi);
        VF denom = VADD(VDIV(VSQRT(vi), vbc2s), veps);
        VSTORE(p + i, VFMA(vnss, VDIV(mi, denom), pi));
    }
#endif
    for (; i < n; i++) mg__adam_elem(p, g, m, v, i, b1, omb1, b2, omb2, eps, nss, bc2s, wd, decay);
}
