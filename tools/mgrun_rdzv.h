/* mgrun's part of the rendezvous (tools/mgrun.c), as torchrun's agent
 * does it. Node 0's mgrun serves the job's store on --master-port for the
 * whole job; multigrad ranks find it there through MG_STORE_PORT (beside
 * MASTER_ADDR). The workers' MASTER_PORT is another port, free on node 0
 * when chosen, for a program that runs a rendezvous of its own there
 * (PyTorch's init_process_group: its rank 0 listens on MASTER_PORT). Node
 * 0 chooses it and publishes it in the store, where every other node's
 * mgrun reads it before starting its workers, so that all hand the same
 * one to theirs.
 *
 * Limits: that port is free, not held (a worker must be able to bind it),
 * so another process may take it first, as with torchrun; it is chosen
 * once per job and restarts reuse it (PyTorch's store binds with
 * SO_REUSEADDR).
 *
 * A header of static functions because each tool is one source file (the
 * Makefile builds one binary per file of tools/). */
#ifndef MGRUN_RDZV_H
#define MGRUN_RDZV_H

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include "multigrad/comm.h"

/* The store key of the workers' MASTER_PORT. */
#define RDZV_WORKER_PORT_KEY "mgrun/master-port"
/* The job's shape as node 0 was told it: "-n N --nnodes K". */
#define RDZV_SHAPE_KEY "mgrun/shape"

/* A port no socket of this host held a moment ago, on any address: the
 * kernel's choice for the IPv6 wildcard (IPv4 too: dual stack), or for the
 * IPv4 one without IPv6. -1 if neither can be bound. */
static int rdzv_free_port(void)
{
    int port = -1, off = 0;
    int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_ANY_INIT};
    socklen_t len = sizeof a6;
    if (fd >= 0 && setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off) == 0 &&
        bind(fd, (struct sockaddr *)&a6, sizeof a6) == 0 &&
        getsockname(fd, (struct sockaddr *)&a6, &len) == 0)
        port = ntohs(a6.sin6_port);
    if (fd >= 0) close(fd);
    if (port > 0) return port;
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a4 = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
    len = sizeof a4;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a4, sizeof a4) == 0 &&
        getsockname(fd, (struct sockaddr *)&a4, &len) == 0)
        port = ntohs(a4.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

static bool rdzv_loopback(const char *addr)
{
    return !strcmp(addr, "127.0.0.1") || !strcmp(addr, "localhost") || !strcmp(addr, "::1");
}

/* addr names an address of this host (a socket binds to it); a name
 * that does not resolve is left to the store's own message. */
static bool rdzv_is_local(const char *addr)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(addr, NULL, &hints, &res) != 0) return true;
    bool local = false;
    for (struct addrinfo *a = res; a && !local; a = a->ai_next) {
        int fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        local = fd >= 0 && bind(fd, a->ai_addr, a->ai_addrlen) == 0;   /* port 0 in it */
        if (fd >= 0) close(fd);
    }
    freeaddrinfo(res);
    return local;
}

/* The store's URL at host:port. */
static void rdzv_url(char *url, size_t n, const char *host, int port)
{
    snprintf(url, n, strchr(host, ':') ? "tcp://[%s]:%d" : "tcp://%s:%d", host, port);
}

/* Serves the store (on node 0) from a child process, so that mgrun itself
 * stays single-threaded (it forks workers); the child holds the port for
 * the whole job, so no other process can take it between choosing it and
 * the ranks' arrival, and restarts reuse it. It chooses the workers'
 * MASTER_PORT and publishes it. Returns the child's pid, the store's port
 * (port 0 asks the kernel for a free one) and the workers' port, or -1
 * after printing why. */
