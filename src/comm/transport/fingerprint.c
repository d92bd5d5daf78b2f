/* Fingerprints (the frame header's identity of a collective, see
 * transport.h): building one from a call, comparing the fields every rank
 * must agree on, and the messages that name both calls when ranks
 * disagree. Descriptions sanitise what peers sent: a header is never
 * trusted to be well-formed text. */
#include "comm/transport/transport.h"
#include "comm/call.h"
#include <stdio.h>
#include <string.h>

static bool has_op(int c)
{
    return c == MG_COLL_REDUCE || c == MG_COLL_ALL_REDUCE || c == MG_COLL_REDUCE_SCATTER;
}

void mg__fp_make(mg__fp *fp, const mg_call *c, uint64_t seq, int algo)
{
    memset(fp, 0, sizeof *fp);
    fp->magic = MG__FRAME_MAGIC;
    fp->kind = MG__FRAME_COLL;
    fp->coll = (uint8_t)c->coll;
    fp->algo = (uint8_t)algo;
    if (c->coll != MG_COLL_BARRIER) {
        fp->dtype = (uint8_t)c->dtype;
        fp->count = c->count;
    }
    if (has_op(c->coll)) fp->op = (uint8_t)c->op;
    if (mg__coll_rooted(c->coll)) fp->root = c->root;
    fp->seq = seq;
    fp->line = (uint32_t)(c->line > 0 ? c->line : 0);
    if (c->file) {
        const char *b = strrchr(c->file, '/');
        b = b ? b + 1 : c->file;
        size_t n = strlen(b);
        /* Keep the end of a long name: it is the distinctive part. */
        if (n >= sizeof fp->file) b += n - (sizeof fp->file - 1);
        memcpy(fp->file, b, strlen(b) + 1);
    }
}

const char *mg__frame_check(const mg__fp *h)
{
    if (h->magic != MG__FRAME_MAGIC) return "bad magic";
    if (h->kind < MG__FRAME_COLL || h->kind > MG__FRAME_BEAT) return "unknown kind";
    if (h->kind == MG__FRAME_ABORT && h->len > MG__ABORT_MAX) return "abort notice too long";
    if (h->kind == MG__FRAME_BEAT && h->len) return "heartbeat with a payload";
    return NULL;
}

bool mg__fp_same(const mg__fp *a, const mg__fp *b)
{
    return a->kind == b->kind && a->coll == b->coll && a->dtype == b->dtype && a->op == b->op &&
           a->algo == b->algo && a->root == b->root && a->seq == b->seq && a->count == b->count;
}

void mg__fp_describe(const mg__fp *fp, char *buf, size_t n)
{
    char file[sizeof fp->file + 1];
    memcpy(file, fp->file, sizeof fp->file);
    file[sizeof fp->file] = 0;
    for (char *p = file; *p; p++)
        if (*p < 32 || *p > 126) *p = '?';
    const char *cn = fp->coll < MG_COLL_COUNT ? mg_coll_name((mg_coll)fp->coll)
                   : fp->coll == MG__COLL_ALLOC ? "mg_group_alloc" : "?";
    const char *dn = fp->dtype < MG_DTYPE_COUNT ? mg_dtype_name((mg_dtype)fp->dtype) : "?";
    char extra[64] = "";
    if (has_op(fp->coll))
        snprintf(extra, sizeof extra, ", %s", fp->op < MG_OP_COUNT ? mg_op_name((mg_op)fp->op) : "?");
    else if (mg__coll_rooted(fp->coll))
        snprintf(extra, sizeof extra, ", root %d", fp->root);
    if (fp->coll == MG__COLL_ALLOC)
        snprintf(buf, n, "%s #%llu (%llu bytes)", cn, (unsigned long long)fp->seq,
                 (unsigned long long)fp->count);
    else if (fp->coll == MG_COLL_BARRIER)
        snprintf(buf, n, "%s #%llu at %s:%u", cn, (unsigned long long)fp->seq,
                 *file ? file : "?", fp->line);
    else
        snprintf(buf, n, "%s #%llu (%llu x %s%s) at %s:%u", cn, (unsigned long long)fp->seq,
                 (unsigned long long)fp->count, dn, extra, *file ? file : "?", fp->line);
}

mg_status mg__fp_mismatch(const mg__names *nm, const mg__fp *mine, int me, const mg__fp *theirs,
                          int peer)
{
    char a[160], b[160];
    mg__fp_describe(mine, a, sizeof a);
    mg__fp_describe(theirs, b, sizeof b);
    const char *why = mine->seq != theirs->seq ? "they are at different operations"
                    : mine->coll != theirs->coll ? "different collectives"
                    : mine->count != theirs->count ? "different counts"
                    : mine->dtype != theirs->dtype ? "different dtypes"
                    : mine->op != theirs->op ? "different reduction ops"
                    : mine->root != theirs->root ? "different roots"
                    : "different algorithms (MG_ALGO differs between ranks?)";
    char rm[128], rp[128];
    return mg_error(MG_EMISMATCH, "mismatched collectives (%s): %s called %s but %s called %s; "
                    "every rank must issue the same collectives in the same order", why,
                    mg__rank_name(nm, me, NULL, rm, sizeof rm), a,
                    mg__rank_name(nm, peer, NULL, rp, sizeof rp), b);
}
