/* The shared library as `make install` puts it: its SONAME carries the
 * version's major.minor, it exports the public API alone (no mg__
 * internals but the three its macros call, no device kernels' C++ names),
 * and a program built against it and the public headers runs
 * (examples/allreduce.c over 2 ranks). The build itself links the static
 * library, so the shared one is checked here. */
#include <limits.h>
#include <stdlib.h>
#include "harness.h"
#include "multigrad/core.h"

TEST_T(shared_library_exports_the_api_alone_and_runs_a_program, 120)
{
    char lib[PATH_MAX], root[PATH_MAX];
    if (!realpath(mgt_tool("../lib/libmultigrad.so"), lib))
        mgt_skip("%s is not built (make lib, or make all)", mgt_tool("../lib/libmultigrad.so"));
    if (mgt_sanitized())   /* its objects want the sanitizer's runtime first */
        mgt_skip("a sanitizer build's shared library needs its runtime preloaded");
    CHECK(realpath(mgt_tool("../.."), root));
    int major = 0, minor = 0;
    CHECK(sscanf(MG_VERSION, "%d.%d", &major, &minor) == 2);
    char *out;
    int rc = mgt_sh(&out, "readelf -d %s | grep SONAME", lib);
    char want[64];
    snprintf(want, sizeof want, "[libmultigrad.so.%d.%d]", major, minor);
    CHECK_MSG(rc == 0 && strstr(out, want), "wanted %s: %s", want, out);
    free(out);
    rc = mgt_sh(&out, "nm -D --defined-only %s | awk '{print $3}' | grep -v '^mg_[^_]' | "
                "grep -v -x -e mg__assert_fail -e mg__batch -e mg__sendrecv_user", lib);
    CHECK_MSG(rc == 1 && !*out, "exported beyond the API: %.2000s", out);
    free(out);
    rc = mgt_sh(&out, "nm -D --defined-only %s | grep -c ' T mg_run$\\| T mg_group_init$\\| T "
                "mg_trainer_run$'", lib);   /* the collectives are macros over mg_run */
    CHECK_MSG(rc == 0 && atoi(out) == 3, "%s", out);
    free(out);
    /* A program of the public headers and the library alone, found by its
     * SONAME as an installed one is. */
    const char *t = mgt_tmpdir();
    rc = mgt_sh(&out, "ln -s %s %s/libmultigrad.so.%d.%d && ln -s %s %s/libmultigrad.so && "
                "cc -o %s/allreduce %s/examples/allreduce.c -I%s/include -L%s -lmultigrad && "
                "LD_LIBRARY_PATH=%s %s -n 2 %s/allreduce", lib, t, major, minor, lib, t, t, root,
                root, t, t, mgt_tool("mgrun"), t);
    CHECK_MSG(rc == 0 && mgt_count(out, "sum 1 (expected 1), token 42") == 2, "%s", out);
    free(out);
}

/* Each public header alone in C99 -pedantic (a typedef given twice broke
 * it), and every collective and point-to-point macro in C++ (they took a
 * compound literal's address, which C++ refuses; found by a probe). */
TEST_T(public_headers_compile_alone_in_c99_and_their_macros_in_cpp, 120)
{
    char root[PATH_MAX], *out;
    CHECK(realpath(mgt_tool("../.."), root));
    int rc = mgt_sh(&out, "cd %s/include && for h in multigrad/*.h; do echo \"#include <$h>\" | "
                    "cc -std=c99 -pedantic -Wall -Wextra -Werror -I. -x c -fsyntax-only - || "
                    "echo \"FAILED: $h\"; done", root);
    CHECK_MSG(rc == 0 && !strstr(out, "FAILED"), "%s", out);
    free(out);
    const char *t = mgt_tmpdir();
    char src[PATH_MAX];
    snprintf(src, sizeof src, "%s/calls.cc", t);
    FILE *f = fopen(src, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs("#include <multigrad/multigrad.h>\n"
          "int calls(mg_group *g, float *x, int32_t *y, int *src, mg_work **w) {\n"
          "    int from[2] = {0, 1};\n"
          "    int s = mg_broadcast(g, x, 4, MG_F32, 0) | mg_reduce(g, x, x, 4, MG_F32, MG_SUM, 0)\n"
          "        | mg_all_reduce(g, MG_IN_PLACE, x, 4, MG_F32, MG_SUM)\n"
          "        | mg_all_gather(g, x, x, 4, MG_F32) | mg_gather(g, x, x, 4, MG_F32, 0)\n"
          "        | mg_scatter(g, x, x, 4, MG_F32, 0) | mg_all_to_all(g, x, x, 4, MG_F32)\n"
          "        | mg_reduce_scatter(g, x, x, 4, MG_F32, MG_SUM) | mg_barrier(g)\n"
          "        | mg_send(g, y, 4, MG_I32, 1, 0) | mg_recv(g, y, 4, MG_I32, 1, 0)\n"
          "        | mg_recv_any(g, y, 4, MG_I32, from, 2, 0, src)\n"
          "        | mg_all_reduce_async(g, MG_IN_PLACE, x, 4, MG_F32, MG_SUM, w)\n"
          "        | mg_broadcast_async(g, x, 4, MG_F32, 0, w) | mg_barrier_async(g, w)\n"
          "        | mg_all_to_all_async(g, x, x, 4, MG_F32, w)\n"
          "        | mg_isend(g, y, 4, MG_I32, 1, 0, w) | mg_irecv(g, y, 4, MG_I32, 1, 0, w)\n"
          "        | mg_irecv_any(g, y, 4, MG_I32, from, 2, 0, src, w);\n"
          "    return s;\n}\n", f);
    fclose(f);
    rc = mgt_sh(&out, "c++ -std=c++20 -Wall -Werror -I%s/include -fsyntax-only %s", root, src);
    CHECK_MSG(rc == 0, "%s", out);
    free(out);
}
