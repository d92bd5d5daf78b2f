/* SGD as torch.optim.SGD (1.13, foreach=False): weight decay is added to
 * the gradient; with momentum the buffer is the gradient itself on the
 * first step and mu*buf + (1-dampening)*g after; Nesterov steps along
 * g + mu*buf. Each variant is its own simple loop over restrict pointers
 * so the compiler vectorizes it (-O3 -march=native turns the a + s*b forms
 * into FMAs, as PyTorch's AVX2 kernels do). */
#include "optim_impl.h"
#include "device/dk.h"

static void plain(float *restrict p, const float *restrict g, size_t n, float neg_lr, float wd)
{
    if (wd == 0.0f) {
        for (size_t i = 0; i < n; i++) p[i] = p[i] + neg_lr * g[i];
    } else {
        for (size_t i = 0; i < n; i++) {
            float d = g[i] + wd * p[i];
            p[i] = p[i] + neg_lr * d;
        }
    }
}

static void momentum(float *restrict p, const float *restrict g, float *restrict buf,
                     size_t n, const mg__sgd_coef *c)
{
    const float neg_lr = c->neg_lr, wd = c->wd, mu = c->mu, omd = c->one_minus_damp;
    if (c->first) {
        if (c->nesterov) {
            for (size_t i = 0; i < n; i++) {
                float d = g[i] + wd * p[i];
                buf[i] = d;
                p[i] = p[i] + neg_lr * (d + mu * d);
            }
        } else {
            for (size_t i = 0; i < n; i++) {
                float d = g[i] + wd * p[i];
                buf[i] = d;
                p[i] = p[i] + neg_lr * d;
            }
        }
        return;
    }
    if (c->nesterov) {
        for (size_t i = 0; i < n; i++) {
            float d = g[i] + wd * p[i];
            float b = buf[i] * mu + omd * d;
            buf[i] = b;
            p[i] = p[i] + neg_lr * (d + mu * b);
        }
    } else if (wd == 0.0f && omd == 1.0f) {
        /* The common case (models.md's SGD): buf = mu*buf + g; p -= lr*buf. */
        for (size_t i = 0; i < n; i++) {
            float b = buf[i] * mu + g[i];
            buf[i] = b;
            p[i] = p[i] + neg_lr * b;
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            float d = g[i] + wd * p[i];
            float b = buf[i] * mu + omd * d;
            buf[i] = b;
            p[i] = p[i] + neg_lr * b;
        }
    }
}

void mg__sgd_update(float *p, const float *g, float *buf, size_t n, const mg__sgd_coef *c)
{
    if (mg__dk_cur) {
        mg_dk_sgd_update(p, g, buf, n, c);
        return;
    }
    if (c->mu == 0.0f)
        plain(p, g, n, c->neg_lr, c->wd);
    else
        momentum(p, g, buf, n, c);
}
