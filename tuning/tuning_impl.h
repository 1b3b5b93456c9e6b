/* tuning/tuning_impl.h: helpers shared by the files of tuning/ (not public).
 *
 * All file access goes through tuning_fs_*: a path is a root (one of struct
 * tuning_paths) plus a printf-formatted relative part, so nothing in the
 * module names /sys or /proc directly. */
#ifndef EDGELM_TUNING_IMPL_H
#define EDGELM_TUNING_IMPL_H

#include "tuning/tuning.h"

/* root + "/" + formatted rel into buf. -ENAMETOOLONG if it does not fit. */
int tuning_fs_path(char *buf, size_t len, const char *root, const char *fmt, ...) CM_PRINTF(4, 5);
/* Read a small file whole into buf (NUL-terminated, trailing whitespace
 * removed). Returns the length or -errno (-EFBIG if longer than len-1). */
int tuning_fs_read(const char *path, char *buf, size_t len);
int tuning_fs_readf(char *buf, size_t len, const char *root, const char *fmt, ...) CM_PRINTF(4, 5);
/* Read one integer. -EINVAL when the file does not hold one. */
int tuning_fs_read_ll(long long *ret, const char *root, const char *fmt, ...) CM_PRINTF(3, 4);
/* Read a file of any size into a cm_malloc'ed string (*ret, caller frees). */
int tuning_fs_slurp(const char *path, char **ret, size_t *ret_len);
/* Write value to an existing file (O_WRONLY|O_TRUNC, never creates: sysfs
 * attributes exist or the knob does not). Returns 0 or -errno. */
int tuning_fs_write(const char *path, const char *value);
bool tuning_fs_exists(const char *path);
/* "key: value" (or "key value") line lookup in a text such as meminfo or
 * status; copies the value (trimmed) into buf. -ENOENT if absent. */
int tuning_text_field(const char *text, const char *key, char *buf, size_t len);
/* /proc/meminfo style "Key:   123 kB" -> bytes. */
int tuning_text_kib(const char *text, const char *key, uint64_t *ret);
/* The word in [brackets] of "always [madvise] never", or "" */
void tuning_text_bracketed(const char *text, char *buf, size_t len);
/* True when the space-separated list contains word. */
bool tuning_word_in(const char *list, const char *word);
/* 1..63 of [A-Za-z0-9_.:+-]: the only values a state file may hold, since
 * --restore-tuning writes them as root. */
bool tuning_word_is_plain(const char *v);
/* snprintf that always terminates and never warns about truncation. */
void tuning_strlcpy(char *dst, const char *src, size_t len);
/* "1.5 GiB", "512 MiB", "64 KiB" */
void tuning_fmt_bytes(char *buf, size_t len, uint64_t bytes);

/* The boot id of <procfs>/sys/kernel/random/boot_id, or "" */
void tuning_boot_id(const struct tuning_paths *paths, char *buf, size_t len);

/* topology.c */
int tuning_topology_detect(const struct tuning_paths *paths, struct tuning_report *r,
                           struct cm_err *err);
void tuning_topology_classify(struct tuning_report *r);
int tuning_cgroup_detect(const struct tuning_paths *paths, struct tuning_cgroup *cg);
/* governor.c */
int tuning_cpufreq_detect(const struct tuning_paths *paths, struct tuning_report *r,
                          struct cm_err *err);
void tuning_power_owner_detect(const struct tuning_paths *paths, struct tuning_power_owner *o);
/* memory.c */
void tuning_mem_detect(const struct tuning_paths *paths, struct tuning_mem *m);
/* priority.c */
void tuning_priority_detect(const struct tuning_paths *paths, struct tuning_report *r);
int tuning_ioprio_get(int *ret_class, int *ret_level);
int tuning_ioprio_set(int cls, int level);

/* state.c */
struct tuning_change *tuning_state_add(struct tuning_state *s, enum tuning_knob_kind kind,
                                       const char *target, const char *before, const char *after,
                                       bool persistent);
void tuning_change_fail(struct tuning_state *s, struct tuning_change *c, int code, const char *fmt,
                        ...) CM_PRINTF(4, 5);
/* Only files that a state file may name: cpufreq governor / EPP attributes. */
bool tuning_state_target_ok(const char *rel);

/* Ioprio classes as the kernel numbers them. */
#define TUNING_IOPRIO_CLASS_NONE 0
#define TUNING_IOPRIO_CLASS_RT 1
#define TUNING_IOPRIO_CLASS_BE 2
#define TUNING_IOPRIO_CLASS_IDLE 3

#endif
