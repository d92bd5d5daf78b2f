/* The builtin backend: rendezvous through the store, transports chosen
 * per peer, collectives through src/comm/coll, split, group memory,
 * failure notices and an orderly teardown.
 *
 * Rendezvous (prefix P: "w" for the world, "w.<k>" for this process's
 * k-th world group after the first, P/s<k>/c<color> for splits, P/x<k>
 * for exclusions; MG_RUN_ID after the w, an mgrun restart's):
 * every rank publishes P/info/<rank> (world size, pid, host identity,
 * listening address); rank 0 reads them all, checks that they agree and
 * publishes the table (P/table) — or, when they do not, the reason
 * (P/error), which every waiting rank reports. Ranks on the same host
 * (same boot id and the same pid, mount and IPC namespaces) talk through
 * shared memory unless MG_TRANSPORT=tcp; the others over authenticated
 * TCP connections. Each rank's record carries its MG_SHM_TAG, which names
 * its segments: ranks of one host started by different launchers (two
 * mgrun --nnodes on one host) have different tags, and each launcher
 * removes the names of its own ranks. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <openssl/rand.h>
#include "comm/builtin.h"
#include "comm/call.h"
#include "comm/coll/algos.h"
#include "comm/store/auth.h"
#include "comm/transport/sock.h"
#include "multigrad/core.h"
#include "core/strbuf.h"

#define INFO_MAGIC 0x4f464e49u
#define INFO_VERSION 3u
#define KEYLEN (MG_STORE_MAX_KEY + 1)

static double left(double deadline)
{
    double l = deadline - mg_now();
    return l > 0.001 ? l : 0.001;
}

static void host_identity(char *key, size_t kn, char *host, size_t hn)
{
    char boot[64] = "noboot";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof boot, f)) strcpy(boot, "noboot");
        fclose(f);
        boot[strcspn(boot, "\n")] = 0;
    }
    unsigned long long ns[3] = {0, 0, 0};
    const char *names[3] = {"/proc/self/ns/pid", "/proc/self/ns/mnt", "/proc/self/ns/ipc"};
    for (int i = 0; i < 3; i++) {
        struct stat st;
        if (!stat(names[i], &st)) ns[i] = (unsigned long long)st.st_ino;
    }
    snprintf(key, kn, "%s/%llu/%llu/%llu", boot, ns[0], ns[1], ns[2]);
    if (gethostname(host, hn)) snprintf(host, hn, "?");
    host[hn - 1] = 0;
}

/* A shared-memory tag: up to MG__SHM_TAG_MAX letters and digits. */
static bool tag_ok(const char *t, size_t cap)
{
    const char *end = memchr(t, 0, cap);
    return end && end - t <= MG__SHM_TAG_MAX &&
           strspn(t, "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ") ==
               (size_t)(end - t);
}

static mg_status key_fmt(char *buf, size_t n, const char *prefix, const char *what, int i)
{
    int k = i >= 0 ? snprintf(buf, n, "%s/%s/%d", prefix, what, i)
                   : snprintf(buf, n, "%s/%s", prefix, what);
    if (k < 0 || (size_t)k >= n || k > MG_STORE_MAX_KEY)
        return mg_error(MG_EINVAL, "store key for '%s' too long (deeply nested split?)", what);
    return MG_OK;
}

/* ---- rendezvous ----------------------------------------------------------- */

/* Rank 0 publishes why the group cannot form; the others report it. */
static mg_status publish_error(mg__bi *b, mg_status code)
{
    char key[KEYLEN], msg[1024];
    snprintf(msg, sizeof msg, "%s", mg_last_error());
    if (!key_fmt(key, sizeof key, b->prefix, "error", -1))
        (void)mg_store_set(b->store, key, msg, strlen(msg));
    return mg_error(code, "%s", msg);
}

static const char *const shm_size_names[3] = {"MG_SHM_CHUNK", "MG_SHM_RING_KB",
                                               "MG_SHM_SLOT_KB"};

