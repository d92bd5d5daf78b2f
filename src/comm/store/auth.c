/* HMAC challenge–response authentication (see auth.h). The crypto is
 * OpenSSL's: HMAC-SHA256, RAND_bytes, CRYPTO_memcmp. */
#define _GNU_SOURCE
#include "comm/store/auth.h"
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include "comm/transport/sock.h"
#include "multigrad/core.h"

static const uint8_t MAGIC[4] = {'M', 'G', 'A', '1'};
static const uint8_t BUSY[4] = {'M', 'G', 'A', 'B'};
#define VERSION 1u

const char *mg__secret(const char *s)
{
    if (s) return s;
    s = mg_env_str("MG_JOB_SECRET", NULL);
    return s ? s : "";
}

void mg__hmac(uint8_t out[32], const char *secret, const void *msg, size_t n)
{
    static const uint8_t empty[1] = {0};
    size_t kl = strlen(secret);
    unsigned int ol = 32;
    uint8_t *r = HMAC(EVP_sha256(), kl ? (const void *)secret : (const void *)empty, (int)kl,
                      msg, n, out, &ol);
    MG_ASSERT(r && ol == 32);
}

/* Without a secret the MACs prove nothing, so the peer must be a process
 * of this user (or root, who could read any secret anyway). The kernel
 * tells who owns the other end of a loopback connection (sock.h). */
static mg_status same_user(int fd, const char *what)
{
    unsigned uid;
    if (mg__sock_peer_uid(fd, &uid)) {
        char why[256];
        snprintf(why, sizeof why, "%s", mg_last_error());
        return mg_error(MG_EUNSUPPORTED, "%s: without MG_JOB_SECRET only processes of this "
                        "user may take part, and this cannot be checked here (%s): set the "
                        "same MG_JOB_SECRET on every rank", what, why);
    }
    if (uid != geteuid() && uid != 0)
        return mg_error(MG_EAUTH, "%s belongs to another user (uid %u, we are uid %u): without "
                        "MG_JOB_SECRET only processes of the same user may take part; set the "
                        "same MG_JOB_SECRET on every rank", what, uid, (unsigned)geteuid());
    return MG_OK;
}

static void mac(uint8_t out[32], const char *secret, const char *role, const char *ctx,
                const uint8_t *n1, const uint8_t *n2)
{
    uint8_t msg[64 + 2 * MG__AUTH_NONCE];
    size_t rl = strlen(role), cl = strlen(ctx), m = 0;
    MG_ASSERT(rl + cl + 2 <= 64);
    memcpy(msg, role, rl + 1);
    m = rl + 1;
    memcpy(msg + m, ctx, cl + 1);
    m += cl + 1;
    memcpy(msg + m, n1, MG__AUTH_NONCE);
    m += MG__AUTH_NONCE;
    memcpy(msg + m, n2, MG__AUTH_NONCE);
    m += MG__AUTH_NONCE;
    mg__hmac(out, secret, msg, m);
}

static mg_status nonce(uint8_t *n)
{
    if (RAND_bytes(n, MG__AUTH_NONCE) != 1)
        return mg_error(MG_EIO, "RAND_bytes failed: the system random generator is unavailable");
    return MG_OK;
}

