/* tests/unit/test_tuning_fake.h: fake sysfs/procfs trees for the tuning
 * tests. Each call of fake_tree() writes a fresh copy of a modelled box
 * (tests/data/tuning/mktree.sh) under $TEST_TMPDIR, so tests may change it
 * freely; fake_cleanup() removes them all. */
#ifndef EDGELM_TEST_TUNING_FAKE_H
#define EDGELM_TEST_TUNING_FAKE_H

#include "tests/test.h"
#include "tuning/tuning.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char fake_dirs[64][400];
static int fake_n_dirs;

/* The generator, found from the tree's top (where `make check` runs) or
 * next to this file. */
CM_UNUSED static const char *fake_script(void)
{
	static char buf[1024];
	const char *rel = "tests/data/tuning/mktree.sh";
	if (test_file_exists(rel))
		return rel;
	snprintf(buf, sizeof(buf), "%s", __FILE__);
	char *slash = strrchr(buf, '/');
	if (slash)
		snprintf(slash, sizeof(buf) - (size_t)(slash - buf), "/../data/tuning/mktree.sh");
	return buf;
}

/* Writes box into a new directory and fills paths. Returns 0 or -1. */
CM_UNUSED static int fake_tree(const char *box, struct tuning_paths *paths)
{
	static int seq;
	char dir[400], cmd[2048];
	snprintf(dir, sizeof(dir), "%s/tuning-%ld-%s-%d", test_tmpdir(), (long)getpid(), box,
	         seq++);
	snprintf(cmd, sizeof(cmd), "sh '%s' '%s' '%s'", fake_script(), box, dir);
	if (system(cmd) != 0) {
		fprintf(stderr, "fake_tree: '%s' failed\n", cmd);
		return -1;
	}
	if (fake_n_dirs < (int)(sizeof(fake_dirs) / sizeof(fake_dirs[0])))
		snprintf(fake_dirs[fake_n_dirs++], sizeof(fake_dirs[0]), "%s", dir);
	memset(paths, 0, sizeof(*paths));
	snprintf(paths->sysfs_root, sizeof(paths->sysfs_root), "%s/sys", dir);
	snprintf(paths->procfs_root, sizeof(paths->procfs_root), "%s/proc", dir);
	snprintf(paths->run_root, sizeof(paths->run_root), "%s/run", dir);
	snprintf(paths->cgroup_root, sizeof(paths->cgroup_root), "%s/sys/fs/cgroup", dir);
	snprintf(paths->state_file, sizeof(paths->state_file), "%s/run/edgelm/tuning.state", dir);
	return 0;
}

/* Under tests/run-tests.sh $TEST_TMPDIR goes as a whole at the end (and
 * unlinking thousands of files is slow on this box's disk): only clean up
 * when run by hand. */
CM_UNUSED static void fake_cleanup(void)
{
	const char *t = getenv("TEST_TMPDIR");
	if (t && *t)
		return;
	static char cmd[64 * 420 + 16];
	size_t n = (size_t)snprintf(cmd, sizeof(cmd), "rm -rf");
	for (int i = 0; i < fake_n_dirs && n < sizeof(cmd); i++)
		n += (size_t)snprintf(cmd + n, sizeof(cmd) - n, " '%s'", fake_dirs[i]);
	if (fake_n_dirs && system(cmd) != 0)
		fprintf(stderr, "fake_cleanup: rm -rf failed\n");
	fake_n_dirs = 0;
}

/* Write/read a file below a root ("sys" tree, "proc" tree, ...). */
CM_UNUSED static int fake_write(const char *root, const char *rel, const char *value)
{
	char path[1024];
	snprintf(path, sizeof(path), "%s/%s", root, rel);
	/* make parents */
	for (char *p = path + strlen(root) + 1; (p = strchr(p, '/')); p++) {
		*p = '\0';
		mkdir(path, 0755);
		*p = '/';
	}
	FILE *f = fopen(path, "w");
	if (!f)
		return -1;
	fprintf(f, "%s\n", value);
	return fclose(f) == 0 ? 0 : -1;
}

CM_UNUSED static const char *fake_read(const char *root, const char *rel)
{
	static char buf[4][256];
	static int k;
	char *b = buf[k++ % 4];
	char path[1024];
	snprintf(path, sizeof(path), "%s/%s", root, rel);
	FILE *f = fopen(path, "r");
	b[0] = '\0';
	if (!f)
		return "(missing)";
	if (!fgets(b, 256, f))
		b[0] = '\0';
	fclose(f);
	size_t n = strlen(b);
	while (n && (b[n - 1] == '\n' || b[n - 1] == ' '))
		b[--n] = '\0';
	return b;
}

/* A copy of box shared by read-only tests: generated once per process. */
CM_UNUSED static int fake_shared(const char *box, struct tuning_paths *paths)
{
	static struct {
		char box[32];
		struct tuning_paths paths;
	} cache[8];
	static int n;
	for (int i = 0; i < n; i++)
		if (strcmp(cache[i].box, box) == 0) {
			*paths = cache[i].paths;
			return 0;
		}
	if (fake_tree(box, paths) < 0)
		return -1;
	if (n < 8) {
		snprintf(cache[n].box, sizeof(cache[n].box), "%s", box);
		cache[n++].paths = *paths;
	}
	return 0;
}

/* Detect a fresh copy of box; returns 0 when report is filled. */
CM_UNUSED static int fake_detect(const char *box, struct tuning_paths *paths,
                                 struct tuning_report *r)
{
	struct cm_err err = {0};
	tuning_report_init(r);
	if (fake_tree(box, paths) < 0)
		return -1;
	int ret = tuning_detect(paths, r, &err);
	if (ret < 0)
		fprintf(stderr, "tuning_detect(%s): %d %s\n", box, ret, err.msg);
	return ret;
}

/* A config that touches only the cpufreq knobs (tests must not renice or
 * re-pin the test process itself). */
CM_UNUSED static void config_cpufreq_only(struct tuning_config *c)
{
	tuning_config_default(c);
	c->pin = false;
	c->nice = TUNING_KEEP;
	c->load_ioprio = TUNING_IOPRIO_KEEP;
	c->mlock = TUNING_MLOCK_OFF;
	c->prefault = false;
	c->numa = TUNING_NUMA_OFF;
	c->amx = false;
}

#endif