static mg_status gather_table(mg__bi *b, int size, const mg__rinfo *me, double deadline,
                              mg__rinfo *table)
{
    char key[KEYLEN];
    table[0] = *me;
    for (int r = 1; r < size; r++) {
        MG_TRY(key_fmt(key, sizeof key, b->prefix, "info", r));
        const char *keys[1] = {key};
        mg_status st = mg_store_wait(b->store, keys, 1, left(deadline));
        if (st == MG_ETIMEOUT) {
            char missing[200] = "", me_[128];
            size_t m = 0;
            for (int q = r; q < size && m + 12 < sizeof missing; q++) {
                char k2[300];
                key_fmt(k2, sizeof k2, b->prefix, "info", q);
                const char *kk[1] = {k2};
                if (mg_store_wait(b->store, kk, 1, 0.001) == MG_ETIMEOUT)
                    m = mg__catf(missing, sizeof missing, m, " %d",
                                 mg__world_rank(&b->g->names, q));
            }
            mg_error(MG_ETIMEOUT, "%s: timed out after %.1f s waiting for rank(s)%s of %d "
                     "to join: are they running, with the same MASTER_ADDR, MASTER_PORT and "
                     "WORLD_SIZE?", mg__rank_name(&b->g->names, 0, NULL, me_, sizeof me_),
                     b->g->timeout, missing, size);
            return publish_error(b, MG_ETIMEOUT);
        }
        if (st) return st;
        void *v;
        size_t n;
        MG_TRY(mg_store_get(b->store, key, &v, &n));
        mg__rinfo in;
        bool ok = n == sizeof in;
        if (ok) memcpy(&in, v, sizeof in);
        free(v);
        if (!ok || in.magic != INFO_MAGIC || in.version != INFO_VERSION || in.rank != r ||
            !tag_ok(in.shm_tag, sizeof in.shm_tag)) {
            mg_error(MG_EFORMAT, "rank %d's rendezvous record is malformed (another multigrad "
                     "version?)", r);
            return publish_error(b, MG_EFORMAT);
        }
        if (in.size != size) {
            mg_error(MG_EMISMATCH, "ranks disagree on the world size: rank %d has WORLD_SIZE=%d "
                     "but rank 0 has %d; give every rank the same WORLD_SIZE", r, in.size, size);
            return publish_error(b, MG_EMISMATCH);
        }
        /* Ranks with other shared-memory sizes read each other's chunks at
         * the wrong places (MG_SHM_CHUNK: silently, found by a probe) or map
         * segments of another size: one check here, before any is made. */
        for (int k = 0; k < 3; k++)
            if (in.shm_size[k] != me->shm_size[k]) {
                mg_error(MG_EMISMATCH, "rank %d has %s=%d but rank 0 has %d (0: the built-in "
                         "size); give every rank the same", r, shm_size_names[k],
                         (int)in.shm_size[k], (int)me->shm_size[k]);
                return publish_error(b, MG_EMISMATCH);
            }
        table[r] = in;
    }
    MG_TRY(key_fmt(key, sizeof key, b->prefix, "table", -1));
    return mg_store_set(b->store, key, table, sizeof *table * (size_t)size);
}

static mg_status fetch_table(mg__bi *b, int rank, int size, const mg__rinfo *me,
                             double deadline, mg__rinfo *table)
{
    char tk[KEYLEN], ek[KEYLEN];
    MG_TRY(key_fmt(tk, sizeof tk, b->prefix, "table", -1));
    MG_TRY(key_fmt(ek, sizeof ek, b->prefix, "error", -1));
    const char *keys[2] = {tk, ek};
    int which;
    mg_status st = mg__store_wait_any(b->store, keys, 2, left(deadline), &which);
    char me_[128], r0[128];
    if (st == MG_ETIMEOUT)
        return mg_error(MG_ETIMEOUT, "%s: timed out after %.1f s waiting for the group to form: "
                        "%s is waiting for other ranks, or WORLD_SIZE differs between ranks",
                        mg__rank_name(&b->g->names, rank, NULL, me_, sizeof me_), b->g->timeout,
                        mg__rank_name(&b->g->names, 0, NULL, r0, sizeof r0));
    if (st) return st;
    void *v;
    size_t n;
    if (which == 1) {
        MG_TRY(mg_store_get(b->store, ek, &v, &n));
        char ack[KEYLEN];
        if (!key_fmt(ack, sizeof ack, b->prefix, "error-seen", -1))
            (void)mg_store_add(b->store, ack, 1, NULL);
        st = mg_error(MG_EMISMATCH, "the group cannot form; rank 0 reports: %s", (char *)v);
        free(v);
        return st;
    }
    MG_TRY(mg_store_get(b->store, tk, &v, &n));
    if (n % sizeof *table || n == 0) {
        free(v);
        return mg_error(MG_EFORMAT, "the rendezvous table is malformed");
    }
    int other = (int)(n / sizeof *table);
    if (other != size) {
        free(v);
        return mg_error(MG_EMISMATCH, "ranks disagree on the world size: this rank (%d) has "
                        "WORLD_SIZE=%d but rank 0 has %d; give every rank the same WORLD_SIZE",
                        rank, size, other);
    }
    memcpy(table, v, n);
    free(v);
    if (table[rank].pid != me->pid || table[rank].start != me->start ||
        strcmp(table[rank].hostkey, me->hostkey))
        return mg_error(MG_EMISMATCH, "two processes were started as rank %d: give each rank a "
                        "different RANK", rank);
    return MG_OK;
}

