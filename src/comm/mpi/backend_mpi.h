/* The Open MPI backend (backend_mpi.c): the group API carried by MPI, for
 * jobs started with mpirun. Only in builds with MPI (MG_HAVE_MPI). */
#ifndef MG_COMM_MPI_BACKEND_MPI_H
#define MG_COMM_MPI_BACKEND_MPI_H

#include "comm/backend.h"

#ifdef MG_HAVE_MPI
extern const mg__backend mg__backend_mpi;
#endif

#endif
