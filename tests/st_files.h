/* What the safetensors and checkpoint tests share (test_safetensors.c,
 * test_checkpoint.c): paths in the test's directory, whole files read and
 * written, and a count of leftover temporary files. */
#ifndef MGT_ST_FILES_H
#define MGT_ST_FILES_H

#include <stddef.h>
#include <stdint.h>

/* name in the test's directory (4 paths may be held at once). */
const char *mgt_tpath(const char *name);
/* The whole file into *out (malloc'd); its size. */
size_t mgt_read_all(const char *path, uint8_t **out);
/* n bytes at p as the whole file. */
void mgt_write_raw(const char *path, const void *p, size_t n);
/* Temporary files (".tmp." in the name) left in the test's directory. */
int mgt_count_tmp_files(void);

#endif
