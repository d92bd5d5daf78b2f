/* Devices (issue 15): naming them, finding out whether a GPU is there and
 * saying why not, and memory round trips. Without a GPU (CI has none) the
 * GPU's part skips, saying why; the CPU's part always runs. */
#include <string.h>
#include "harness.h"
#include "multigrad/multigrad.h"

TEST(device_names_parse_and_print)
{
    mg_device d;
    char buf[32];
    const char *good[] = {"cpu", "cuda", "cuda:0", "cuda:7"};
    const char *back[] = {"cpu", "cuda:0", "cuda:0", "cuda:7"};
    for (int i = 0; i < 4; i++) {
        CHECK_OK(mg_device_parse(good[i], &d));
        mg_device_format(d, buf, sizeof buf);
        CHECK_MSG(!strcmp(buf, back[i]), "%s -> %s", good[i], buf);
    }
    const char *bad[] = {"gpu", "cuda:", "cuda:-1", "cuda:x", "cuda:1x", "cuda:5000", "", "CPU"};
    for (int i = 0; i < 8; i++) {
        CHECK_ERR(mg_device_parse(bad[i], &d), MG_EINVAL);
        CHECK(strstr(mg_last_error(), "give cpu, cuda or cuda:N"));
    }
    CHECK_ERR(mg_device_parse(NULL, &d), MG_EINVAL);
}

TEST(device_cpu_memory_and_copies)
{
    mg_device cpu = {MG_DEVICE_CPU, 0};
    CHECK_OK(mg_device_check(cpu));
    char name[128];
    size_t mem;
    CHECK_OK(mg_device_describe(cpu, name, sizeof name, &mem));
    CHECK(name[0]);
    float *a = mg_device_alloc(cpu, 4096 * sizeof(float)), *b = mg_device_alloc(cpu, 4096 * 4);
    CHECK(a && b);
    for (int i = 0; i < 4096; i++) CHECK(a[i] == 0);   /* zeroed */
    for (int i = 0; i < 4096; i++) a[i] = (float)i;
    CHECK_OK(mg_device_copy(cpu, b, cpu, a, 4096 * sizeof(float)));
    CHECK(!memcmp(a, b, 4096 * sizeof(float)));
    mg_device_free(cpu, a);
    mg_device_free(cpu, b);
}

/* Asking for a GPU where there is none is one clear error, never a crash
 * later: why (no backend, no driver, no GPU) and what to do. */
TEST(device_cuda_absent_is_one_clear_error)
{
    const char *why;
    int n = mg_device_cuda_count(&why);
    mg_device d = {MG_DEVICE_CUDA, 0};
    if (n > 0) {
        d.index = n;   /* one past the last */
        CHECK_ERR(mg_device_check(d), MG_EINVAL);
        CHECK(strstr(mg_last_error(), "this machine has"));
        mgt_skip("%d GPU(s) here: the no-GPU path is for machines without one", n);
    }
    printf("built with CUDA: %s; no GPU: %s\n", mg_device_cuda_built() ? "yes" : "no", why);
    CHECK(why && why[0]);
    CHECK_ERR(mg_device_check(d), MG_EUNSUPPORTED);
    CHECK(strstr(mg_last_error(), "cuda:0") && strstr(mg_last_error(), "--device cpu"));
    CHECK(mg_device_alloc(d, 64) == NULL);
    float x = 1;
    mg_device cpu = {MG_DEVICE_CPU, 0};
    CHECK_ERR(mg_device_copy(d, &x, cpu, &x, sizeof x), MG_EUNSUPPORTED);
}

/* On a GPU: zeroed memory, and bytes that go there and back (host to
 * device, device to device, device to host) unchanged. */
TEST(device_cuda_memory_round_trip)
{
    const char *why;
    int n = mg_device_cuda_count(&why);
    if (!n) mgt_skip("no GPU: %s", why);
    mg_device gpu = {MG_DEVICE_CUDA, 0}, cpu = {MG_DEVICE_CPU, 0};
    char name[256];
    size_t mem;
    CHECK_OK(mg_device_describe(gpu, name, sizeof name, &mem));
    printf("cuda:0: %s, %.1f GB\n", name, mem / 1e9);
    size_t count = (size_t)3 << 20;
    float *h = malloc(count * sizeof *h), *back = malloc(count * sizeof *back);
    CHECK(h && back);
    for (size_t i = 0; i < count; i++) h[i] = (float)i * 0.5f;
    float *d1 = mg_device_alloc(gpu, count * sizeof(float));
    float *d2 = mg_device_alloc(gpu, count * sizeof(float));
    CHECK(d1 && d2);
    CHECK_OK(mg_device_copy(cpu, back, gpu, d1, count * sizeof(float)));
    for (size_t i = 0; i < count; i++) CHECK(back[i] == 0);
    CHECK_OK(mg_device_copy(gpu, d1, cpu, h, count * sizeof(float)));
    CHECK_OK(mg_device_copy(gpu, d2, gpu, d1, count * sizeof(float)));
    CHECK_OK(mg_device_copy(cpu, back, gpu, d2, count * sizeof(float)));
    CHECK(!memcmp(h, back, count * sizeof(float)));
    mg_device_free(gpu, d1);
    mg_device_free(gpu, d2);
    free(h);
    free(back);
}