/* Rendezvous and transports for b->g as (rank, size). */
static mg_status join(mg__bi *b, int rank, int size, int env_lr, int env_ls, double deadline)
{
    mg_group *g = b->g;
    mg__rinfo me = {.magic = INFO_MAGIC, .version = INFO_VERSION, .rank = rank, .size = size,
                    .pid = (int32_t)getpid(), .force_tcp = b->force_tcp,
                    .env_local_rank = env_lr, .env_local_size = env_ls,
                    /* the chunk as the collectives cut by it (read once, at least
                     * 4096), the ring and slot as the transport below sizes them */
                    .shm_size = {(int32_t)mg__shm_chunk_cap(),
                                 (int32_t)mg_env_long("MG_SHM_RING_KB", 0),
                                 (int32_t)mg_env_long("MG_SHM_SLOT_KB", 0)}};
    me.start = mg__proc_starttime(getpid());
    strcpy(me.shm_tag, b->shm_tag);
    if (RAND_bytes((unsigned char *)&me.gid, sizeof me.gid) != 1)
        return mg_error(MG_EIO, "RAND_bytes failed");
    host_identity(me.hostkey, sizeof me.hostkey, me.host, sizeof me.host);
    mg__store_local_addr(b->store, me.addr, sizeof me.addr);
    mg__tcp_listener lis = {.fd = -1};
    if (size > 1) MG_TRY(mg__tcp_listen(me.addr, &lis));
    me.port = lis.port;
    char key[KEYLEN];
    mg_status st = key_fmt(key, sizeof key, b->prefix, "info", rank);
    if (!st) st = mg_store_set(b->store, key, &me, sizeof me);
    b->info = calloc((size_t)size, sizeof *b->info);
    if (!b->info) st = mg_error(MG_ENOMEM, "rendezvous: out of memory");
    if (!st) st = rank == 0 ? gather_table(b, size, &me, deadline, b->info)
                            : fetch_table(b, rank, size, &me, deadline, b->info);
    if (st && rank == 0) {
        /* Linger briefly so the others can read why (rank 0 serves the store). */
        char ack[KEYLEN], msg[1024];
        snprintf(msg, sizeof msg, "%s", mg_last_error());
        int64_t seen = 0;
        double until = mg_now() + (left(deadline) < 2 ? left(deadline) : 2);
        if (!key_fmt(ack, sizeof ack, b->prefix, "error-seen", -1))
            while (mg_now() < until && !mg_store_add(b->store, ack, 0, &seen) && seen < size - 1)
                usleep(20000);
        mg_error(st, "%s", msg);
    }
    if (st) {
        mg__tcp_listener_close(&lis);
        return st;
    }
    b->gid = b->info[0].gid;
    bool *local = calloc((size_t)size, sizeof *local), *need = calloc((size_t)size, sizeof *need);
    int *fds = calloc((size_t)size, sizeof *fds), *ports = calloc((size_t)size, sizeof *ports);
    char (*addr)[64] = calloc((size_t)size, sizeof *addr);
    char (*tags)[MG__SHM_TAG_MAX + 1] = calloc((size_t)size, sizeof *tags);
    pid_t *pids = calloc((size_t)size, sizeof *pids);
    uint64_t *starts = calloc((size_t)size, sizeof *starts);
    b->link = calloc((size_t)size, sizeof *b->link);
    if (!local || !need || !fds || !ports || !addr || !tags || !pids || !starts || !b->link)
        st = mg_error(MG_ENOMEM, "rendezvous: out of memory");
    int nlocal = 0, nhost = 0, lrank = 0, any_tcp = 0;
    bool tcp_any = false;
    for (int r = 0; !st && r < size; r++) tcp_any = tcp_any || b->info[r].force_tcp;
    for (int r = 0; !st && r < size; r++) {
        bool same = !strcmp(b->info[r].hostkey, me.hostkey);
        if (same && r < rank) lrank++;
        nhost += same;
        local[r] = same && !tcp_any;
        nlocal += local[r];
        need[r] = !local[r] && r != rank;
        any_tcp += need[r];
        memcpy(addr[r], b->info[r].addr, 64);
        addr[r][63] = 0;
        ports[r] = b->info[r].port;
        memcpy(tags[r], b->info[r].shm_tag, sizeof tags[r]);
        tags[r][MG__SHM_TAG_MAX] = 0;
        pids[r] = b->info[r].pid;
        starts[r] = same ? b->info[r].start : 0;
        char who[128];
        if (need[r] && !*b->secret && !mg__host_is_loopback(addr[r]))
            st = mg_error(MG_EAUTH, "%s is on another host (%s) and MG_JOB_SECRET is not set: "
                          "set the same MG_JOB_SECRET on every rank",
                          mg__rank_name(&g->names, r, NULL, who, sizeof who), b->info[r].host);
    }
    g->local_rank = env_lr >= 0 ? env_lr : lrank;
    g->local_size = env_ls >= 1 ? env_ls : nhost;
    /* Spin only while every rank of the job on this host has a core: a
     * sub-group's ranks share the host with the rest of the job. */
    if (nhost > b->host_ranks) b->host_ranks = nhost;
    if (env_ls > b->host_ranks) b->host_ranks = env_ls;
    b->spin = mg__spin_default(b->host_ranks);
    /* Shared memory: create, everyone maps everyone, then drop the names. */
    if (!st && nlocal > 1) {
        long rk = me.shm_size[1], sk = me.shm_size[2];   /* as every rank has them */
        size_t ring = rk > 0 ? (size_t)rk << 10 : ((size_t)32 << 20) / (size_t)(nlocal - 1);
        if (rk <= 0) ring = ring < ((size_t)256 << 10) ? (size_t)256 << 10
                          : ring > ((size_t)4 << 20) ? (size_t)4 << 20 : ring;
        size_t slot = sk > 0 ? (size_t)sk << 10 : MG__SHM_SLOT_BYTES;
        if (slot < MG__SHM_SLOT_MIN) slot = MG__SHM_SLOT_MIN;
        mg__shm_transport_cfg cfg = {.gid = b->gid, .rank = rank, .size = size, .local = local,
                                     .all_local = nlocal == size, .ring_bytes = ring,
                                     .slot_bytes = slot, .spin = b->spin, .pid = pids,
                                     .start = starts, .peer_timeout = b->peer_timeout,
                                     .tags = tags, .names = &g->names};
        st = mg__shm_transport_create(&cfg, &b->shm_transport);
    }
    char bk[KEYLEN];
    if (!st) st = key_fmt(bk, sizeof bk, b->prefix, "shm-created", -1);
    if (!st) st = mg__store_barrier(b->store, bk, size, left(deadline));
    if (!st && b->shm_transport) st = mg__shm_transport_attach(b->shm_transport);
    if (!st) st = key_fmt(bk, sizeof bk, b->prefix, "shm-mapped", -1);
    if (!st) st = mg__store_barrier(b->store, bk, size, left(deadline));
    if (b->shm_transport) mg__shm_transport_unlink(b->shm_transport);
    if (!st && any_tcp)
        st = mg__tcp_connect_peers(&lis, &g->names, b->gid, rank, size, need, addr, ports,
                                   b->secret, deadline, fds);
    mg__tcp_listener_close(&lis);
    for (int r = 0; !st && r < size; r++) {
        mg__link *l = &b->link[r];
        if (local[r] && r != rank) mg__shm_transport_chan(b->shm_transport, r, &l->ch);
        else if (need[r]) mg__tcp_chan(fds[r], r, b->peer_timeout, &l->ch);
        else l->ch = (mg__chan){.kind = MG__CH_NONE, .peer = r, .fd = -1};
        l->ch.names = &g->names;
    }
    if (st && b->link && fds)
        for (int r = 0; r < size; r++)
            if (need[r] && fds[r] > 0) close(fds[r]);
    if (!st) {
        mg__p2p_init(b);
        b->p2p.shm = mg__shm_transport_view(b->shm_transport);
        b->beat_s = g->tick_s = mg__beat_period(b->peer_timeout);
    }
    free(local);
    free(need);
    free(fds);
    free(ports);
    free(addr);
    free(tags);
    free(pids);
    free(starts);
    return st;
}

