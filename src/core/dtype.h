/* Internal: the one table of element types (mg_dtype, core.h), shared by
 * the communication layer and the safetensors reader and writer. */
#ifndef MG_CORE_DTYPE_H
#define MG_CORE_DTYPE_H

#include "multigrad/core.h"

typedef struct mg__dtype_info {
    const char *name;       /* "f32": messages and benchmark output */
    const char *st_name;    /* "F32": the safetensors spelling */
    size_t size;            /* bytes per element */
} mg__dtype_info;
extern const mg__dtype_info mg__dtypes[MG_DTYPE_COUNT];

#endif
