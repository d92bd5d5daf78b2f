/* What the mgrun tests share (test_mgrun.c, test_mgrun_nodes.c): mgrun
 * started with its output in files of the test's directory, waited for
 * with a deadline, and two mgruns --nnodes 2 on this host as on two
 * nodes. */
#ifndef MGT_MGRUN_PROCS_H
#define MGT_MGRUN_PROCS_H

#include <sys/types.h>
#include <sys/wait.h>

typedef struct {
    int status;          /* as from waitpid */
    double secs;
    char out[200000], err[8192];
} mgr_result;

#define EXITED(r, code) (WIFEXITED((r)->status) && WEXITSTATUS((r)->status) == (code))

/* Starts mgrun with args (NULL-terminated), its stdout and stderr going
 * to the files NAME.out and NAME.err in the test's directory. */
pid_t mgr_start(const char *name, const char *const *args);
/* Waits for mgrun NAME (started at t0; killed and failed after timeout
 * seconds): its status, time and output in r. */
void mgr_finish(const char *name, pid_t pid, double t0, double timeout, mgr_result *r);
/* Starts two mgrun --nnodes 2 on this host as on two (node ranks 0 and
 * 1, 127.0.0.1:port; node 1 first, as it may come up before node 0),
 * each with the given arguments before PROGRAM, and waits for both:
 * node k's output in r[k]. */
void mgr_two_nodes(const char *const *args, int port, mgr_result *r[2]);

#endif
