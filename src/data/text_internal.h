/* Internal to src/data/text.c and its tests: opening a text corpus in two
 * steps, listing its files and then reading them, so that a test can
 * change the files in between, and the default set found in any directory
 * (a test's copy with a file missing or empty). */
#ifndef MG_TEXT_INTERNAL_H
#define MG_TEXT_INTERNAL_H

#include <stdbool.h>
#include "multigrad/data.h"

#define MG__TEXT_DEFAULT_DIR "/usr/share/games/fortunes"
#define MG__TEXT_NUM_DEFAULT 40
extern const char *const mg__text_default_files[MG__TEXT_NUM_DEFAULT];

/* The files of path in reading order (malloc'd paths in a malloc'd array):
 * path NULL: the default set in default_dir (each must exist); a
 * directory: its regular files (symbolic links followed) not starting with
 * '.', in strcmp order; a file: that file. */
mg_status mg__text_list(const char *path, const char *default_dir, char ***files, int *n);
void mg__text_free_list(char **files, int n);
/* Reads and concatenates files[0..n) (an empty one is an error in the
 * default set) and checks the corpus against ctx; `what` names the corpus
 * in messages about it as a whole (the path or the default directory). */
mg_status mg__text_load(const char *what, char *const *files, int n, bool default_set,
                        int ctx, mg_text **out);

#endif
