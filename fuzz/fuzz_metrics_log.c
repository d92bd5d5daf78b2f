/* libFuzzer target for the trainer's metrics log read back on resume
 * (src/parallel/train_log.c): any bytes, as CSV or JSON lines, of an image
 * or a language model's columns, through mg__log_parse. The rows it keeps
 * must increase in their first figure and end at the checkpoint's.
 *
 * The input: byte 0 picks CSV (bit 0) and the language model's columns
 * (bit 1), byte 1 the last epoch or step to keep; the rest is the log.
 * Seeds: tests/fuzz/metrics_log/. */
#include "common.h"  /* first: it defines _GNU_SOURCE */
#include <math.h>
#include "parallel/train_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) return 0;
    bool csv = data[0] & 1;
    mg__metrics mt = {.text = (data[0] & 2) != 0};
    double upto = data[1];
    mg_status st = mg__log_parse((const char *)data + 2, size - 2, csv, &mt, upto);
    FUZZ_CHECK(st == MG_OK);
    for (int i = 0; i < mt.n; i++) {
        long first = mt.text ? mt.rows[i].step : mt.rows[i].epoch;
        FUZZ_CHECK(first <= upto);
        if (i) FUZZ_CHECK(first > (mt.text ? mt.rows[i - 1].step : mt.rows[i - 1].epoch));
    }
    free(mt.rows);
    return 0;
}
