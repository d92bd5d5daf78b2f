/* multigrad — errors.
 *
 * Functions that can fail for reasons outside the program (I/O, bad files,
 * peers, timeouts, allocation) return mg_status (0 = MG_OK) and leave a
 * message for mg_last_error(): what failed, where, and how to fix it.
 * Violated invariants (programmer errors) abort through MG_ASSERT.
 * The message is per thread. */
#ifndef MULTIGRAD_STATUS_H
#define MULTIGRAD_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef int mg_status;

enum {
    MG_OK = 0,
    MG_EINVAL,      /* bad argument or flag */
    MG_EIO,         /* file or socket I/O failed */
    MG_ENOMEM,      /* allocation failed */
    MG_EFORMAT,     /* a file or message is malformed */
    MG_ETIMEOUT,    /* a deadline passed */
    MG_EPEER,       /* a peer died or closed its connection */
    MG_EAUTH,       /* authentication failed */
    MG_EMISMATCH,   /* ranks disagree (collective, count, world size, model) */
    MG_EUNSUPPORTED, /* not available in this build or configuration */
    MG_ELEFT,       /* this rank's peers took it as lost and went on without it (a group
                       that contains peer failures, mg_group_contain_peer_failures) */
    MG_ESTOPPED,    /* another rank failed first and says why; this one stops without a
                       message to tell (mg_group_agree's MG_AGREE_LEAVE_FIRST; a mistake in
                       the flags that rank 0 of a launched job finds alike) */
    MG_EDIVERGED    /* training diverged: its loss is no longer a finite number
                       (mg_trainer_run stops there, keeping the last checkpoint) */
};

/* Record an error message (printf-style) for this thread; returns code.
 * The arguments may include mg_last_error() (wrapping it in context). */
mg_status mg_error(mg_status code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* The last message recorded on this thread ("" if none), and its code
 * (MG_OK if none). */
const char *mg_last_error(void);
mg_status mg_last_error_code(void);
/* msg past a leading "rank R: " or "rank R (LABEL): " (group errors name
 * their rank by its world rank R, comm.h; a caller that names the rank
 * itself, or forwards the message to its peers, says it once). */
const char *mg_error_past_rank(const char *msg, int rank);
/* The short name of a status code ("MG_EIO"). */
const char *mg_status_name(mg_status s);

void mg__assert_fail(const char *expr, const char *file, int line)
    __attribute__((noreturn));
#define MG_ASSERT(cond) \
    ((cond) ? (void)0 : mg__assert_fail(#cond, __FILE__, __LINE__))

/* Propagate a failing status. */
#define MG_TRY(expr) do { mg_status mg__s = (expr); if (mg__s) return mg__s; } while (0)

/* A pointer argument of a library call that must be given: MG_EINVAL
 * naming it when it is NULL. */
#define MG_NEED(fn, p)                                                        \
    do {                                                                      \
        if (!(p)) return mg_error(MG_EINVAL, "%s: %s is NULL", fn, #p);       \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif
