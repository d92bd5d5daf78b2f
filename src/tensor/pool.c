/* Average and max pooling over k x k windows with stride s, no padding,
 * floor mode (PyTorch's defaults for nn.AvgPool2d / nn.MaxPool2d with
 * stride given). Planes are independent: callers pass n*c planes. Max
 * pooling sends the gradient to the first maximum in row-major order, as
 * PyTorch's CPU kernel does. The fused 2x2 conv epilogue in conv.c covers
 * the zoo's pools; these serve pool layers of any size. */
#include <string.h>
#include "multigrad/tensor.h"
#include "core/elem.h"
#include "device/dk.h"

void mg_avgpool2d_forward(float *y, const float *x, int nc, int h, int w, int k, int s)
{
    if (mg__dk_cur) {
        mg_dk_avgpool2d_forward(y, x, nc, h, w, k, s);
        return;
    }
    int oh = (h - k) / s + 1, ow = (w - k) / s + 1;
    for (int p = 0; p < nc; p++) {
        const float *xp = x + (size_t)p * h * w;
        float *yp = y + (size_t)p * oh * ow;
        for (int oy = 0; oy < oh; oy++)
            for (int ox = 0; ox < ow; ox++) yp[oy * ow + ox] = mg__pool_mean(xp, w, k, s, oy, ox);
    }
}

void mg_avgpool2d_backward(float *dx, const float *dy, int nc, int h, int w, int k, int s)
{
    if (mg__dk_cur) {
        mg_dk_avgpool2d_backward(dx, dy, nc, h, w, k, s);
        return;
    }
    int oh = (h - k) / s + 1, ow = (w - k) / s + 1;
    float inv = 1.0f / (float)(k * k);
    memset(dx, 0, sizeof(float) * (size_t)nc * h * w);
    for (int p = 0; p < nc; p++) {
        float *xp = dx + (size_t)p * h * w;
        const float *yp = dy + (size_t)p * oh * ow;
        for (int oy = 0; oy < oh; oy++)
            for (int ox = 0; ox < ow; ox++) {
                float g = yp[oy * ow + ox] * inv;
                for (int i = 0; i < k; i++)
                    for (int j = 0; j < k; j++) xp[(oy * s + i) * w + ox * s + j] += g;
            }
    }
}

void mg_maxpool2d_forward(float *y, int32_t *arg, const float *x, int nc, int h, int w,
                          int k, int s)
{
    if (mg__dk_cur) {
        mg_dk_maxpool2d_forward(y, arg, x, nc, h, w, k, s);
        return;
    }
    int oh = (h - k) / s + 1, ow = (w - k) / s + 1;
    for (int p = 0; p < nc; p++) {
        const float *xp = x + (size_t)p * h * w;
        float *yp = y + (size_t)p * oh * ow;
        int32_t *ap = arg + (size_t)p * oh * ow;
        for (int oy = 0; oy < oh; oy++)
            for (int ox = 0; ox < ow; ox++)
                yp[oy * ow + ox] = mg__pool_max(xp, w, k, s, oy, ox, &ap[oy * ow + ox]);
    }
}

void mg_maxpool2d_backward(float *dx, const float *dy, const int32_t *arg, int nc,
                           int h, int w, int k, int s)
{
    if (mg__dk_cur) {
        mg_dk_maxpool2d_backward(dx, dy, arg, nc, h, w, k, s);
        return;
    }
    int oh = (h - k) / s + 1, ow = (w - k) / s + 1;
    memset(dx, 0, sizeof(float) * (size_t)nc * h * w);
    for (int p = 0; p < nc; p++) {
        float *xp = dx + (size_t)p * h * w;
        const float *yp = dy + (size_t)p * oh * ow;
        const int32_t *ap = arg + (size_t)p * oh * ow;
        for (int q = 0; q < oh * ow; q++) xp[ap[q]] += yp[q];
    }
}
