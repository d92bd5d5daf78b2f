/* Names of ranks in messages: a group's rank r is "rank W (LABEL)", W its
 * rank in the world group and LABEL what that rank called itself
 * (mg_group_set_label; a mesh gives its coordinates), so that a line from
 * any sub-group of a job names a rank the way the launcher and every other
 * group do. A sub-group learns its members' world ranks and labels from
 * its parent when mg_group_split forms it: it knows every parent rank's
 * (color, key), hence which parent ranks it holds. Only messages use the
 * names; the rank numbers the algorithms, transports and calls use stay
 * the group's own.
 *
 * Limits: a label is set by all-gathering it (collective); it reaches the
 * sub-groups split after it was set, not those split before. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "comm/names.h"
#include "multigrad/core.h"

#define LABEL (MG_GROUP_LABEL_MAX + 1)

static bool has(const mg__names *nm, int r) { return nm && r >= 0 && r < nm->n; }

int mg__world_rank(const mg__names *nm, int r)
{
    return has(nm, r) && nm->world ? nm->world[r] : r;
}

const char *mg__rank_name(const mg__names *nm, int r, const char *extra, char *buf, size_t cap)
{
    const char *label = has(nm, r) && nm->label ? nm->label[r] : "";
    if (!extra) extra = "";
    int w = mg__world_rank(nm, r);
    if (*label && *extra) snprintf(buf, cap, "rank %d (%s; %s)", w, label, extra);
    else if (*label || *extra) snprintf(buf, cap, "rank %d (%s)", w, *label ? label : extra);
    else snprintf(buf, cap, "rank %d", w);
    return buf;
}

int mg__split_members(const int32_t *ck, int n, int color, int *members)
{
    int count = 0;
    for (int q = 0; q < n; q++) {
        if (ck[2 * q] != color) continue;
        /* Insertion by (key, parent rank): q grows, so ties stay in order. */
        int i = count++;
        while (i > 0 && ck[2 * members[i - 1] + 1] > ck[2 * q + 1]) {
            members[i] = members[i - 1];
            i--;
        }
        members[i] = q;
    }
    return count;
}

mg_status mg__names_sub(mg__names *sub, const mg__names *parent, const int *members, int n)
{
    mg__names_free(sub);
    sub->world = malloc(sizeof *sub->world * (size_t)(n ? n : 1));
    sub->label = parent->label ? calloc((size_t)(n ? n : 1), LABEL) : NULL;
    if (!sub->world || (parent->label && !sub->label)) {
        mg__names_free(sub);
        return mg_error(MG_ENOMEM, "mg_group_split: out of memory");
    }
    sub->n = n;
    for (int i = 0; i < n; i++) {
        sub->world[i] = mg__world_rank(parent, members[i]);
        if (sub->label) memcpy(sub->label[i], parent->label[members[i]], LABEL);
    }
    return MG_OK;
}

mg_status mg__names_set_labels(mg__names *nm, int n, const char *labels)
{
    if (!nm->label) {
        nm->label = calloc((size_t)(n ? n : 1), LABEL);
        if (!nm->label) return mg_error(MG_ENOMEM, "mg_group_set_label: out of memory");
    }
    nm->n = n;
    for (int r = 0; r < n; r++) {
        char *l = nm->label[r];
        memcpy(l, labels + (size_t)r * LABEL, LABEL);
        l[LABEL - 1] = 0;
        for (char *c = l; *c; c++)
            if (*c < 32 || *c > 126 || strchr("();", *c)) *c = '?';
    }
    return MG_OK;
}

mg_status mg__label_check(const char *label)
{
    if (!label) return MG_OK;
    size_t n = strlen(label);
    if (n > MG_GROUP_LABEL_MAX)
        return mg_error(MG_EINVAL, "mg_group_set_label: '%s' has %zu characters: give at most %d",
                        label, n, MG_GROUP_LABEL_MAX);
    for (const char *c = label; *c; c++)
        if (*c < 32 || *c > 126 || strchr("();", *c))
            return mg_error(MG_EINVAL, "mg_group_set_label: '%s' has a '%c' (character %d): "
                            "give printable characters other than parentheses and ';'", label,
                            *c < 32 || *c > 126 ? '?' : *c, (int)(c - label) + 1);
    return MG_OK;
}

void mg__names_free(mg__names *nm)
{
    free(nm->world);
    free(nm->label);
    *nm = (mg__names){0};
}