/* ---- init ------------------------------------------------------------------ */

static mg_status parse_port(const char *s, int *port)
{
    char *end;
    long v = s ? strtol(s, &end, 10) : -1;
    if (!s || !*s || *end || v < 1 || v > 65535)
        return mg_error(MG_EINVAL, "MASTER_PORT='%s' is not a port number (1-65535)", s ? s : "");
    *port = (int)v;
    return MG_OK;
}

/* The store: at MASTER_ADDR:MASTER_PORT (env://) or the init method's
 * address, served by rank 0. When a launcher serves it (MG_STORE_PORT set:
 * mgrun, which leaves MASTER_PORT to programs that serve a rendezvous of
 * their own there), rank 0 serves none and env:// finds it at
 * MASTER_ADDR:MG_STORE_PORT. */
static mg_status open_store(mg__bi *b, const mg_group_options *opt, int rank, double deadline)
{
    const char *im = opt->init_method ? opt->init_method : "env://";
    char url[600], host[256];
    int port, served = (int)mg_env_long("MG_STORE_PORT", 0);
    if (!strcmp(im, "env://")) {
        const char *a = mg_env_other("MASTER_ADDR");
        if (!a || !*a)
            return mg_error(MG_EINVAL, "MASTER_ADDR is not set: start the ranks with a launcher "
                            "(mgrun, torchrun) or give an init method tcp://host:port");
        if (served) port = served;
        else MG_TRY(parse_port(mg_env_other("MASTER_PORT"), &port));
        snprintf(host, sizeof host, "%s", a);
    } else if (!strncmp(im, "tcp://", 6)) {
        MG_TRY(mg__parse_tcp_url(im, host, sizeof host, &port));
        if (port < 1)
            return mg_error(MG_EINVAL, "init method '%s': port 0 is not allowed: give the port "
                            "rank 0 serves (one process alone: file:///PATH)", im);
    } else if (!strncmp(im, "file://", 7)) {
        MG_TRY(mg_store_connect(im, b->secret, left(deadline), &b->store));
        b->store->timeout = b->g->timeout;
        return MG_OK;
    } else {
        return mg_error(MG_EINVAL, "init method '%s' is none of env://, tcp://host:port, "
                        "file:///path", im);
    }
    if (!*b->secret && !mg__host_is_loopback(host))
        return mg_error(MG_EAUTH, "the master address %s is not a loopback address and "
                        "MG_JOB_SECRET is not set: set the same MG_JOB_SECRET on every rank (mgrun "
                        "does this)", host);
    mg_store_server *srv = NULL;
    if (rank == 0 && !served) {
        mg_status st = mg_store_server_start(mg__host_is_loopback(host) ? host : NULL, port,
                                             b->secret, &srv);
        if (st) {
            char m[1024];
            snprintf(m, sizeof m, "%s", mg_last_error());
            return mg_error(st, "rank 0 cannot serve the rendezvous store: %s", m);
        }
    }
    if (strchr(host, ':')) snprintf(url, sizeof url, "tcp://[%s]:%d", host, port);
    else snprintf(url, sizeof url, "tcp://%s:%d", host, port);
    mg_status st = mg_store_connect(url, b->secret, left(deadline), &b->store);
    if (st) {
        mg_store_server_stop(srv);
        return st;
    }
    b->store->server = srv;
    b->store->timeout = b->g->timeout;
    return MG_OK;
}

