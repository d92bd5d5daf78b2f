/* The public store API (comm.h) over the TCP and file stores, plus the
 * helpers rendezvous uses. A store handle is shared by a group and its
 * sub-groups through a reference count; requests are serialised by a
 * mutex because each client keeps one connection. */
#include <netdb.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include "comm/store/store.h"
#include "multigrad/core.h"

mg_status mg__parse_tcp_url(const char *url, char *host, size_t hn, int *port)
{
    const char *p = url + 6; /* after "tcp://" */
    const char *colon;
    if (*p == '[') { /* [v6]:port */
        const char *close = strchr(p, ']');
        if (!close || close[1] != ':') goto bad;
        if ((size_t)(close - p - 1) >= hn) goto bad;
        memcpy(host, p + 1, (size_t)(close - p - 1));
        host[close - p - 1] = 0;
        colon = close + 1;
    } else {
        colon = strrchr(p, ':');
        if (!colon || colon == p || (size_t)(colon - p) >= hn) goto bad;
        memcpy(host, p, (size_t)(colon - p));
        host[colon - p] = 0;
    }
    char *end;
    long v = strtol(colon + 1, &end, 10);
    if (*end || end == colon + 1 || v < 0 || v > 65535) goto bad;
    *port = (int)v;
    return MG_OK;
bad:
    return mg_error(MG_EINVAL, "init method '%s' is not of the form tcp://host:port", url);
}

mg_status mg_store_connect(const char *url, const char *secret, double timeout, mg_store **out)
{
    *out = NULL;
    if (timeout <= 0) timeout = mg_env_double("MG_TIMEOUT", 300);
    mg_store *s = calloc(1, sizeof *s);
    if (!s) return mg_error(MG_ENOMEM, "store: out of memory");
    mg_status st;
    if (!strncmp(url, "tcp://", 6)) {
        char host[256];
        int port;
        st = mg__parse_tcp_url(url, host, sizeof host, &port);
        if (!st) st = mg__tcp_store_open(host, port, secret, timeout, s);
    } else if (!strncmp(url, "file://", 7)) {
        st = mg__file_store_open(url + 7, secret, timeout, s);
    } else {
        st = mg_error(MG_EINVAL, "store address '%s' is neither tcp://host:port nor "
                      "file:///path", url);
    }
    if (st) {
        free(s);
        return st;
    }
    s->timeout = timeout;
    pthread_mutex_init(&s->mu, NULL);
    atomic_init(&s->refs, 1);
    snprintf(s->url, sizeof s->url, "%s", url);
    *out = s;
    return MG_OK;
}

mg_store *mg__store_ref(mg_store *s)
{
    atomic_fetch_add(&s->refs, 1);
    return s;
}

void mg_store_destroy(mg_store *s)
{
    if (!s || atomic_fetch_sub(&s->refs, 1) != 1) return;
    s->vt->close(s->impl);
    mg_store_server_stop(s->server);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

#define LOCKED(expr)                          \
    do {                                      \
        pthread_mutex_lock(&s->mu);           \
        mg_status mg__r = (expr);             \
        pthread_mutex_unlock(&s->mu);         \
        return mg__r;                         \
    } while (0)

mg_status mg_store_set(mg_store *s, const char *key, const void *val, size_t n)
{
    LOCKED(s->vt->set(s->impl, key, val, n, s->timeout));
}

mg_status mg_store_get(mg_store *s, const char *key, void **val, size_t *n)
{
    *val = NULL;
    *n = 0;
    LOCKED(s->vt->get(s->impl, key, s->timeout, s->timeout, val, n));
}

mg_status mg_store_add(mg_store *s, const char *key, int64_t delta, int64_t *result)
{
    int64_t r;
    pthread_mutex_lock(&s->mu);
    mg_status st = s->vt->add(s->impl, key, delta, &r);
    pthread_mutex_unlock(&s->mu);
    if (!st && result) *result = r;
    return st;
}

mg_status mg_store_wait(mg_store *s, const char *const *keys, int n, double timeout)
{
    int idx;
    LOCKED(s->vt->wait(s->impl, keys, n, 0, timeout < 0 ? s->timeout : timeout, &idx));
}

mg_status mg__store_wait_any(mg_store *s, const char *const *keys, int n, double timeout,
                             int *index)
{
    LOCKED(s->vt->wait(s->impl, keys, n, 1, timeout, index));
}

mg_status mg_store_delete(mg_store *s, const char *key, int *existed)
{
    int e = 0;
    pthread_mutex_lock(&s->mu);
    mg_status st = s->vt->del(s->impl, key, &e);
    pthread_mutex_unlock(&s->mu);
    if (existed) *existed = e;
    return st;
}

static int lock_within(mg_store *s, double seconds)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double t = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec + seconds;
    ts.tv_sec = (time_t)t;
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    return pthread_mutex_timedlock(&s->mu, &ts);
}

mg_status mg__store_set_quick(mg_store *s, const char *key, const void *val, size_t n,
                              double seconds)
{
    if (lock_within(s, seconds)) return mg_error(MG_ETIMEOUT, "store busy");
    mg_status st = s->vt->set(s->impl, key, val, n, seconds);
    pthread_mutex_unlock(&s->mu);
    return st;
}

mg_status mg__store_get_quick(mg_store *s, const char *key, double seconds, void **val,
                              size_t *n)
{
    *val = NULL;
    *n = 0;
    if (lock_within(s, seconds)) return mg_error(MG_ETIMEOUT, "store busy");
    mg_status st = s->vt->get(s->impl, key, seconds, seconds, val, n);
    pthread_mutex_unlock(&s->mu);
    return st;
}

mg_status mg__store_barrier(mg_store *s, const char *key, int n, double timeout)
{
    char cnt[MG_STORE_MAX_KEY], done[MG_STORE_MAX_KEY];
    snprintf(cnt, sizeof cnt, "%s/count", key);
    snprintf(done, sizeof done, "%s/done", key);
    int64_t v;
    MG_TRY(mg_store_add(s, cnt, 1, &v));
    if (v == n) MG_TRY(mg_store_set(s, done, "1", 1));
    const char *keys[1] = {done};
    return mg_store_wait(s, keys, 1, timeout);
}

void mg__store_local_addr(mg_store *s, char *buf, size_t n)
{
    if (s->vt->local_addr && !s->vt->local_addr(s->impl, buf, n)) return;
    snprintf(buf, n, "127.0.0.1");
    char host[256];
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res;
    if (gethostname(host, sizeof host) || getaddrinfo(host, NULL, &hints, &res)) return;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        struct sockaddr_in *in = (struct sockaddr_in *)a->ai_addr;
        if ((ntohl(in->sin_addr.s_addr) >> 24) != 127) {
            inet_ntop(AF_INET, &in->sin_addr, buf, (socklen_t)n);
            break;
        }
    }
    freeaddrinfo(res);
}
