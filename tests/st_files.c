/* Files for the safetensors and checkpoint tests (st_files.h). */
#include <dirent.h>
#include "harness.h"
#include "st_files.h"

const char *mgt_tpath(const char *name)
{
    static char path[4][512];
    static int k;
    char *p = path[k++ % 4];
    snprintf(p, 512, "%s/%s", mgt_tmpdir(), name);
    return p;
}

size_t mgt_read_all(const char *path, uint8_t **out)
{
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    *out = malloc((size_t)n + 1);
    CHECK(*out && fread(*out, 1, (size_t)n, f) == (size_t)n);
    fclose(f);
    return (size_t)n;
}

void mgt_write_raw(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    CHECK(fwrite(p, 1, n, f) == n);
    CHECK(fclose(f) == 0);
}

/* No leftover temporary files in the test directory. */
int mgt_count_tmp_files(void)
{
    DIR *d = opendir(mgt_tmpdir());
    CHECK(d != NULL);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d))) n += strstr(e->d_name, ".tmp.") != NULL;
    closedir(d);
    return n;
}