static mg_status bi_init(mg_group *g, const mg_group_options *opt)
{
    mg__bi *b = calloc(1, sizeof *b);
    if (!b) return mg_error(MG_ENOMEM, "group: out of memory");
    g->impl = b;
    b->g = g;
    int rank, size, lr, ls;
    MG_TRY(mg__resolve_ranks(opt, &rank, &size, &lr, &ls));
    g->rank = rank;
    g->size = size;
    const char *sec = mg__secret(opt->secret);
    if (strlen(sec) >= sizeof b->secret)
        return mg_error(MG_EINVAL, "MG_JOB_SECRET is longer than %zu bytes", sizeof b->secret - 1);
    strcpy(b->secret, sec);
    b->force_tcp = !strcmp(mg_env_str("MG_TRANSPORT", "auto"), "tcp");
    b->peer_timeout = mg_env_double("MG_PEER_TIMEOUT", 15);
    const char *tag = mg_env_str("MG_SHM_TAG", "");
    if (!tag_ok(tag, strlen(tag) + 1))
        return mg_error(MG_EINVAL, "MG_SHM_TAG='%s': give up to %d letters and digits (mgrun "
                        "sets it)", tag, MG__SHM_TAG_MAX);
    strcpy(b->shm_tag, tag);
    double deadline = mg_now() + g->timeout;
    MG_TRY(open_store(b, opt, rank, deadline));
    b->world = true;
    /* A group made after another was destroyed meets at keys of its own:
     * at the first one's it would read that group's records (its table,
     * the shared memory it has removed). Every rank makes its world
     * groups in the same order, so the k-th meets the others' k-th. */
    static atomic_int made;
    int k = atomic_fetch_add(&made, 1);
    snprintf(b->prefix, sizeof b->prefix, k ? "w%s.%d" : "w%s", mg_env_str("MG_RUN_ID", ""), k);
    return join(b, rank, size, lr, ls, deadline);
}

/* ---- requests ------------------------------------------------------------------ */

/* "rank 3 (pp 1, dp 1): all_reduce #2 ... failed: why" */
static mg_status fail_with(mg_status st, const char *fmt_prefix, const mg_group *g)
{
    char inner[1024], me[128];
    snprintf(inner, sizeof inner, "%s", mg_last_error());
    return mg_error(st, "%s: %s failed: %s", mg__rank_name(&g->names, g->rank, NULL, me, sizeof me),
                    fmt_prefix, inner);
}

