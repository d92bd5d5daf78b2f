/* Store internals: the key-value table both store kinds keep, the
 * client vtable behind the public mg_store, and the helpers rendezvous
 * builds on (barriers, waits for any of several keys). */
#ifndef MG_COMM_STORE_H
#define MG_COMM_STORE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
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

/* ---- the TCP store protocol (tcp_store.c): pure functions, no I/O ---- */
#define MG__STORE_HDR 24
typedef struct mg__store_req {
    uint8_t op, flags;
    uint32_t klen, vlen;
    int64_t arg;
} mg__store_req;
typedef struct mg__store_reply {
    uint8_t status;
    const void *val;          /* points into the table until it changes */
    size_t vlen;
    int64_t arg;
} mg__store_reply;
/* Validate a request header: 0, or -1 if the request must be refused. */
int mg__store_parse_hdr(const uint8_t h[MG__STORE_HDR], mg__store_req *r);
/* Apply a request whose body (key then value, klen + vlen bytes) is
 * complete: 1 answered (*out set), 0 a GET or WAIT whose keys are not all
 * there yet (answered with a timeout when expired), -1 malformed. */
int mg__store_apply(mg__kv *kv, const mg__store_req *r, const uint8_t *body, bool expired,
                    mg__store_reply *out);

/* ---- clients ---- */
typedef struct mg__store_vt {
    /* within: how long the reply may take (a TCP store that stopped
     * answering must not hold a failing rank up). */
    mg_status (*set)(void *impl, const char *key, const void *val, size_t n, double within);
    /* Waits up to timeout for the key, then up to within for the reply. */
    mg_status (*get)(void *impl, const char *key, double timeout, double within, void **val,
                     size_t *n);
    mg_status (*add)(void *impl, const char *key, int64_t delta, int64_t *out);
    /* any: done when one key exists (*index = which); else when all do. */
    mg_status (*wait)(void *impl, const char *const *keys, int n, int any, double timeout,
                      int *index);
    mg_status (*del)(void *impl, const char *key, int *existed);
    void (*close)(void *impl);
    /* This end's address as the store sees it (NULL: not a network store). */
    mg_status (*local_addr)(void *impl, char *buf, size_t n);
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
mg_status mg__file_store_open(const char *path, const char *secret, double timeout,
                              mg_store *s);

mg_store *mg__store_ref(mg_store *s);
/* Wait until one of keys exists; *index = which. */
mg_status mg__store_wait_any(mg_store *s, const char *const *keys, int n, double timeout,
                             int *index);
/* Best-effort set and get for failure paths: they give up after about
 * `seconds` even if the store is busy with another thread or unreachable. */
mg_status mg__store_set_quick(mg_store *s, const char *key, const void *val, size_t n,
                              double seconds);
mg_status mg__store_get_quick(mg_store *s, const char *key, double seconds, void **val,
                              size_t *n);
/* Every one of n participants calls it with the same key: returns when
 * all have, or MG_ETIMEOUT. */
mg_status mg__store_barrier(mg_store *s, const char *key, int n, double timeout);
/* An address of this host that peers can reach: the one this process
 * uses to reach a TCP store, else the host name's, else loopback. */
void mg__store_local_addr(mg_store *s, char *buf, size_t n);
/* Split "tcp://host:port"; host gets at most hn bytes. */
mg_status mg__parse_tcp_url(const char *url, char *host, size_t hn, int *port);

#endif
