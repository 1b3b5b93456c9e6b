/* monitor/sample_proc.c: the watched process and its threads.
 *
 * Process-wide: /proc/<pid>/stat (utime, stime, majflt and num_threads are
 * summed over the thread group by the kernel, exited threads included) and
 * /proc/<pid>/status (VmRSS, VmLck, VmSwap).
 *
 * Per thread, /proc/<pid>/task/<tid>/: stat (name, utime, stime), schedstat
 * (run time and run_delay in ns: run_delay is the time spent runnable but
 * waiting for a CPU, the most direct measure of "someone else has our core";
 * run time is exact where utime/stime count ticks) and status (voluntary and
 * involuntary context switches; /proc/<pid>/status shows only the main
 * thread's). The table keeps each thread's last values so the sampler gets
 * per-interval deltas; a thread seen for the first time contributes its
 * totals to counters but not to the interval ratios. */
#include "monitor/monitor_impl.h"

#include <dirent.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void mon_proc_sample_fini(struct proc_sample *s)
{
	cm_free(s->th);
	s->th = NULL;
	s->n_th = s->cap_th = 0;
}

int mon_proc_parse_stat(const char *text, char *ret_comm, size_t comm_cap, uint64_t *utime,
                        uint64_t *stime, uint64_t *majflt, uint64_t *num_threads)
{
	/* "pid (comm) S ppid ...": comm may hold spaces and ')', so take the
	 * last ')'. Fields after it are numbered from 3 (state). */
	const char *open = strchr(text, '('), *close = strrchr(text, ')');
	if (!open || !close || close < open)
		return -EPROTO;
	if (ret_comm && comm_cap) {
		size_t n = CM_MIN((size_t)(close - open - 1), comm_cap - 1);
		memcpy(ret_comm, open + 1, n);
		ret_comm[n] = '\0';
	}
	uint64_t f[21] = {0};
	const char *p = close + 1;
	int field = 2;
	while (*p && field < 20) {
		while (*p == ' ')
			p++;
		if (!*p || *p == '\n')
			break;
		field++;
		char *end;
		f[field] = strtoull(p, &end, 10);
		if (end == p) /* the state letter */
			while (*end && *end != ' ')
				end++;
		p = end;
	}
	if (field < 15)
		return -EPROTO;
	*majflt = f[12];
	*utime = f[14];
	*stime = f[15];
	if (num_threads)
		*num_threads = field >= 20 ? f[20] : 0;
	return 0;
}

static struct proc_thread *thread_slot(struct proc_sample *s, int tid, bool *fresh)
{
	for (size_t i = 0; i < s->n_th; i++) {
		if (s->th[i].tid == tid) {
			*fresh = false;
			return &s->th[i];
		}
	}
	if (s->n_th == s->cap_th) {
		size_t cap = s->cap_th ? s->cap_th * 2 : 16;
		if (cap > MON_MAX_THREADS)
			return NULL;
		struct proc_thread *t = cm_realloc(s->th, cap * sizeof(*t));
		if (!t)
			return NULL;
		s->th = t;
		s->cap_th = cap;
	}
	struct proc_thread *t = &s->th[s->n_th++];
	memset(t, 0, sizeof(*t));
	t->tid = tid;
	*fresh = true;
	return t;
}

static uint64_t delta(uint64_t cur, uint64_t prev)
{
	return cur > prev ? cur - prev : 0;
}

static void read_thread(struct mon_buf *b, const char *dir, int tid, const char *worker_prefix,
                        struct proc_sample *s)
{
	char path[4300], name[32];
	uint64_t ut, st, majflt;
	snprintf(path, sizeof(path), "%s/%d/stat", dir, tid);
	if (mon_read_file(b, path) < 0 ||
	    mon_proc_parse_stat(b->p, name, sizeof(name), &ut, &st, &majflt, NULL))
		return; /* exited meanwhile */
	uint64_t run_ns = 0, run_delay = 0, nvcsw = 0, nivcsw = 0;
	snprintf(path, sizeof(path), "%s/%d/schedstat", dir, tid);
	if (mon_read_file(b, path) >= 0 &&
	    sscanf(b->p, "%" SCNu64 " %" SCNu64, &run_ns, &run_delay) == 2)
		s->have_sched = true;
	snprintf(path, sizeof(path), "%s/%d/status", dir, tid);
	if (mon_read_file(b, path) >= 0) {
		(void)mon_kv_u64(b->p, "voluntary_ctxt_switches", &nvcsw);
		(void)mon_kv_u64(b->p, "nonvoluntary_ctxt_switches", &nivcsw);
	}

