/* Store internals: the key-value table both store kinds keep, the
 * client vtable behind the public mg_store, and the helpers rendezvous
 * builds on (barriers, waits for any of several keys). */
#ifndef MG_COMM_STORE_H
#define MG_COMM_STORE_H

#include <pthread.h>
#include <stdatomic.h>
#include "multigrad/comm.h"

/* Bounds on everything a store accepts: nothing received is trusted. */
#define MG__STORE_MAX_KEYS_WAIT 64
#define MG__STORE_MAX_TOTAL ((size_t)256 << 20)

/* ---- the table ---- */
typedef struct mg__kv_entry {
    struct mg__kv_entry *next;
    uint8_t *val;
    size_t klen, vlen;
    char key[];
} mg__kv_entry;

typedef struct mg__kv {
    mg__kv_entry **b;
    size_t nb, n, bytes;
} mg__kv;

void mg__kv_init(mg__kv *kv);
void mg__kv_free(mg__kv *kv);
mg__kv_entry *mg__kv_find(const mg__kv *kv, const char *key, size_t klen);
/* Copies key and value; MG_ENOMEM past MG__STORE_MAX_TOTAL. */
mg_status mg__kv_set(mg__kv *kv, const char *key, size_t klen, const void *val, size_t vlen);
/* 1 if the key existed. */
int mg__kv_del(mg__kv *kv, const char *key, size_t klen);
/* Integer add on a decimal value (absent = 0). */
mg_status mg__kv_add(mg__kv *kv, const char *key, size_t klen, int64_t delta, int64_t *out);

/* ---- clients ---- */
typedef struct mg__store_vt {
    mg_status (*set)(void *impl, const char *key, const void *val, size_t n);
    mg_status (*get)(void *impl, const char *key, double timeout, void **val, size_t *n);
    mg_status (*add)(void *impl, const char *key, int64_t delta, int64_t *out);
    /* any: done when one key exists (*index = which); else when all do. */
    mg_status (*wait)(void *impl, const char *const *keys, int n, int any, double timeout,
                      int *index);
    mg_status (*del)(void *impl, const char *key, int *existed);
    void (*close)(void *impl);
} mg__store_vt;

struct mg_store {
    const mg__store_vt *vt;
    void *impl;
    double timeout;
    pthread_mutex_t mu;       /* one request at a time per connection */
    atomic_int refs;
    mg_store_server *server;  /* served by this process, stopped with the last ref */
    char url[300];
};

mg_status mg__tcp_store_open(const char *host, int port, const char *secret, double timeout,
                             mg_store *s);
mg_status mg__file_store_open(const char *path, double timeout, mg_store *s);

mg_store *mg__store_ref(mg_store *s);
/* Wait until one of keys exists; *index = which. */
mg_status mg__store_wait_any(mg_store *s, const char *const *keys, int n, double timeout,
                             int *index);
/* Every one of n participants calls it with the same key: returns when
 * all have, or MG_ETIMEOUT. */
mg_status mg__store_barrier(mg_store *s, const char *key, int n, double timeout);
/* Split "tcp://host:port"; host gets at most hn bytes. */
mg_status mg__parse_tcp_url(const char *url, char *host, size_t hn, int *port);

#endif
