/* Mutual authentication of a connection by an HMAC-SHA256 challenge–
 * response over the job secret (OpenSSL), used by the store and by the
 * rank-to-rank data connections.
 *
 *   server -> client  "MGA1" version snonce[32]                    (40 B)
 *   client -> server  "MGA1" cnonce[32] HMAC(k, "client" ctx snonce cnonce) (68 B)
 *   server -> client  "MGA1" HMAC(k, "server" ctx cnonce snonce)   (36 B)
 *
 * Both sides draw fresh nonces from RAND_bytes and compare MACs in
 * constant time, so neither a replayed exchange nor a server without the
 * secret passes. A wrong answer closes the connection; the server says
 * nothing more, except "MGAB" (busy) to a connection it evicts before the
 * answer came, which the client takes as "try again". ctx ("store",
 * "data") keeps a MAC for one service from being accepted by another.
 *
 * No secret means the empty key, which anyone can use: then callers accept
 * loopback peers only, and both ends also require the other to belong to
 * the same user (or root), as the kernel reports the owner of the peer's
 * socket (mg__sock_peer_uid). */
#ifndef MG_COMM_AUTH_H
#define MG_COMM_AUTH_H

#include <stddef.h>
#include <stdint.h>
#include "multigrad/status.h"

#define MG__AUTH_NONCE 32
#define MG__AUTH_HELLO 40
#define MG__AUTH_REPLY 68
#define MG__AUTH_FINAL 36

/* Client side, blocking until deadline. */
mg_status mg__auth_client(int fd, const char *secret, const char *ctx, double deadline,
                          const char *what);

/* Server side as a state machine for poll loops that must not block on a
 * slow or hostile client. */
typedef struct mg__auth_srv {
    int state;      /* 0 reading the reply, 1 done, -1 refused */
    uint8_t snonce[MG__AUTH_NONCE];
    uint8_t buf[MG__AUTH_REPLY];
    size_t got;
} mg__auth_srv;
/* Send the hello (fits any socket buffer). MG_OK or an error. */
mg_status mg__auth_srv_begin(mg__auth_srv *a, int fd);
/* Read what is available; returns 1 authenticated (final sent), 0 more
 * needed, -1 refused or connection failed. */
int mg__auth_srv_step(mg__auth_srv *a, int fd, const char *secret, const char *ctx);
/* Turn away a connection still authenticating: it may try again. */
void mg__auth_srv_busy(int fd);

/* HMAC-SHA256 of msg keyed with the secret (empty allowed). */
void mg__hmac(uint8_t out[32], const char *secret, const void *msg, size_t n);

/* The job secret: explicit if non-NULL, else MG_JOB_SECRET, else "". */
const char *mg__secret(const char *explicit_secret);

#endif