	bool fresh;
	struct proc_thread *t = thread_slot(s, tid, &fresh);
	if (!t)
		return;
	if (fresh) {
		t->d_utime = ut;
		t->d_stime = st;
		t->d_run_ns = run_ns;
		t->d_run_delay_ns = run_delay;
		t->d_nvcsw = nvcsw;
		t->d_nivcsw = nivcsw;
	} else {
		t->d_utime = delta(ut, t->utime);
		t->d_stime = delta(st, t->stime);
		t->d_run_ns = delta(run_ns, t->run_ns);
		t->d_run_delay_ns = delta(run_delay, t->run_delay_ns);
		t->d_nvcsw = delta(nvcsw, t->nvcsw);
		t->d_nivcsw = delta(nivcsw, t->nivcsw);
	}
	t->fresh = fresh;
	t->seen = true;
	t->utime = ut;
	t->stime = st;
	t->run_ns = run_ns;
	t->run_delay_ns = run_delay;
	t->nvcsw = nvcsw;
	t->nivcsw = nivcsw;
	snprintf(t->name, sizeof(t->name), "%s", name);
	t->worker = worker_prefix && *worker_prefix &&
	            strncmp(name, worker_prefix, strlen(worker_prefix)) == 0;
}

int mon_proc_read(struct mon_buf *b, const char *procfs, int pid, const char *worker_prefix,
                  struct proc_sample *s, struct cm_err *err)
{
	char base[4096], path[4200];
	if (pid > 0)
		snprintf(base, sizeof(base), "%s/%d", procfs, pid);
	else
		snprintf(base, sizeof(base), "%s/self", procfs);

	s->have = false;
	snprintf(path, sizeof(path), "%s/stat", base);
	long n = mon_read_file(b, path);
	int rc = n < 0 ? (int)n
	               : mon_proc_parse_stat(b->p, NULL, 0, &s->utime, &s->stime, &s->majflt,
	                                     &s->num_threads);
	if (rc)
		return cm_err_set(err, rc, "monitor: %s: %s", path,
		                  rc == -EPROTO ? "unexpected format" : strerror(-rc));
	snprintf(path, sizeof(path), "%s/status", base);
	uint64_t kb;
	s->rss = s->locked = s->swap = 0;
	if (mon_read_file(b, path) >= 0) {
		if (mon_kv_u64(b->p, "VmRSS", &kb))
			s->rss = kb * 1024;
		if (mon_kv_u64(b->p, "VmLck", &kb))
			s->locked = kb * 1024;
		if (mon_kv_u64(b->p, "VmSwap", &kb))
			s->swap = kb * 1024;
	}
	s->have = true;

	for (size_t i = 0; i < s->n_th; i++)
		s->th[i].seen = false;
	snprintf(path, sizeof(path), "%s/task", base);
	DIR *d = opendir(path);
	if (!d)
		return 0; /* no per-thread figures; the process ones stand */
	s->have_sched = false;
	struct dirent *de;
	while ((de = readdir(d)) != NULL) {
		char *end;
		long tid = strtol(de->d_name, &end, 10);
		if (*end || tid <= 0)
			continue;
		read_thread(b, path, (int)tid, worker_prefix, s);
	}
	closedir(d);
	size_t k = 0;
	for (size_t i = 0; i < s->n_th; i++)
		if (s->th[i].seen)
			s->th[k++] = s->th[i];
	s->n_th = k;
	return 0;
}
