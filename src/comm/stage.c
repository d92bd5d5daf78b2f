/* Operations on device memory (device.h), staged through host memory as
 * gloo does with CUDA tensors and a CUDA-aware MPI does with GPU buffers
 * it cannot reach directly.
 *
 * When a call is issued, the buffers it uses that lie in a device's
 * memory are found (mg_device_of), those it reads are copied to one host
 * allocation, and the call is pointed there. A send buffer that overlaps
 * the receive buffer (in place, or ZeRO's piece inside its bucket) is
 * staged as one span, so the overlap survives. After the call has run, on
 * whichever thread ran it, what it wrote goes back to the device, and only
 * then is its work complete (mg_work_test and mg_work_wait mean the
 * result is in device memory). Backends and algorithms never see device
 * memory.
 *
 * The host memory of a GPU's staging is page-locked (its copies run at
 * the bus's speed), which costs milliseconds to get; so the buffers of
 * finished calls are kept for the next, which a training step makes with
 * the same sizes every step. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include "comm/backend.h"
#include "comm/call.h"
#include "multigrad/device.h"

typedef struct {
    char *p;
    size_t bytes;
    mg_device dev;   /* whose copies it serves (mg_device_host_alloc) */
} hbuf;

struct mg__stage {
    mg_device dev;
    hbuf host;
    void *out;              /* the device memory the call writes; NULL: none */
    size_t out_at, out_bytes;   /* where its bytes are in host */
};

static const mg_device cpu = {MG_DEVICE_CPU, 0};

static bool on_device(mg_device d) { return d.kind != MG_DEVICE_CPU; }
static bool same(mg_device a, mg_device b) { return a.kind == b.kind && a.index == b.index; }

/* The kept buffers: at most KEEP, KEEP_BYTES in all, process-wide. */
#define KEEP 8
#define KEEP_BYTES ((size_t)512 << 20)
static pthread_mutex_t keep_mu = PTHREAD_MUTEX_INITIALIZER;
static hbuf kept[KEEP];
static int n_kept;
static size_t kept_bytes;

/* The smallest kept buffer of dev's of at least `bytes`, else a new one
 * (p NULL when it cannot be had). */
static hbuf take(mg_device dev, size_t bytes)
{
    pthread_mutex_lock(&keep_mu);
    int best = -1;
    for (int i = 0; i < n_kept; i++)
        if (same(kept[i].dev, dev) && kept[i].bytes >= bytes &&
            (best < 0 || kept[i].bytes < kept[best].bytes))
            best = i;
    if (best >= 0) {
        hbuf h = kept[best];
        kept[best] = kept[--n_kept];
        kept_bytes -= h.bytes;
        pthread_mutex_unlock(&keep_mu);
        return h;
    }
    pthread_mutex_unlock(&keep_mu);
    return (hbuf){mg_device_host_alloc(dev, bytes), bytes, dev};
}

/* h kept for a later call, the smallest kept ones freed to make room. */
static void give(hbuf h)
{
    hbuf out[KEEP + 1];
    int n_out = 0;
    pthread_mutex_lock(&keep_mu);
    if (h.p && h.bytes <= KEEP_BYTES) {
        while (n_kept == KEEP || kept_bytes + h.bytes > KEEP_BYTES) {
            int small = 0;
            for (int i = 1; i < n_kept; i++)
                if (kept[i].bytes < kept[small].bytes) small = i;
            out[n_out++] = kept[small];
            kept_bytes -= kept[small].bytes;
            kept[small] = kept[--n_kept];
        }
        kept[n_kept++] = h;
        kept_bytes += h.bytes;
    } else {
        out[n_out++] = h;
    }
    pthread_mutex_unlock(&keep_mu);
    for (int i = 0; i < n_out; i++) mg_device_host_free(out[i].dev, out[i].p);
}

mg_status mg__stage_in(mg__req *r, int rank, int size)
{
    r->stage = NULL;
    if (r->kind != MG__REQ_CALL) return MG_OK;
    mg_call *c = &r->c;
    size_t sn, rn;
    mg__call_spans(c, rank, size, &sn, &rn);
    const char *s = sn ? c->sendbuf : NULL;
    char *d = rn ? c->recvbuf : NULL;
    mg_device sd = s ? mg_device_of(s) : cpu, rd = d ? mg_device_of(d) : cpu;
    if (!on_device(sd) && !on_device(rd)) return MG_OK;
    const char *name = mg_coll_name(c->coll);
    if (on_device(sd) && on_device(rd) && !same(sd, rd))
        return mg_error(MG_EINVAL, "%s: the send and receive buffers are on different devices; "
                        "give both on one device, or one in host memory", name);
    struct mg__stage *g = calloc(1, sizeof *g);
    if (!g) return mg_error(MG_ENOMEM, "%s: out of memory", name);
    g->dev = on_device(sd) ? sd : rd;
    /* The host layout: one span for overlapping buffers, else the send
     * buffer's bytes, then the receive buffer's (each where on device). */
    const char *lo = NULL;
    size_t bytes, s_at = 0, r_at = 0;
    bool span = on_device(sd) && on_device(rd) && mg__overlaps(s, sn, d, rn);
    if (span) {
        lo = s < d ? s : d;
        const char *hi = s + sn > d + rn ? s + sn : d + rn;
        bytes = (size_t)(hi - lo);
        s_at = (size_t)(s - lo);
        r_at = (size_t)(d - lo);
    } else {
        size_t sb = on_device(sd) ? (sn + MG_ALIGN - 1) / MG_ALIGN * MG_ALIGN : 0;
        r_at = sb;
        bytes = sb + (on_device(rd) ? rn : 0);
    }
    mg_status st = MG_OK;
    g->host = take(g->dev, bytes);
    char *host = g->host.p;
    if (!host)
        st = mg_error(MG_ENOMEM, "%s: cannot allocate %zu bytes of host memory to stage its "
                      "device buffers: %s", name, bytes, mg_last_error());
    if (!st && span) st = mg_device_copy(cpu, host, g->dev, lo, bytes);
    else if (!st && on_device(sd)) st = mg_device_copy(cpu, host, g->dev, s, sn);
    if (st) {
        give(g->host);
        free(g);
        return st;
    }
    if (on_device(rd)) {
        g->out = d;
        g->out_at = r_at;
        g->out_bytes = rn;
        /* A send buffer it does not read but names (broadcast's) follows. */
        if (c->sendbuf == d) c->sendbuf = host + r_at;
        c->recvbuf = host + r_at;
    }
    if (on_device(sd)) {
        /* A receive buffer it does not write but names (reduce's) follows. */
        if (c->recvbuf == s) c->recvbuf = host + s_at;
        c->sendbuf = host + s_at;
    }
    r->stage = g;
    return MG_OK;
}

mg_status mg__stage_out(mg__req *r, bool copy)
{
    struct mg__stage *g = r->stage;
    if (!g) return MG_OK;
    mg_status st = copy && g->out ? mg_device_copy(g->dev, g->out, cpu, g->host.p + g->out_at,
                                                   g->out_bytes)
                                  : MG_OK;
    give(g->host);
    free(g);
    r->stage = NULL;
    return st;
}
