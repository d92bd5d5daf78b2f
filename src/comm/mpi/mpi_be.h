/* Internal to the Open MPI backend (backend_mpi.c, p2p_mpi.c): a group's
 * state, the lock around MPI calls, and what the two files share. Only in
 * builds with MPI (MG_HAVE_MPI). */
#ifndef MG_COMM_MPI_MPI_BE_H
#define MG_COMM_MPI_MPI_BE_H

#ifdef MG_HAVE_MPI
#include <mpi.h>
#include <pthread.h>
#include "comm/backend.h"
#include "comm/call.h"
#include "comm/transport/transport.h"

#define TAG_ABORT 1                 /* failure notices, on a group's ctl */
#define CHUNK ((size_t)1 << 30)     /* elements per MPI call when splitting */

/* A buffered send still in flight. */
typedef struct pend {
    struct pend *next;
    MPI_Request rq;
    void *copy;
    size_t bytes;
    int peer, tag;
} pend;

typedef struct {
    mg_group *g;
    MPI_Comm comm, ctl;          /* operations; failure notices */
    mg__spin_cfg spin;
    double deadline;             /* of the request being run */
    char what[200];              /* the request, for messages */
    char me[128];                /* this rank's name in them (mg__mpi_this_rank()) */
    void *scratch;
    size_t scratch_bytes;
    pend *sends, *sends_tail;
    size_t pend_bytes, pend_max;
    int check;                   /* MG_MPI_CHECK */
    /* failure notices to the peers, in flight (abort) */
    char notice[1024];
    MPI_Request *notice_rq;
    int nnotice;
} mpi_be;


/* An MPI call, under the lock when MPI is only MPI_THREAD_SERIALIZED;
 * its return code also lands in the caller's mpi_rc. */
extern pthread_mutex_t mg__mpi_call_mu;
extern int mg__mpi_serialize;
/* A request passed its deadline and may never complete (a peer stopped or
 * stuck): at exit MPI_Finalize may wait for it for ever, so the process
 * leaves without it after MG_PEER_TIMEOUT (backend_mpi.c). */
void mg__mpi_mark_stuck(void);
#define LOCKED(expr) ({                                                  \
        if (mg__mpi_serialize) pthread_mutex_lock(&mg__mpi_call_mu);     \
        mpi_rc = (expr);                                                 \
        if (mg__mpi_serialize) pthread_mutex_unlock(&mg__mpi_call_mu);   \
        mpi_rc; })

/* backend_mpi.c: how messages name this rank; the request being run
 * (m->what) failed in MPI with rc; a dtype's MPI type. */
const char *mg__mpi_this_rank(mpi_be *m);
mg_status mg__mpi_error(mpi_be *m, int rc);
MPI_Datatype mg__mpi_type(mg_dtype t);

/* p2p_mpi.c: rq polled until it completes, a peer's failure notice, or
 * the deadline; buffered sends completed (the finished ones, or with
 * block all of them down to `keep` bytes in flight); a send and a
 * receive (r's, from one rank or any of a set). */
mg_status mg__mpi_wait_req(mpi_be *m, MPI_Request *rq, MPI_Status *status);
mg_status mg__mpi_reap_sends(mpi_be *m, int block, size_t keep);
mg_status mg__mpi_send(mpi_be *m, const mg_call *c);
mg_status mg__mpi_recv(mpi_be *m, mg__req *r);

#endif /* MG_HAVE_MPI */
#endif