static pid_t rdzv_serve(const char *addr, int port, const char *secret, const char *shape,
                        int *store_port, int *worker_port)
{
    int fds[2];
    pid_t parent = getpid(), pid = -1;
    if (pipe2(fds, O_CLOEXEC) != 0 || (pid = fork()) < 0) {
        fprintf(stderr, "mgrun: cannot start the rendezvous store's process: %s\n",
                strerror(errno));
        return -1;
    }
    if (pid == 0) {
        close(fds[0]);
        setpgid(0, 0);                  /* a terminal's ^C goes to the job, not here */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(1);
        bool loopback = rdzv_loopback(addr);
        mg_store_server *srv;
        mg_store *self = NULL;
        int p[2] = {-1, -1};
        char url[300], val[16];
        if (mg_store_server_start(loopback ? addr : NULL, port, secret, &srv) != MG_OK) {
            fprintf(stderr, "mgrun: cannot serve the rendezvous store on --master-port %d: %s\n",
                    port, mg_last_error());
        } else if ((p[1] = rdzv_free_port()) < 0) {   /* not the store's: it holds that */
            fprintf(stderr, "mgrun: cannot find a free port for the workers' MASTER_PORT: "
                    "%s\n", strerror(errno));
        } else {
            /* The store listens on addr if loopback, else on every address. */
            rdzv_url(url, sizeof url, loopback ? addr : "127.0.0.1", mg_store_server_port(srv));
            snprintf(val, sizeof val, "%d", p[1]);
            if (mg_store_connect(url, secret, 10, &self) != MG_OK ||
                mg_store_set(self, RDZV_SHAPE_KEY, shape, strlen(shape)) != MG_OK ||
                mg_store_set(self, RDZV_WORKER_PORT_KEY, val, strlen(val)) != MG_OK)
                fprintf(stderr, "mgrun: cannot publish the workers' MASTER_PORT in the "
                        "rendezvous store: %s\n", mg_last_error());
            else
                p[0] = mg_store_server_port(srv);
            mg_store_destroy(self);
        }
        if (write(fds[1], p, sizeof p) != (ssize_t)sizeof p || p[0] < 0) _exit(1);
        close(fds[1]);
        for (;;) pause();               /* until mgrun stops it */
    }
    close(fds[1]);
    int p[2] = {-1, -1};
    ssize_t n;
    while ((n = read(fds[0], p, sizeof p)) < 0 && errno == EINTR) {}
    close(fds[0]);
    if (n != (ssize_t)sizeof p || p[0] <= 0) {   /* it said why, but if it died first */
        if (n != (ssize_t)sizeof p)
            fprintf(stderr, "mgrun: the rendezvous store's process ended before serving\n");
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return -1;
    }
    *store_port = p[0];
    *worker_port = p[1];
    return pid;
}

/* On another node: the workers' MASTER_PORT, read from node 0's store at
 * addr:port (waiting for it up to MG_TIMEOUT), once node 0's shape of the
 * job is this node's; -1 after printing why (and, for the nodes' board,
 * why node 0's shape refuses this node in refused, else ""). */
static int rdzv_worker_port(int node_rank, const char *addr, int port, const char *secret,
                            const char *shape, char *refused, size_t cap)
{
    *refused = 0;
    char url[300];
    rdzv_url(url, sizeof url, addr, port);
    mg_store *s = NULL;
    void *v = NULL;
    size_t n = 0;
    long wp = -1;
    mg_status st = mg_store_connect(url, secret, 0, &s);
    if (!st && !(st = mg_store_get(s, RDZV_SHAPE_KEY, &v, &n)) &&
        (n != strlen(shape) || memcmp(v, shape, n))) {
        snprintf(refused, cap, "was started with %s, but node 0 with %.*s: give every node the "
                 "same -n and --nnodes", shape, (int)(n < 64 ? n : 64), (const char *)v);
        fprintf(stderr, "mgrun: node %d %s\n", node_rank, refused);
        free(v);
        mg_store_destroy(s);
        return -1;
    }
    free(v);
    v = NULL;
    if (!st) st = mg_store_get(s, RDZV_WORKER_PORT_KEY, &v, &n);
    if (s) mg_store_destroy(s);
    if (!st) {
        char buf[16] = "";
        if (n < sizeof buf) memcpy(buf, v, n);
        char *end;
        wp = strtol(buf, &end, 10);
        if (end == buf || *end || wp < 1 || wp > 65535) {
            wp = -1;
            mg_error(MG_EFORMAT, "its value '%.*s' is not a port", (int)(n < 16 ? n : 16),
                     (const char *)v);
        }
    }
    free(v);
    if (wp < 0)
        fprintf(stderr, "mgrun: node %d cannot read the workers' MASTER_PORT from node 0's "
                "rendezvous store at %s:%d: %s; is mgrun --node-rank 0 running there with the "
                "same --master-port and MG_JOB_SECRET?\n", node_rank, addr, port,
                mg_last_error());
    return (int)wp;
}

#endif
