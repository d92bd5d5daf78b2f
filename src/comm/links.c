/* The builtin backend's links, given up: a peer dropped after its
 * failure (mg_group_contain_peer_failures), abort notices to every peer
 * on a failure, the store's copies of both notices for a peer that sees
 * its link close first, and the orderly close at the group's end that
 * loses no byte already sent.
 * Limits: notices travel on TCP links only (shared memory has its own,
 * shm.c); a link mid-frame is shut down instead, which its peer reads as
 * the notice. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include "comm/builtin.h"
#include "comm/transport/sock.h"
#include "multigrad/core.h"

/* The store's key of rank from's notice: its abort (to < 0), or its drop
 * of rank to. */
static bool notice_key(const mg__bi *b, int from, int to, char key[MG_STORE_MAX_KEY + 1])
{
    int k = to < 0 ? snprintf(key, MG_STORE_MAX_KEY + 1, "%s/abort/%d", b->prefix, from)
                   : snprintf(key, MG_STORE_MAX_KEY + 1, "%s/drop/%d/%d", b->prefix, from, to);
    return b->store && k > 0 && k <= MG_STORE_MAX_KEY;
}

void mg__bi_notice_put(mg__bi *b, int to, const char *msg)
{
    char key[MG_STORE_MAX_KEY + 1];
    if (notice_key(b, b->g->rank, to, key))
        (void)mg__store_set_quick(b->store, key, msg, strlen(msg), 0.5);
}

char *mg__bi_notice_get(mg__bi *b, int from, int to)
{
    char key[MG_STORE_MAX_KEY + 1];
    void *msg = NULL;
    size_t n;
    if (notice_key(b, from, to, key) && !mg__store_get_quick(b->store, key, 0.5, &msg, &n))
        return msg;
    return NULL;
}

void mg__bi_drop_peer(mg__bi *b, int peer, const char *why)
{
    mg__link *l = &b->link[peer];
    if (l->ch.dead) return;
    /* Should the peer come back, it learns that it was dropped (a flag in
     * this rank's segment, or its link's close) and why (the store), so
     * that it fails with MG_ELEFT instead of waiting. */
    mg__bi_notice_put(b, peer, why);
    if (b->shm_transport) mg__shm_transport_drop(b->shm_transport, peer);
    if (l->ch.kind == MG__CH_TCP) shutdown(l->ch.fd, SHUT_RDWR);
    l->ch.dead = true;
}

void mg__bi_abort_links(mg__bi *b, const char *msg)
{
    size_t len = strlen(msg);
    if (len > MG__ABORT_MAX) len = MG__ABORT_MAX;
    for (int p = 0; p < b->g->size; p++) {
        mg__link *l = &b->link[p];
        if (l->ch.kind != MG__CH_TCP || l->ch.dead) continue;
        bool sent = false;
        if (mg__chan_at_boundary(&l->ch)) {
            mg__fp h = {.magic = MG__FRAME_MAGIC, .kind = MG__FRAME_ABORT, .len = len};
            uint8_t buf[sizeof h + MG__ABORT_MAX];
            memcpy(buf, &h, sizeof h);
            memcpy(buf + sizeof h, msg, len);
            sent = !mg__sock_write_all(l->ch.fd, buf, sizeof h + len, mg_now() + 0.1, "abort");
        }
        /* Mid-frame the stream cannot carry a notice: closing it is one. */
        if (!sent) shutdown(l->ch.fd, SHUT_RDWR);
        l->ch.dead = true;
    }
}

void mg__bi_close_links(mg__bi *b, double deadline)
{
    int n = b->g->size, open = 0;
    for (int p = 0; p < n; p++) {
        mg__link *l = &b->link[p];
        if (l->ch.kind != MG__CH_TCP || l->ch.fd < 0) continue;
        shutdown(l->ch.fd, SHUT_WR);
        open += !l->ch.dead && !l->closed;
    }
    /* Read until every peer has closed too, so no data we sent is lost to
     * a reset; bounded by the deadline. */
    char junk[4096];
    while (open > 0 && mg_now() < deadline) {
        struct pollfd pf[n];
        int idx[n], np = 0;
        for (int p = 0; p < n; p++) {
            mg__link *l = &b->link[p];
            if (l->ch.kind == MG__CH_TCP && l->ch.fd >= 0 && !l->ch.dead && !l->closed) {
                pf[np] = (struct pollfd){.fd = l->ch.fd, .events = POLLIN};
                idx[np++] = p;
            }
        }
        if (poll(pf, (nfds_t)np, mg__poll_ms(deadline, 100)) < 0 && errno != EINTR) break;
        for (int i = 0; i < np; i++) {
            if (!pf[i].revents) continue;
            ssize_t k = recv(pf[i].fd, junk, sizeof junk, MSG_DONTWAIT);
            if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR)) {
                b->link[idx[i]].ch.dead = true;
                open--;
            }
        }
    }
    for (int p = 0; p < n; p++) {
        mg__link *l = &b->link[p];
        if (l->ch.kind == MG__CH_TCP && l->ch.fd >= 0) close(l->ch.fd);
        l->ch.fd = -1;
    }
}
