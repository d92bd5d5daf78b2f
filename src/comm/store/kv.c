/* The key-value table of a store: chained hashing (FNV-1a), keys and
 * values copied, total size bounded by MG__STORE_MAX_TOTAL so a client
 * cannot exhaust the serving rank's memory. Not thread-safe: the TCP
 * server touches it from its one thread, the file store under a lock. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "comm/store/store.h"

static uint64_t hash(const char *k, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)k[i]) * 1099511628211ull;
    return h;
}

void mg__kv_init(mg__kv *kv)
{
    memset(kv, 0, sizeof *kv);
}

void mg__kv_free(mg__kv *kv)
{
    for (size_t i = 0; i < kv->nb; i++)
        for (mg__kv_entry *e = kv->b[i], *nx; e; e = nx) {
            nx = e->next;
            free(e->val);
            free(e);
        }
    free(kv->b);
    memset(kv, 0, sizeof *kv);
}

mg__kv_entry *mg__kv_find(const mg__kv *kv, const char *key, size_t klen)
{
    if (!kv->nb) return NULL;
    for (mg__kv_entry *e = kv->b[hash(key, klen) & (kv->nb - 1)]; e; e = e->next)
        if (e->klen == klen && !memcmp(e->key, key, klen)) return e;
    return NULL;
}

static int grow(mg__kv *kv)
{
    size_t nb = kv->nb ? kv->nb * 2 : 64;
    mg__kv_entry **b = calloc(nb, sizeof *b);
    if (!b) return -1;
    for (size_t i = 0; i < kv->nb; i++)
        for (mg__kv_entry *e = kv->b[i], *nx; e; e = nx) {
            nx = e->next;
            size_t h = hash(e->key, e->klen) & (nb - 1);
            e->next = b[h];
            b[h] = e;
        }
    free(kv->b);
    kv->b = b;
    kv->nb = nb;
    return 0;
}

mg_status mg__kv_set(mg__kv *kv, const char *key, size_t klen, const void *val, size_t vlen)
{
    mg__kv_entry *e = mg__kv_find(kv, key, klen);
    size_t old = e ? e->vlen : 0, add = e ? 0 : klen + sizeof *e;
    if (kv->bytes - old + vlen + add > MG__STORE_MAX_TOTAL)
        return mg_error(MG_ENOMEM, "store is full (%zu MiB): too much data stored",
                        MG__STORE_MAX_TOTAL >> 20);
    uint8_t *v = malloc(vlen ? vlen : 1);
    if (!v) return mg_error(MG_ENOMEM, "store: out of memory");
    if (vlen) memcpy(v, val, vlen);
    if (e) {
        free(e->val);
        e->val = v;
        e->vlen = vlen;
        kv->bytes = kv->bytes - old + vlen;
        return MG_OK;
    }
    if (kv->n + 1 > kv->nb && grow(kv)) {
        free(v);
        return mg_error(MG_ENOMEM, "store: out of memory");
    }
    e = malloc(sizeof *e + klen + 1);
    if (!e) {
        free(v);
        return mg_error(MG_ENOMEM, "store: out of memory");
    }
    memcpy(e->key, key, klen);
    e->key[klen] = 0;
    e->klen = klen;
    e->val = v;
    e->vlen = vlen;
    size_t h = hash(key, klen) & (kv->nb - 1);
    e->next = kv->b[h];
    kv->b[h] = e;
    kv->n++;
    kv->bytes += vlen + add;
    return MG_OK;
}

int mg__kv_del(mg__kv *kv, const char *key, size_t klen)
{
    if (!kv->nb) return 0;
    mg__kv_entry **pp = &kv->b[hash(key, klen) & (kv->nb - 1)];
    for (; *pp; pp = &(*pp)->next) {
        mg__kv_entry *e = *pp;
        if (e->klen == klen && !memcmp(e->key, key, klen)) {
            *pp = e->next;
            kv->bytes -= e->vlen + e->klen + sizeof *e;
            kv->n--;
            free(e->val);
            free(e);
            return 1;
        }
    }
    return 0;
}

mg_status mg__kv_add(mg__kv *kv, const char *key, size_t klen, int64_t delta, int64_t *out)
{
    int64_t v = 0;
    mg__kv_entry *e = mg__kv_find(kv, key, klen);
    if (e) {
        char buf[32];
        if (e->vlen == 0 || e->vlen >= sizeof buf)
            return mg_error(MG_EFORMAT, "store: add on key '%.*s' whose value is not an integer",
                            (int)klen, key);
        memcpy(buf, e->val, e->vlen);
        buf[e->vlen] = 0;
        char *end;
        long long x = strtoll(buf, &end, 10);
        if (*end)
            return mg_error(MG_EFORMAT, "store: add on key '%.*s' whose value is not an integer",
                            (int)klen, key);
        v = x;
    }
    /* Wrap like two's complement instead of overflowing (undefined in C). */
    v = (int64_t)((uint64_t)v + (uint64_t)delta);
    char s[32];
    int n = snprintf(s, sizeof s, "%" PRId64, v);
    MG_TRY(mg__kv_set(kv, key, klen, s, (size_t)n));
    *out = v;
    return MG_OK;
}