mg_status mg__auth_client(int fd, const char *secret, const char *ctx, double deadline,
                          const char *what)
{
    uint8_t hello[MG__AUTH_HELLO], reply[MG__AUTH_REPLY], fin[MG__AUTH_FINAL], want[32];
    double waited = mg_now();
    mg_status s = mg__sock_read_all(fd, hello, sizeof hello, deadline, what);
    if (s == MG_ETIMEOUT)
        return mg_error(MG_ETIMEOUT, "%s: no authentication challenge within the deadline "
                        "(%.3g s): the address answers, but it is not a multigrad %s (wrong "
                        "port?), or it did not answer in time (a longer MG_TIMEOUT)",
                        what, mg_now() - waited, ctx);
    if (s) return s;
    uint32_t ver;
    memcpy(&ver, hello + 4, 4);
    if (memcmp(hello, MAGIC, 4) || ver != VERSION)
        return mg_error(MG_EAUTH, "%s: the peer does not speak the multigrad protocol "
                        "(wrong address or port, or another multigrad version)", what);
    memcpy(reply, MAGIC, 4);
    MG_TRY(nonce(reply + 4));
    mac(reply + 4 + MG__AUTH_NONCE, secret, "mg-client", ctx, hello + 8, reply + 4);
    MG_TRY(mg__sock_write_all(fd, reply, sizeof reply, deadline, what));
    s = mg__sock_read_all(fd, fin, 4, deadline, what);
    if (!s && !memcmp(fin, BUSY, 4))
        return mg_error(MG_EPEER, "%s is busy: it turned this connection away to make room "
                        "for others", what);
    if (!s) s = mg__sock_read_all(fd, fin + 4, sizeof fin - 4, deadline, what);
    if (s == MG_EPEER)
        return mg_error(MG_EAUTH, "%s refused our credentials: every rank must have the same "
                        "MG_JOB_SECRET (without one, only processes of the same user on this "
                        "host are accepted)", what);
    if (s) return s;
    mac(want, secret, "mg-server", ctx, reply + 4, hello + 8);
    if (memcmp(fin, MAGIC, 4) || CRYPTO_memcmp(fin + 4, want, 32))
        return mg_error(MG_EAUTH, "%s could not prove it knows the job secret: it is not "
                        "part of this job (check MG_JOB_SECRET and the address)", what);
    return *secret ? MG_OK : same_user(fd, what);
}

mg_status mg__auth_srv_begin(mg__auth_srv *a, int fd)
{
    memset(a, 0, sizeof *a);
    uint8_t hello[MG__AUTH_HELLO];
    MG_TRY(nonce(a->snonce));
    memcpy(hello, MAGIC, 4);
    uint32_t ver = VERSION;
    memcpy(hello + 4, &ver, 4);
    memcpy(hello + 8, a->snonce, MG__AUTH_NONCE);
    ssize_t k;
    do k = send(fd, hello, sizeof hello, MSG_DONTWAIT | MSG_NOSIGNAL);
    while (k < 0 && errno == EINTR);
    if (k != (ssize_t)sizeof hello) {
        a->state = -1;
        return mg_error(MG_EPEER, "authentication: cannot send the challenge");
    }
    return MG_OK;
}

int mg__auth_srv_step(mg__auth_srv *a, int fd, const char *secret, const char *ctx)
{
    if (a->state) return a->state;
    while (a->got < sizeof a->buf) {
        ssize_t k = recv(fd, a->buf + a->got, sizeof a->buf - a->got, MSG_DONTWAIT);
        if (k > 0) {
            a->got += (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        return a->state = -1;
    }
    uint8_t want[32];
    mac(want, secret, "mg-client", ctx, a->snonce, a->buf + 4);
    if (memcmp(a->buf, MAGIC, 4) || CRYPTO_memcmp(a->buf + 4 + MG__AUTH_NONCE, want, 32))
        return a->state = -1;
    mg_status who = *secret ? MG_OK : same_user(fd, "a client");
    if (who) {
        /* Strangers are refused quietly; a check that cannot be made at
         * all refuses everyone, which the user must hear about once. */
        static atomic_flag told = ATOMIC_FLAG_INIT;
        if (who == MG_EUNSUPPORTED && !atomic_flag_test_and_set(&told))
            mg_log("%s: refusing connections: %s", ctx, mg_last_error());
        else
            mg_debug("%s: refused: %s", ctx, mg_last_error());
        return a->state = -1;
    }
    uint8_t fin[MG__AUTH_FINAL];
    memcpy(fin, MAGIC, 4);
    mac(fin + 4, secret, "mg-server", ctx, a->buf + 4, a->snonce);
    ssize_t k;
    do k = send(fd, fin, sizeof fin, MSG_DONTWAIT | MSG_NOSIGNAL);
    while (k < 0 && errno == EINTR);
    if (k != (ssize_t)sizeof fin) return a->state = -1;
    return a->state = 1;
}

void mg__auth_srv_busy(int fd)
{
    (void)!send(fd, BUSY, sizeof BUSY, MSG_DONTWAIT | MSG_NOSIGNAL);
}