static mg_status run_coll(mg__bi *b, mg__req *r)
{
    mg_call c = r->c;
    int algo = mg__algo_forced();
    if (algo == MG_ALGO_SHM && !b->p2p.shm) {
        if (!b->said_no_shm)
            mg_debug("MG_ALGO=shm: the ranks of this group do not share memory (TCP), so its "
                     "collectives take the cost model's choice");
        b->said_no_shm = true;
        algo = MG_ALGO_AUTO;
    }
    if (algo == MG_ALGO_AUTO) {
        mg_call *k = &b->sel_call;
        if (b->sel_algo && k->coll == c.coll && k->count == c.count && k->dtype == c.dtype &&
            k->op == c.op && k->root == c.root && k->sendbuf == c.sendbuf &&
            k->recvbuf == c.recvbuf) {
            algo = b->sel_algo;
        } else {
            algo = b->sel_algo = mg__coll_select(&b->p2p, &c);
            *k = c;
        }
    }
    mg__fp_make(&b->fp, &c, r->seq, algo);
    b->deadline = b->p2p.deadline = mg__now_coarse() + b->g->timeout;
    if (b->shm_transport) mg__shm_transport_begin(b->shm_transport, &b->fp, b->deadline);
    mg_status st = mg__coll_run(&b->p2p, &c, (mg__algo)algo);
    if (st) {
        char d[200];
        mg__fp_describe(&b->fp, d, sizeof d);
        return fail_with(st, d, b->g);
    }
    return MG_OK;
}

static mg_status sub_group(mg__bi *b, const char *prefix, const int *members, int count,
                           double deadline, const char *what, mg_group **out);

static mg_status split(mg__bi *b, mg__req *r)
{
    mg_group *g = b->g;
    double deadline = mg_now() + g->timeout;
    char ns[KEYLEN], key[KEYLEN];
    int k = snprintf(ns, sizeof ns, "%s/s%d", b->prefix, ++b->nsplit);
    if (k < 0 || (size_t)k + 16 >= sizeof ((mg__bi *)0)->prefix)
        return mg_error(MG_EINVAL, "mg_group_split: sub-groups nested too deeply");
    int32_t mine[2] = {r->color, r->key};
    MG_TRY(key_fmt(key, sizeof key, ns, "r", g->rank));
    MG_TRY(mg_store_set(b->store, key, mine, sizeof mine));
    int32_t (*all)[2] = calloc((size_t)g->size, sizeof *all);
    int *members = malloc(sizeof *members * (size_t)g->size);
    if (!all || !members) {
        free(all);
        free(members);
        return mg_error(MG_ENOMEM, "split: out of memory");
    }
    mg_status st = MG_OK;
    for (int q = 0; !st && q < g->size; q++) {
        void *v;
        size_t n;
        char who[128];
        st = key_fmt(key, sizeof key, ns, "r", q);
        const char *keys[1] = {key};
        if (!st) st = mg_store_wait(b->store, keys, 1, left(deadline));
        if (st == MG_ETIMEOUT)
            st = mg_error(MG_ETIMEOUT, "mg_group_split: %s did not call it within %.1f s",
                          mg__rank_name(&g->names, q, NULL, who, sizeof who), g->timeout);
        if (!st) st = mg_store_get(b->store, key, &v, &n);
        if (!st) {
            if (n == sizeof all[q]) memcpy(all[q], v, n);
            else st = mg_error(MG_EFORMAT, "mg_group_split: malformed record from %s",
                               mg__rank_name(&g->names, q, NULL, who, sizeof who));
            free(v);
        }
    }
    int count = mg__split_members(&all[0][0], g->size, r->color, members);
    free(all);
    char prefix[KEYLEN];
    if (snprintf(prefix, sizeof prefix, "%s/c%d", ns, r->color) >= (int)sizeof prefix)
        MG_ASSERT(!"split prefix fits: checked above");
    if (!st && r->color != MG_UNDEFINED)
        st = sub_group(b, prefix, members, count, deadline, "mg_group_split", r->out_group);
    free(members);
    return st;
}

/* The group of `count` of g's ranks (members, ascending in the new order),
 * met at `prefix` of the store by those ranks alone. */
static mg_status sub_group(mg__bi *b, const char *prefix, const int *members, int count,
                           double deadline, const char *what, mg_group **out)
{
    mg_group *g = b->g;
    int newrank = 0;
    while (newrank < count && members[newrank] != g->rank) newrank++;
    mg_group *sub = mg__group_new(&mg__backend_builtin, g->timeout);
    mg__bi *sb = sub ? calloc(1, sizeof *sb) : NULL;
    mg_status st = !sb ? mg_error(MG_ENOMEM, "%s: out of memory", what)
                       : mg__names_sub(&sub->names, &g->names, members, count);
    if (st) {
        free(sb);
        mg__group_free(sub);
        return st;
    }
    sub->impl = sb;
    sub->rank = newrank;
    sub->size = count;
    sb->g = sub;
    sb->store = mg__store_ref(b->store);
    memcpy(sb->secret, b->secret, sizeof sb->secret);
    sb->force_tcp = b->force_tcp;
    sb->peer_timeout = b->peer_timeout;
    strcpy(sb->shm_tag, b->shm_tag);
    sb->host_ranks = b->host_ranks;
    if (snprintf(sb->prefix, sizeof sb->prefix, "%s", prefix) >= (int)sizeof sb->prefix)
        MG_ASSERT(!"sub-group prefix fits: checked by its maker");
    st = join(sb, newrank, count, -1, -1, deadline);
    if (!st) st = mg__group_start(sub);
    if (st) {
        char m[1024];
        snprintf(m, sizeof m, "%s", mg_last_error());
        mg__group_free(sub);
        return mg_error(st, "%s: %s", what, m);
    }
    *out = sub;
    return MG_OK;
}

