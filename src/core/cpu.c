/* What CPU this is and which SIMD level it offers, from CPUID and what the
 * operating system enabled (XGETBV). The decoding is a pure function of the
 * registers (mg_cpu_decode), so recorded register sets of other CPUs test
 * it on any machine. A level counts only when the OS saves its registers:
 * an AVX-512 CPU whose kernel leaves the ZMM state off is an AVX2 CPU.
 * Non-x86 builds report MG_SIMD_NONE and the model from nowhere. */
#include <stdio.h>
#include <string.h>
#include <pthread.h>
#include "multigrad/core.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define MG__X86 1
#endif

const char *mg_simd_name(mg_simd s)
{
    switch (s) {
    case MG_SIMD_SSE: return "SSE";
    case MG_SIMD_AVX: return "AVX";
    case MG_SIMD_AVX2: return "AVX2+FMA";
    case MG_SIMD_AVX512: return "AVX-512";
    case MG_SIMD_AMX: return "AVX-512+AMX";
    default: return "none";
    }
}

#define BIT(v, n) (((v) >> (n)) & 1u)

void mg_cpu_decode(const mg_cpuid_regs *r, mg_cpu_info *out)
{
    memset(out, 0, sizeof *out);
    snprintf(out->vendor, sizeof out->vendor, "%s", r->vendor);
    /* The brand string is padded with spaces on some CPUs. */
    const char *b = r->brand;
    while (*b == ' ') b++;
    snprintf(out->model, sizeof out->model, "%s", *b ? b : "unknown CPU");
    for (size_t n = strlen(out->model); n > 0 && out->model[n - 1] == ' '; n--)
        out->model[n - 1] = '\0';
    uint32_t a = r->l1_eax, fam = (a >> 8) & 0xf, mod = (a >> 4) & 0xf;
    if (fam == 0xf) fam += (a >> 20) & 0xff;
    if (fam == 0x6 || fam >= 0xf) mod |= ((a >> 16) & 0xf) << 4;
    out->family = (int)fam;
    out->model_id = (int)mod;
    out->stepping = (int)(a & 0xf);
    if (r->max_leaf < 1 || !BIT(r->l1_edx, 26)) return;   /* no SSE2: not x86-64 */
    out->simd = MG_SIMD_SSE;
    /* AVX needs the OS to save the YMM state (XCR0 bits 1-2). */
    bool os_ymm = BIT(r->l1_ecx, 27) && (r->xcr0 & 0x6) == 0x6;
    if (!os_ymm || !BIT(r->l1_ecx, 28)) return;
    out->simd = MG_SIMD_AVX;
    bool leaf7 = r->max_leaf >= 7;
    uint32_t b7 = leaf7 ? r->l7_ebx : 0, d7 = leaf7 ? r->l7_edx : 0;
    if (!BIT(b7, 5) || !BIT(r->l1_ecx, 12)) return;      /* AVX2, FMA */
    out->simd = MG_SIMD_AVX2;
    /* AVX-512 F, BW and VL, with opmask and ZMM state (XCR0 bits 5-7). */
    if (!BIT(b7, 16) || !BIT(b7, 30) || !BIT(b7, 31) || (r->xcr0 & 0xe0) != 0xe0) return;
    out->simd = MG_SIMD_AVX512;
    out->avx512_bf16 = leaf7 && BIT(r->l71_eax, 5);
    /* AMX tiles with BF16, and the tile state (XCR0 bits 17-18). */
    if (BIT(d7, 24) && BIT(d7, 22) && (r->xcr0 & 0x60000) == 0x60000) out->simd = MG_SIMD_AMX;
}

static void read_regs(mg_cpuid_regs *r)
{
    memset(r, 0, sizeof *r);
#ifdef MG__X86
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return;
    r->max_leaf = a;
    memcpy(r->vendor, &b, 4);
    memcpy(r->vendor + 4, &d, 4);
    memcpy(r->vendor + 8, &c, 4);
    __cpuid(1, a, b, c, d);
    r->l1_eax = a;
    r->l1_ecx = c;
    r->l1_edx = d;
    if (r->max_leaf >= 7) {
        __cpuid_count(7, 0, a, b, c, d);
        r->l7_ebx = b;
        r->l7_ecx = c;
        r->l7_edx = d;
        if (a >= 1) {
            __cpuid_count(7, 1, a, b, c, d);
            r->l71_eax = a;
        }
    }
    if (r->l1_ecx >> 27 & 1) {   /* OSXSAVE: XGETBV may be executed */
        uint32_t lo, hi;
        __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        r->xcr0 = (uint64_t)hi << 32 | lo;
    }
    if (__get_cpuid(0x80000000, &a, &b, &c, &d) && a >= 0x80000004) {
        uint32_t w[12];
        for (unsigned i = 0; i < 3; i++)
            __cpuid(0x80000002 + i, w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]);
        memcpy(r->brand, w, 48);
    }
#endif
}

static mg_cpu_info this_cpu;
static pthread_once_t cpu_once = PTHREAD_ONCE_INIT;

static void cpu_init(void)
{
    mg_cpuid_regs r;
    read_regs(&r);
    mg_cpu_decode(&r, &this_cpu);
}

const mg_cpu_info *mg_cpu(void)
{
    pthread_once(&cpu_once, cpu_init);
    return &this_cpu;
}
