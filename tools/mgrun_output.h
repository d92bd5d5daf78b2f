/* mgrun's forwarding of its workers' output (tools/mgrun.c): each
 * worker's stdout and stderr are read from pipes in the poll loop and
 * written to mgrun's own, under --tag-output each line whole behind its
 * rank's "[R]: " prefix, gathered and written in large pieces (a system
 * call per line would cost more than the line). A line longer than
 * LINE_CAP is forwarded in pieces, the first prefixed. If mgrun's own
 * output is closed (mgrun | head) it keeps draining the workers.
 *
 * A header of static functions because each tool is one source file (the
 * Makefile builds one binary per file of tools/). */
#ifndef MGRUN_OUTPUT_H
#define MGRUN_OUTPUT_H

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LINE_CAP 65536          /* longer lines are forwarded in pieces */

/* A worker's stdout or stderr under --tag-output: lines are collected
 * so that each one reaches mgrun's output whole, behind its prefix. */
typedef struct {
    int fd;                     /* read end; -1 once closed */
    int out_fd;                 /* 1 or 2 */
    int rank;
    char *buf;
    size_t len;
    bool mid_line;              /* a piece of a long line went out already */
} stream;

static bool out_broken[3];     /* mgrun's stdout/stderr closed (EPIPE) */

static void write_out(int fd, const char *p, size_t n)
{
    while (n > 0 && !out_broken[fd]) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            out_broken[fd] = true;   /* e.g. mgrun | head: keep draining workers */
            return;
        }
        p += w;
        n -= (size_t)w;
    }
}

/* Forwarded output is gathered here and written in large pieces (one
 * write per line would cost a system call per line); it is flushed at
 * line boundaries, before pump returns. */
#define OUT_CAP (4 * LINE_CAP)
static struct { char buf[OUT_CAP]; size_t len; } outq[3];

static void out_flush(int fd)
{
    write_out(fd, outq[fd].buf, outq[fd].len);
    outq[fd].len = 0;
}

/* Queues p[0..n) (a whole line, or a piece of a long one), prefixed when
 * it starts a line; `newline` ends an unterminated last line at EOF. */
static void emit(stream *s, const char *p, size_t n, bool newline)
{
    int fd = s->out_fd;
    if (outq[fd].len + n + 32 > OUT_CAP) out_flush(fd);
    char *out = outq[fd].buf + outq[fd].len;
    size_t k = 0;
    if (!s->mid_line) k = (size_t)snprintf(out, 32, "[%d]: ", s->rank);
    memcpy(out + k, p, n);
    k += n;
    if (newline) out[k++] = '\n';
    outq[fd].len += k;
    s->mid_line = !(newline || (n > 0 && p[n - 1] == '\n'));
}

/* Reads what is available, at most max_reads times so that a chatty
 * worker cannot keep the loop from its other duties; forwards complete
 * lines. Returns false at EOF. */
static bool pump(stream *s, int max_reads)
{
    for (int reads = 0; reads < max_reads; reads++) {
        ssize_t r = read(s->fd, s->buf + s->len, LINE_CAP - s->len);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && errno == EAGAIN) break;
        if (r <= 0) {   /* EOF, or an error that ends this stream */
            if (s->len > 0 || s->mid_line) emit(s, s->buf, s->len, true);
            s->len = 0;
            out_flush(s->out_fd);
            return false;
        }
        s->len += (size_t)r;
        size_t start = 0;
        for (size_t i = s->len - (size_t)r; i < s->len; i++)
            if (s->buf[i] == '\n') {
                emit(s, s->buf + start, i + 1 - start, false);
                start = i + 1;
            }
        memmove(s->buf, s->buf + start, s->len - start);
        s->len -= start;
        if (s->len == LINE_CAP) {
            emit(s, s->buf, s->len, false);
            s->len = 0;
        }
    }
    out_flush(s->out_fd);
    return true;
}

static void close_stream(stream *s)
{
    if (s->fd >= 0) close(s->fd);
    s->fd = -1;
    free(s->buf);
    s->buf = NULL;
}

#endif
