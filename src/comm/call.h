/* Internal to src/comm: what the group, both backends and the algorithms
 * share about one operation (mg_call). */
#ifndef MG_COMM_CALL_H
#define MG_COMM_CALL_H

#include <stdbool.h>
#include "comm/names.h"
#include "multigrad/comm.h"

/* The one check of a call's arguments, made when it is issued (mg_start,
 * mg_run), before any backend sees it, as rank `rank` of a group of
 * `size` whose ranks nm names: a known operation, dtype and reduction op;
 * a root (peer for send and recv) in [0, size); count elements of every
 * rank fitting the address space; no NULL buffer that this rank reads or
 * writes. MG_EINVAL with one line naming the operation and the argument
 * otherwise. */
mg_status mg__call_check(const mg_call *c, const mg__names *nm, int rank, int size);

/* Broadcast, reduce, gather and scatter: the collectives with a root. */
bool mg__coll_rooted(mg_coll c);
/* Which of its buffers a rank uses (root: the rank is the root). */
bool mg__reads_sendbuf(mg_coll c, bool root);
bool mg__writes_recvbuf(mg_coll c, bool root);
/* The bytes of c's send and receive buffers that rank `rank` of `size`
 * uses (0 for one it does not use); counts follow comm.h's NCCL
 * conventions. */
void mg__call_spans(const mg_call *c, int rank, int size, size_t *sn, size_t *rn);
/* c's buffers as rank `rank` of `size` uses them, its in-place forms
 * resolved (coll/coll.h's conventions), for every path that runs calls
 * (the host algorithms, NCCL): *s and *r are where the rank reads and
 * writes (all_gather's and gather's sendbuf == recvbuf becomes the rank's
 * block of recvbuf, scatter's recvbuf == sendbuf the root's block). When
 * the input still overlaps the output otherwise, its first *in bytes must
 * be read from a copy; when the output overlaps the input, it must be
 * written to a temporary of *out bytes and copied to *r after (0: not
 * needed). A broadcast's root then copies its input to *r itself. */
void mg__call_resolve(const mg_call *c, int rank, int size, const char **s, char **r,
                      size_t *in, size_t *out);
/* Whether [a, a + an) and [b, b + bn) share a byte (NULL or empty: no). */
bool mg__overlaps(const void *a, size_t an, const void *b, size_t bn);
/* A send or receive, the seq-th to (from) its peer, for messages:
 * "send #3 to rank 1 (100 x f32, tag 7) at a.c:12". */
void mg__call_describe_p2p(const mg_call *c, const mg__names *nm, uint64_t seq, char *buf,
                           size_t n);

#endif
