/* Internal to src/nn: what checkpoint.c (reading) and ckpt_write.c
 * (writing) share of the file format. */
#ifndef MG_NN_CKPT_FORMAT_H
#define MG_NN_CKPT_FORMAT_H

#define FORMAT "multigrad-checkpoint"
#define FORMAT_VERSION "1"
#define NAME_MAX_ 192   /* a tensor's name, optimizer state's "optim.<state>." included */

#endif
