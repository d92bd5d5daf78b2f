/* Internal to src/comm: collectives on GPU memory through NCCL (nccl.c),
 * for groups whose ranks each have a GPU of their own.
 *
 * mg_group_use_device (group.c) asks every rank what it has (its host,
 * the PCI bus id of its GPU, whether libnccl.so.2 loads) and, when the
 * plan allows, opens an NCCL communicator for the group. From then on
 * work.c routes each collective whose buffers lie in that GPU's memory
 * (mg__nccl_takes) here instead of staging it through the host: at issue
 * an event marks the work queued before it on the GPU (mg__nccl_issue); on
 * the executing thread the call is queued on NCCL's own stream behind that
 * event, and polled to completion against the group's deadline, the
 * communicator aborted on failure (mg__nccl_run). Requests still run one
 * at a time in issue order, so NCCL's calls and the backend's interleave
 * as issued. Sends and receives, barriers and buffers in host memory stay
 * with the backend. */
#ifndef MG_COMM_NCCL_H
#define MG_COMM_NCCL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "comm/backend.h"
#include "multigrad/device.h"

typedef struct mg__nccl mg__nccl;

/* What a rank says of itself when its group chooses the path of device
 * collectives (all-gathered as bytes). */
typedef struct mg__nccl_peer {
    uint64_t host;      /* NCCL_HOSTID's hash, else the host name's and boot id's */
    char bus[24];       /* its GPU's PCI bus id; "" when its device is no GPU */
    int32_t loaded;     /* NCCL loaded on this rank */
    int32_t version;    /* NCCL's version code there (ncclGetVersion), else 0 */
} mg__nccl_peer;

/* Whether the n ranks that said p[] can share an NCCL communicator: each
 * on a GPU, no two on one GPU of one host, NCCL loaded on every rank, one
 * version of it. If not, why (naming the first rank at fault as nm names
 * it; nm may be NULL) in why. */
bool mg__nccl_plan(const mg__nccl_peer *p, int n, const mg__names *nm, char *why, size_t cap);

/* This rank's mg__nccl_peer for device d; loads NCCL when d is a GPU. */
void mg__nccl_me(mg_device d, mg__nccl_peer *me);

/* Collective over g (idle; its host collectives carry the exchange): the
 * communicator on GPU d of every rank (the plan allowed it). An error
 * when NCCL fails on any rank; every rank then returns one. */
mg_status mg__nccl_open(mg_group *g, mg_device d, mg__nccl **out);

/* Whether NCCL runs request r of rank `rank` of `size` on n: a
 * collective other than the barrier whose used buffers are all in n's
 * GPU memory and overlap only in NCCL's in-place forms. */
bool mg__nccl_takes(const mg__nccl *n, const mg__req *r, int rank, int size);
/* At issue, on the caller's thread: the GPU work queued so far marked
 * for r to follow (and sparse memory it uses made resident). */
mg_status mg__nccl_issue(mg__nccl *n, mg__req *r, int rank, int size);
/* Drops what issue made for r (also when r never ran). */
void mg__nccl_release(mg__req *r);
/* Runs r (issued) on g's communicator; complete on return. */
mg_status mg__nccl_run(mg_group *g, mg__req *r);
/* The group failed: the communicator aborted (its kernels stopped). */
void mg__nccl_abort(mg__nccl *n);
/* Frees n (no request in flight). */
void mg__nccl_close(mg__nccl *n);

#endif