/* The group of g's ranks but r->gone, made by them alone: met at
 * P/x<k> (k: this group's exclusions so far, the same on every rank that
 * remains), within MG_PEER_TIMEOUT when it is shorter than the group's
 * deadline (the ranks come from one failure's handling; one that does not
 * come has failed too). */
static mg_status exclude(mg__bi *b, mg__req *r)
{
    mg_group *g = b->g;
    char prefix[KEYLEN];
    int k = snprintf(prefix, sizeof prefix, "%s/x%d", b->prefix, ++b->nexclude);
    if (k < 0 || (size_t)k + 16 >= sizeof ((mg__bi *)0)->prefix)
        return mg_error(MG_EINVAL, "mg_group_exclude: groups nested too deeply");
    int *members = malloc(sizeof *members * (size_t)g->size), count = 0;
    if (!members) return mg_error(MG_ENOMEM, "mg_group_exclude: out of memory");
    for (int q = 0; q < g->size; q++) {
        bool gone = false;
        for (int i = 0; i < r->ngone && !gone; i++) gone = r->gone[i] == q;
        if (!gone) members[count++] = q;
    }
    double within = b->peer_timeout > 0 && b->peer_timeout < g->timeout ? b->peer_timeout
                                                                         : g->timeout;
    mg_status st = sub_group(b, prefix, members, count, mg_now() + within, "mg_group_exclude",
                             r->out_group);
    free(members);
    return st;
}

static mg_status galloc(mg__bi *b, mg__req *r)
{
    if (b->p2p.shm) {
        mg_call c = {.coll = MG_COLL_BARRIER};
        mg__fp_make(&b->fp, &c, r->seq, 0);
        b->fp.coll = MG__COLL_ALLOC;
        b->fp.count = r->bytes;
        b->deadline = mg_now() + b->g->timeout;
        mg__shm_transport_begin(b->shm_transport, &b->fp, b->deadline);
        mg_status st = mg__shm_transport_alloc(b->shm_transport, r->bytes, r->out_ptr);
        if (st) {
            char d[200];
            mg__fp_describe(&b->fp, d, sizeof d);
            return fail_with(st, d, b->g);
        }
        return MG_OK;
    }
    void **np = realloc(b->plain, (size_t)(b->nplain + 1) * sizeof *np);
    void *p = np ? mg_alloc_zero(r->bytes) : NULL;
    if (np) b->plain = np;
    if (!p) return mg_error(MG_ENOMEM, "mg_group_alloc: cannot allocate %zu bytes", r->bytes);
    b->plain[b->nplain++] = p;
    *r->out_ptr = p;
    return MG_OK;
}

static mg_status gfree(mg__bi *b, mg__req *r)
{
    if (b->shm_transport && mg__shm_transport_free(b->shm_transport, r->ptr)) return MG_OK;
    for (int i = 0; i < b->nplain; i++)
        if (b->plain[i] == r->ptr) {
            mg_free(r->ptr);
            b->plain[i] = b->plain[--b->nplain];
            return MG_OK;
        }
    MG_ASSERT(!"mg_group_free: pointer not from mg_group_alloc on this group");
    return MG_OK;
}

static mg_status bi_run(mg_group *g, mg__req *r)
{
    mg__bi *b = g->impl;
    switch (r->kind) {
    case MG__REQ_SPLIT: return split(b, r);
    case MG__REQ_EXCLUDE: return exclude(b, r);
    case MG__REQ_ALLOC: return galloc(b, r);
    case MG__REQ_FREE: return gfree(b, r);
    case MG__REQ_CALL: break;
    case MG__REQ_BATCH: MG_ASSERT(!"batches are run by work.c"); break;
    }
    if (r->c.coll != MG_COLL_SEND && r->c.coll != MG_COLL_RECV) return run_coll(b, r);
    b->deadline = mg_now() + g->timeout;
    if (b->shm_transport) mg__shm_transport_set_deadline(b->shm_transport, mg_now(), b->deadline);
    int peer = r->c.root;
    mg_status st = r->c.coll == MG_COLL_SEND        ? mg__bi_send(b, r)
                   : r->c.root == MG_ANY_SOURCE ? mg__bi_recv_any(b, r, &peer)
                                                : mg__bi_recv(b, r);
    if (r->c.root == MG_ANY_SOURCE && r->c.source) *r->c.source = peer;
    if (st && !r->rejected) {
        char d[320];
        mg__call_describe_p2p(&r->c, &g->names, r->seq, d, sizeof d);
        /* A peer's failure, contained to this operation (and that peer):
         * a receive from any source that nobody answered in time, or one
         * peer dead, closed, silent or late, or one that dropped this rank
         * (which does not fail the group for the others either). */
        if (atomic_load(&g->contain) && (st == MG_EPEER || st == MG_ETIMEOUT || st == MG_ELEFT) &&
            (peer >= 0 || r->c.root == MG_ANY_SOURCE) && peer != g->rank) {
            if (peer >= 0) mg__bi_drop_peer(b, peer, mg_last_error());
            r->contained = true;
        }
        return fail_with(st, d, g);
    }
    return st;
}

