/* Socket helpers shared by the store and the TCP transport: listen,
 * connect with retries until a deadline, whole reads and writes on
 * non-blocking sockets with a deadline, and address checks. Every socket
 * these helpers return is non-blocking and close-on-exec. */
#ifndef MG_COMM_SOCK_H
#define MG_COMM_SOCK_H

#include <stdbool.h>
#include <stddef.h>
#include "multigrad/status.h"

/* Listen on host:port (host NULL or "": every interface; port 0: a free
 * port). *bound_port receives the port. EADDRINUSE gives a message saying
 * the port is taken. */
mg_status mg__sock_listen(const char *host, int port, int *fd, int *bound_port);
/* Connect to host:port, retrying refused or unreachable attempts until
 * deadline (mg_now() seconds). `what` names the peer and its address in
 * messages ("the store at HOST:PORT"). */
mg_status mg__sock_connect(const char *host, int port, double deadline, const char *what,
                           int *fd);
/* Accept one pending connection (-1 and errno EAGAIN when none). */
int mg__sock_accept(int lfd);
/* Exactly n bytes, or an error naming `what` (EOF: MG_EPEER). */
mg_status mg__sock_read_all(int fd, void *buf, size_t n, double deadline, const char *what);
mg_status mg__sock_write_all(int fd, const void *buf, size_t n, double deadline,
                             const char *what);
/* Wait until fd is readable (events POLLIN) or writable (POLLOUT); MG_ETIMEOUT
 * after deadline. */
mg_status mg__sock_wait(int fd, short events, double deadline, const char *what);
void mg__sock_nodelay(int fd);
/* Keepalive probes after idle_s seconds idle, every idle_s / 5 after
 * that; five unanswered ones close the connection. */
void mg__sock_keepalive(int fd, double idle_s);
/* The peer of a connected socket is a loopback address. */
bool mg__sock_peer_is_loopback(int fd);
/* The user id owning the other end of a connection on this host (a
 * loopback one), as the kernel's socket diagnostics report it; MG_EIO if
 * it cannot be told (then treat the peer as a stranger). */
mg_status mg__sock_peer_uid(int fd, unsigned *uid);
/* host resolves only to loopback addresses (127/8, ::1, "localhost"). */
bool mg__host_is_loopback(const char *host);
/* Numeric address of this end of a connected socket ("10.0.0.3"). */
mg_status mg__sock_local_addr(int fd, char *buf, size_t n);
/* Milliseconds until deadline for poll(): 0 when past, capped at cap_ms. */
int mg__poll_ms(double deadline, int cap_ms);

#endif
