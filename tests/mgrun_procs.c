/* The mgrun tests' shared process helpers (mgrun_procs.h). */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "harness.h"
#include "mgrun_procs.h"
#include "multigrad/core.h"

pid_t mgr_start(const char *name, const char *const *args)
{
    static char tool[512];
    snprintf(tool, sizeof tool, "%s", mgt_tool("mgrun"));
    CHECK_MSG(access(tool, X_OK) == 0, "%s not built: run make -j2 all (or set MG_BIN)", tool);
    const char *argv[64] = {tool};
    int n = 1;
    while (args[n - 1]) { MG_ASSERT(n < 63); argv[n] = args[n - 1]; n++; }
    argv[n] = NULL;
    char out[600], err[600];
    snprintf(out, sizeof out, "%s/%s.out", mgt_tmpdir(), name);
    snprintf(err, sizeof err, "%s/%s.err", mgt_tmpdir(), name);
    return mgt_spawn(argv, out, err, false, NULL);
}

void mgr_finish(const char *name, pid_t pid, double t0, double timeout, mgr_result *r)
{
    int st;
    while (waitpid(pid, &st, WNOHANG) == 0) {
        if (mg_now() - t0 > timeout) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            CHECK_MSG(0, "mgrun still running after %g s", timeout);
        }
        usleep(2000);
    }
    r->status = st;
    r->secs = mg_now() - t0;
    char path[600];
    snprintf(path, sizeof path, "%s/%s.out", mgt_tmpdir(), name);
    mgt_read_into(path, r->out, sizeof r->out);
    snprintf(path, sizeof path, "%s/%s.err", mgt_tmpdir(), name);
    mgt_read_into(path, r->err, sizeof r->err);
}

void mgr_two_nodes(const char *const *args, int port, mgr_result *r[2])
{
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    pid_t pid[2];
    double t0 = mg_now();
    for (int node = 1; node >= 0; node--) {
        const char *argv[64] = {"--nnodes", "2", "--node-rank", node ? "1" : "0",
                                "--master-addr", "127.0.0.1", "--master-port", ps};
        int n = 8;
        for (int i = 0; args[i]; i++) { MG_ASSERT(n < 63); argv[n++] = args[i]; }
        argv[n] = NULL;
        pid[node] = mgr_start(node ? "node1" : "node0", argv);
    }
    for (int node = 0; node < 2; node++)
        mgr_finish(node ? "node1" : "node0", pid[node], t0, 60, r[node]);
}
