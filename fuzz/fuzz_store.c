/* libFuzzer target for the store protocol: the bytes an authenticated
 * client may send, as a stream of requests, through the same parser and
 * table code the TCP store's server runs (mg__store_parse_hdr,
 * mg__store_apply, kv.c), without sockets. A GET or WAIT that cannot be
 * answered yet is answered again as expired, as the server does at its
 * deadline. Seeds: tests/fuzz/store/. */
#include <stdlib.h>
#include <string.h>
#include "comm/store/store.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mg__kv kv;
    mg__kv_init(&kv);
    size_t p = 0;
    while (size - p >= MG__STORE_HDR) {
        mg__store_req r;
        if (mg__store_parse_hdr(data + p, &r)) break;
        p += MG__STORE_HDR;
        size_t n = (size_t)r.klen + r.vlen;
        if (size - p < n) break;
        /* A buffer of the body's exact size, as the server allocates, so
         * that a read past it is caught. */
        uint8_t *body = malloc(n ? n : 1);
        if (!body) break;
        memcpy(body, data + p, n);
        p += n;
        mg__store_reply out;
        int k = mg__store_apply(&kv, &r, body, false, &out);
        if (k == 0) k = mg__store_apply(&kv, &r, body, true, &out);
        if (k > 0 && out.vlen) {
            uint8_t *copy = malloc(out.vlen); /* as the reply is built */
            if (copy) memcpy(copy, out.val, out.vlen);
            free(copy);
        }
        free(body);
        if (k < 0) break;
    }
    mg__kv_free(&kv);
    return 0;
}