static void bi_abort(mg_group *g, const char *msg)
{
    mg__bi *b = g->impl;
    if (b->shm_transport) mg__shm_transport_abort(b->shm_transport, msg);
    if (!b->link) return;
    bool tcp = false;
    for (int p = 0; p < g->size; p++) tcp = tcp || b->link[p].ch.kind == MG__CH_TCP;
    if (tcp) mg__bi_notice_put(b, -1, msg);   /* before any link closes */
    mg__bi_abort_links(b, msg);
}

static void bi_tick(mg_group *g)
{
    mg__bi *b = g->impl;
    if (b->link) mg__bi_beat(b);
}

/* The group's rendezvous records (and its splits'), deleted by the last
 * rank to leave it, when every rank has long read them: a job's store
 * grew by 2 KB a group made and destroyed, up to its cap, when new groups
 * failed (a probe: after 145,000). The exit counter stays: rank 0 may be
 * waiting on it. */
static void forget_keys(mg__bi *b)
{
    static const char *const one[] = {"table", "error", "error-seen", "shm-created/count",
                                      "shm-created/done", "shm-mapped/count", "shm-mapped/done"};
    char key[KEYLEN], ns[KEYLEN];
    int size = b->g->size;
    mg_store *st = b->store;
    for (size_t i = 0; i < sizeof one / sizeof *one; i++)
        if (!key_fmt(key, sizeof key, b->prefix, one[i], -1)) (void)mg_store_delete(st, key, NULL);
    for (int r = 0; r < size; r++)
        if (!key_fmt(key, sizeof key, b->prefix, "info", r)) (void)mg_store_delete(st, key, NULL);
    for (int s = 1; s <= b->nsplit; s++) {
        if (snprintf(ns, sizeof ns, "%s/s%d", b->prefix, s) >= (int)sizeof ns) continue;
        for (int r = 0; r < size; r++)
            if (!key_fmt(key, sizeof key, ns, "r", r)) (void)mg_store_delete(st, key, NULL);
    }
}

static void bi_destroy(mg_group *g)
{
    mg__bi *b = g->impl;
    bool failed = atomic_load(&g->failed) != 0;
    double grace = g->timeout < 10 ? g->timeout : 10;
    if (b->link) mg__bi_close_links(b, failed ? mg_now() : mg_now() + grace);
    mg__shm_transport_destroy(b->shm_transport);
    for (int i = 0; i < b->nplain; i++) mg_free(b->plain[i]);
    free(b->plain);
    mg__bi_free_unexpected(b);
    mg__coll_scratch_free(&b->p2p);
    /* The last rank to leave forgets the group's records; of a world
     * group it also tells rank 0, which serves the store and waits for the
     * others to be done. */
    char key[KEYLEN], done[KEYLEN + 8];
    if (b->store && b->link && !key_fmt(key, sizeof key, b->prefix, "exit", -1) &&
        snprintf(done, sizeof done, "%s/done", key) < (int)sizeof done) {
        int64_t v = 0;
        if (!mg_store_add(b->store, key, 1, &v) && v == g->size) {
            forget_keys(b);
            if (b->world) (void)mg_store_set(b->store, done, "1", 1);
        }
        if (b->world && g->rank == 0 && b->store->server) {
            /* After a failure, briefly: peers may still want our notices,
             * and dead ones will never come. */
            double wait = failed ? 2 : 30;
            if (g->timeout < wait) wait = g->timeout;
            const char *keys[1] = {done};
            (void)mg_store_wait(b->store, keys, 1, wait);
        }
    }
    mg_store_destroy(b->store);
    free(b->info);
    free(b->link);
    free(b);
    g->impl = NULL;
}

const mg__backend mg__backend_builtin = {
    .name = "builtin", .init = bi_init, .run = bi_run, .abort = bi_abort, .tick = bi_tick,
    .watch = mg__bi_watch,
    .destroy = bi_destroy,
};
