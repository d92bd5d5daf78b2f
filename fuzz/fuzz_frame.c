/* libFuzzer target for the transport's frames (src/comm/p2p.c,
 * transport.h): whatever a peer's connection may carry — frame headers,
 * payloads, heartbeats, abort notices, garbage — received by rank 0 of a
 * two-rank builtin group over a socketpair that is closed after the bytes
 * (so every wait ends at once). Each header alone also goes through
 * mg__frame_check and mg__fp_describe.
 *
 * The input: a script byte, a tag byte, two bytes of little-endian
 * length n, then the stream. The script's 2-bit fields, low first, are
 * up to four receives in turn, until one fails: 0 a point-to-point
 * receive of n bytes with the tag, 1 a collective's (all_reduce #k of
 * n / 4 f32, k = 1, 2, ...), 2 a point-to-point receive of n + 1 bytes
 * with tag + 1, 3 stop. Seeds: tests/fuzz/frame/. */
#include "common.h"  /* first: it defines _GNU_SOURCE */
#include <sys/socket.h>
#include "comm/builtin.h"
#include "multigrad/core.h"

#define MAX_STREAM (64 << 10) /* fits the socketpair's buffer: written at once */

/* Every 64-byte window at a frame-sized step, as a header on its own. */
static void headers_alone(const uint8_t *p, size_t n)
{
    for (size_t at = 0; at + sizeof(mg__fp) <= n; at += sizeof(mg__fp)) {
        mg__fp h;
        memcpy(&h, p + at, sizeof h);
        const char *why = mg__frame_check(&h);
        FUZZ_CHECK(!why || *why);
        char d[200];
        mg__fp_describe(&h, d, sizeof d);
        for (const char *c = d; *c; c++) FUZZ_CHECK(*c >= 32 && *c < 127);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 4 || size - 4 > MAX_STREAM) return 0;
    unsigned script = data[0];
    int tag = data[1];
    size_t n = (size_t)data[2] | (size_t)data[3] << 8;
    data += 4;
    size -= 4;
    headers_alone(data, size);

    int sv[2];
    FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) == 0);
    int buf = MAX_STREAM * 4;
    setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    FUZZ_CHECK(size == 0 || send(sv[1], data, size, MSG_NOSIGNAL) == (ssize_t)size);
    shutdown(sv[1], SHUT_WR);

    mg_group g = {.rank = 0, .size = 2, .timeout = 5};
    mg__rinfo info[2] = {{0}};
    mg__link link[2] = {{{0}}};
    mg__bi b = {.g = &g, .info = info, .link = link};
    g.impl = &b;
    link[0].ch = (mg__chan){.kind = MG__CH_NONE, .peer = 0, .fd = -1};
    mg__tcp_chan(sv[0], 1, 0, &link[1].ch);
    mg__p2p_init(&b);
    b.umax = 1 << 20;
    b.beat_s = 1;
    b.next_beat = 1e30; /* no heartbeats into the socket nobody reads */
    b.deadline = mg_now() + g.timeout;

    /* Guards either side: nothing may be written outside n bytes. */
    uint8_t *mem = malloc(n + 1 + 64);
    FUZZ_CHECK(mem);
    uint8_t *out = mem + 32;
    mg_status st = MG_OK;
    uint64_t coll_seq = 0, p2p_seq = 0;
    for (int op = 0; op < 4 && !st; op++) {
        int what = (script >> (2 * op)) & 3;
        if (what == 3) break;
        memset(mem, 0xa5, n + 1 + 64);
        size_t want = n + (what == 2);
        if (what == 1) {
            mg_call c = {.coll = MG_COLL_ALL_REDUCE, .count = n / 4, .dtype = MG_F32,
                         .op = MG_SUM, .file = "fuzz_frame.c", .line = 1};
            mg__fp_make(&b.fp, &c, ++coll_seq, 0);
            st = b.p2p.recv(&b.p2p, 1, out, n);
        } else {
            mg__req r = {.kind = MG__REQ_CALL, .seq = p2p_seq++,
                         .c = {.coll = MG_COLL_RECV, .recvbuf = out, .count = want,
                               .dtype = MG_U8, .root = 1, .tag = tag + (what == 2)}};
            st = mg__bi_recv(&b, &r);
        }
        for (size_t i = 0; i < 32; i++) FUZZ_CHECK(mem[i] == 0xa5 && out[want + i] == 0xa5);
        FUZZ_CHECK(b.ubytes <= b.umax);
        if (st) FUZZ_CHECK(*mg_last_error());
    }
    FUZZ_CHECK(mg_now() < b.deadline); /* every wait ended on the closed stream */
    mg__bi_free_unexpected(&b);
    free(mem);
    close(sv[0]);
    close(sv[1]);
    return 0;
}
