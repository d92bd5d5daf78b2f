/* The TCP transport: authenticated rank-to-rank connections (one per pair
 * of ranks that do not share memory) and the channel operations on them. */
#ifndef MG_COMM_TCP_H
#define MG_COMM_TCP_H

#include "comm/transport/transport.h"

typedef struct mg__tcp_listener {
    int fd, port;
} mg__tcp_listener;

/* Listen on an ephemeral port of addr (this rank's address as peers see it). */
mg_status mg__tcp_listen(const char *addr, mg__tcp_listener *l);
void mg__tcp_listener_close(mg__tcp_listener *l);

/* Open a connection to every peer p with need[p]: this rank connects to
 * lower ranks and accepts higher ones. Each connection is authenticated
 * (auth.h, context "data") and then names its group id and ranks;
 * strangers, wrong secrets and connections for other groups are dropped
 * without disturbing the others. fds[p] receives the socket. Errors name
 * the peers as nm does (NULL: by their ranks here). */
mg_status mg__tcp_connect_peers(mg__tcp_listener *l, const mg__names *nm, uint64_t gid, int rank,
                                int size, const bool *need, char (*addr)[64], const int *port,
                                const char *secret, double deadline, int *fds);

/* peer_timeout > 0: TCP keepalive probes after that long idle. */
void mg__tcp_chan(int fd, int peer, double peer_timeout, mg__chan *c);
void mg__tcp_chan_beat(mg__chan *c, double before);
ssize_t mg__tcp_chan_write(mg__chan *c, const void *a, size_t an, const void *b, size_t bn);
ssize_t mg__tcp_chan_read(mg__chan *c, void *buf, size_t n);

#endif
