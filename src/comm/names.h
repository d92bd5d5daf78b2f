/* How a group's messages name its ranks (names.c). */
#ifndef MG_COMM_NAMES_H
#define MG_COMM_NAMES_H

#include <stddef.h>
#include <stdint.h>
#include "multigrad/comm.h"

/* A group's members as messages name them: each member's rank in the world
 * group and the label it gave itself. Zeroed, it names the world group
 * itself (member r is world rank r, no labels). */
typedef struct mg__names {
    int n;                                  /* members, where the arrays exist */
    int32_t *world;                         /* per member; NULL: r itself */
    char (*label)[MG_GROUP_LABEL_MAX + 1];  /* per member, "" for none; NULL: none */
} mg__names;

/* "rank 3", "rank 3 (pp 1, dp 1)"; with extra (may be NULL), "rank 3 (pp 1,
 * dp 1; pid 7, this host)" or "rank 3 (pid 7, this host)". nm NULL: r as it
 * is. Returns buf. */
const char *mg__rank_name(const mg__names *nm, int r, const char *extra, char *buf, size_t cap);
/* Member r's rank in the world group. */
int mg__world_rank(const mg__names *nm, int r);

/* The members of mg_group_split's sub-group of `color`, from every parent
 * rank q's (color, key) at ck[2q], ck[2q + 1]: their parent ranks into
 * members[] (room for n), in sub-group order (key, then parent rank).
 * Returns how many. */
int mg__split_members(const int32_t *ck, int n, int color, int *members);
/* sub names parent's ranks members[0..n): their world ranks and labels. */
mg_status mg__names_sub(mg__names *sub, const mg__names *parent, const int *members, int n);
/* Every member's label, n of them at MG_GROUP_LABEL_MAX + 1 bytes each
 * (what mg_group_set_label all-gathers); what is not printable becomes '?'. */
mg_status mg__names_set_labels(mg__names *nm, int n, const char *labels);
/* Checks a label mg_group_set_label is given (NULL is none). */
mg_status mg__label_check(const char *label);
void mg__names_free(mg__names *nm);

#endif
