/* tests/unit/test_daemon_config.c: the config table, its parser, printer,
 * docs and reload mask. Walks the table itself through config_impl.h. */
#include "daemon/config.h"
#include "daemon/config_impl.h"
#include "engine/engine.h"
#include "ipc/ipc.h"

#include "tests/test.h"

#include <unistd.h>

static struct cm_err err;
/* The configuration table (daemon_config_options(), set in main). */
static const struct opt *options;
static size_t n_options;

static const char *write_tmp(const char *name, const char *text)
{
	static char path[4096];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", test_tmpdir(), name);
	f = fopen(path, "w");
	if (!f)
		return NULL;
	fputs(text, f);
	fclose(f);
	return path;
}

static bool config_equal(const struct daemon_config *a, const struct daemon_config *b,
                         const char **ret_key)
{
	for (size_t i = 0; i < n_options; i++) {
		if (!daemon_config_opt_equal(a, b, &options[i])) {
			*ret_key = options[i].name;
			return false;
		}
	}
	return true;
}

/* A field of struct daemon_config with no table row would be silently
 * unconfigurable: the rows' sizes must add up to the struct's fields. */
static void test_table_covers_struct(void)
{
	size_t sum = 0;

	for (size_t i = 0; i < n_options; i++) {
		const struct opt *o = &options[i];
		/* a list's entries and its count */
		sum += o->type == OPT_LIST ? o->size * DAEMON_MAX_LISTEN + sizeof(int) : o->size;
		for (size_t j = 0; j < i; j++) {
			CHECK_MSG(strcmp(options[j].name, o->name) != 0, "duplicate %s", o->name);
			CHECK_MSG(options[j].off != o->off, "%s and %s share a field",
			          options[j].name, o->name);
		}
		CHECK_MSG(o->help && *o->help, "%s has no help", o->name);
	}
	/* Padding makes the struct larger, never smaller. */
	CHECK(sum <= sizeof(struct daemon_config));
	CHECK_MSG(sizeof(struct daemon_config) - sum < 64, "struct has %zu bytes no row covers",
	          sizeof(struct daemon_config) - sum);
	CHECK_EQ_INT(n_options, 57);
}

static void test_every_default_parses(void)
{
	for (size_t i = 0; i < n_options; i++) {
		struct daemon_config c;
		memset(&c, 0, sizeof(c));
		cm_err_clear(&err);
		int r = daemon_config_opt_set(&c, &options[i], options[i].def, false, &err);
		CHECK_MSG(r == 0, "default of %s: %s", options[i].name, err.msg);
	}
}

static void test_defaults(void)
{
	struct daemon_config c;

	daemon_config_default(&c);
	CHECK_STREQ(c.model, "");
	CHECK_EQ_INT(c.threads, 0);
	CHECK_STREQ(c.isa, "auto");
	CHECK_EQ_INT(c.ctx_size, 0);
	CHECK_EQ_INT(c.parallel, 4);
	CHECK_EQ_INT(c.batch_size, 512);
	CHECK_EQ_INT(c.prefill_chunk, 256);
	CHECK_EQ_INT(c.kv_budget_mib, 0);
	CHECK_STREQ(c.kv_type, "f16");
	CHECK(c.prefix_cache);
	CHECK_EQ_INT(c.queue_size, 16);
	CHECK_EQ_INT(c.max_tokens_default, 256);
	CHECK_EQ_INT(c.max_tokens_limit, 8192);
	CHECK_EQ_INT(c.stream_idle_ms, 30000);
	CHECK_EQ_INT(c.deadline_ms_default, 0);
	CHECK_EQ_INT(c.drain_timeout_ms, 10000);
	CHECK_EQ_INT(c.n_listen, 1);
	CHECK_STREQ(c.listen[0], "ipc:///run/edgelm/edgelm.sock");
	CHECK_STREQ(c.socket_group, "edgelm");
	CHECK_EQ_INT(c.socket_mode, 0660);
	CHECK_EQ_INT(c.max_msg_kib, 1216);
	/* the protocol's derived default: a 1 MiB prompt fits with its envelope */
	CHECK_EQ_INT((uint64_t)c.max_msg_kib * 1024, IPC_DEFAULT_MAX_MSG_BYTES);
	CHECK_STREQ(c.metrics_listen, "127.0.0.1:9477");
	CHECK_EQ_INT(c.monitor_interval_ms, 1000);
	CHECK_STREQ(c.metrics_textfile, "");
	CHECK(c.peak_bandwidth_gbs == 0);
	CHECK(c.tuning);
	CHECK(c.pin);
	CHECK_STREQ(c.governor, "performance");
	CHECK_STREQ(c.epp, "performance");
	CHECK_EQ_INT(c.nice, -5);
	CHECK(!c.sched_batch);
	CHECK_STREQ(c.load_ioprio, "be:7");
	CHECK_STREQ(c.mlock, "try");
	CHECK(!c.hugepages);
	CHECK(c.prefault);
	CHECK_STREQ(c.numa, "auto");
	CHECK_EQ_INT(c.oom_score_adj, 9999);
	CHECK_STREQ(c.state_file, "/run/edgelm/tuning.state");
	CHECK_STREQ(c.log_level, "info");
	CHECK_EQ_INT(c.watchdog_stall_ms, 0);
}

static void test_validate(void)
{
	struct daemon_config c;

	daemon_config_default(&c);
	CHECK_EQ_INT(daemon_config_validate(&c, &err), -EINVAL);
	CHECK_STREQ(err.msg, "no model: set `model` in /etc/edgelm/edgelm.conf or pass --model");
	CHECK_OK(daemon_config_set(&c, "model", "/var/lib/edgelm/models/m.gguf", &err));
	CHECK_OK(daemon_config_validate(&c, &err));

	CHECK_OK(daemon_config_set(&c, "prefill_chunk", "1024", &err));
	CHECK_EQ_INT(daemon_config_validate(&c, &err), -EINVAL);
	CHECK(strstr(err.msg, "prefill_chunk (1024) is larger than batch_size (512)"));
	CHECK_OK(daemon_config_set(&c, "prefill_chunk", "256", &err));

	CHECK_OK(daemon_config_set(&c, "max_tokens_default", "9000", &err));
	CHECK_EQ_INT(daemon_config_validate(&c, &err), -EINVAL);
	CHECK(strstr(err.msg, "max_tokens_default"));
	CHECK_OK(daemon_config_set(&c, "max_tokens_default", "256", &err));

	CHECK_OK(daemon_config_set(&c, "listen", "", &err));
	CHECK_EQ_INT(daemon_config_validate(&c, &err), -EINVAL);
	CHECK(strstr(err.msg, "no listen URL"));
}

static void test_set(void)
{
	struct daemon_config c;

	daemon_config_default(&c);
	CHECK_OK(daemon_config_set(&c, "threads", "8", &err));
	CHECK_EQ_INT(c.threads, 8);
	CHECK_EQ_INT(daemon_config_set(&c, "threads", "-1", &err), -ERANGE);
	CHECK_STREQ(err.msg, "threads: -1 is out of range 0..1024");
	CHECK_EQ_INT(daemon_config_set(&c, "threads", "eight", &err), -EINVAL);
	CHECK_STREQ(err.msg, "threads: 'eight' is not an integer");
	CHECK_EQ_INT(daemon_config_set(&c, "threads", "8x", &err), -EINVAL);
	CHECK_EQ_INT(daemon_config_set(&c, "threads", "", &err), -EINVAL);
	CHECK_EQ_INT(c.threads, 8); /* errors change nothing */

	/* the engine's message for an unknown template names this key */
	CHECK_OK(daemon_config_set(&c, "chat_template", "llama3", &err));
	CHECK_STREQ(c.chat_template, "llama3");
	CHECK_EQ_INT(daemon_config_set(&c, "chat_template", "jinja", &err), -EINVAL);
	CHECK(strstr(err.msg, "'jinja' is not a chat format") && strstr(err.msg, "chatml"));
	CHECK_OK(daemon_config_set(&c, "chat_template", "", &err));

	CHECK_EQ_INT(daemon_config_set(&c, "parallel", "0", &err), -ERANGE);
	CHECK_EQ_INT(daemon_config_set(&c, "parallel", "257", &err), -ERANGE);
	CHECK_EQ_INT(daemon_config_set(&c, "queue_size", "-3", &err), -ERANGE);
	CHECK_EQ_INT(daemon_config_set(&c, "queue_size", "99999999999999999999", &err), -ERANGE);
	CHECK_EQ_INT(daemon_config_set(&c, "stream_idle_ms", "99", &err), -ERANGE);

	CHECK_OK(daemon_config_set(&c, "nice", "keep", &err));
	CHECK_EQ_INT(c.nice, 99);
	CHECK_OK(daemon_config_set(&c, "nice", "-20", &err));
	CHECK_EQ_INT(c.nice, -20);
	CHECK_EQ_INT(daemon_config_set(&c, "nice", "20", &err), -ERANGE);
	CHECK_STREQ(err.msg, "nice: 20 is out of range -20..19 (or keep)");
	CHECK_OK(daemon_config_set(&c, "oom_score_adj", "-500", &err));
	CHECK_EQ_INT(c.oom_score_adj, -500);
	CHECK_OK(daemon_config_set(&c, "oom_score_adj", "9999", &err));
	CHECK_EQ_INT(c.oom_score_adj, 9999);

	CHECK_OK(daemon_config_set(&c, "socket_mode", "0600", &err));
	CHECK_EQ_INT(c.socket_mode, 0600);
	CHECK_OK(daemon_config_set(&c, "socket_mode", "660", &err));
	CHECK_EQ_INT(c.socket_mode, 0660);
	CHECK_EQ_INT(daemon_config_set(&c, "socket_mode", "0999", &err), -EINVAL);
	CHECK_EQ_INT(daemon_config_set(&c, "socket_mode", "01000", &err), -ERANGE);

	CHECK_OK(daemon_config_set(&c, "prefix_cache", "off", &err));
	CHECK(!c.prefix_cache);
	CHECK_OK(daemon_config_set(&c, "prefix_cache", "TRUE", &err));
	CHECK(c.prefix_cache);
	CHECK_EQ_INT(daemon_config_set(&c, "prefix_cache", "maybe", &err), -EINVAL);

	CHECK_OK(daemon_config_set(&c, "peak_bandwidth_gbs", "51.2", &err));
	CHECK_NEAR(c.peak_bandwidth_gbs, 51.2, 1e-12);
	CHECK_EQ_INT(daemon_config_set(&c, "peak_bandwidth_gbs", "-1", &err), -ERANGE);
	CHECK_EQ_INT(daemon_config_set(&c, "peak_bandwidth_gbs", "nan", &err), -ERANGE);
	CHECK_EQ_INT(daemon_config_set(&c, "peak_bandwidth_gbs", "fast", &err), -EINVAL);

	CHECK_OK(daemon_config_set(&c, "mlock", "all", &err));
	CHECK_EQ_INT(daemon_config_set(&c, "mlock", "maybe", &err), -EINVAL);
	CHECK_STREQ(err.msg, "mlock: 'maybe' is not one of off, try, on, all");
	CHECK_EQ_INT(daemon_config_set(&c, "log_level", "verbose", &err), -EINVAL);
	CHECK_OK(daemon_config_set(&c, "load_ioprio", "idle", &err));
	CHECK_EQ_INT(daemon_config_set(&c, "load_ioprio", "be:8", &err), -EINVAL);
	CHECK_OK(daemon_config_set(&c, "numa", "interleave", &err));
	CHECK_EQ_INT(daemon_config_set(&c, "numa", "spread", &err), -EINVAL);
	CHECK_OK(daemon_config_set(&c, "metrics_listen", "off", &err));
	CHECK_OK(daemon_config_set(&c, "metrics_listen", "[::1]:9000", &err));
	CHECK_EQ_INT(daemon_config_set(&c, "metrics_listen", "9477", &err), -EINVAL);
	CHECK_EQ_INT(daemon_config_set(&c, "metrics_listen", "0.0.0.0:99999", &err), -EINVAL);
	/* http_listen: what the HTTP front binds (numeric or localhost, IPv6 in
	 * brackets, a port of digits) */
	static const char *const http_ok[] = {"127.0.0.1:8080", "localhost:0", "[::1]:8080",
					       "0.0.0.0:80", "[127.0.0.1]:80"};
	static const char *const http_bad[] = {"8080", ":8080", "host.example:80", "::1:8080",
						"127.0.0.1:99999", "127.0.0.1:", "127.0.0.1:+80",
						"[::1]8080", "[::1:80", "127.0.0.1:80x"};
	for (size_t i = 0; i < CM_ARRAY_LEN(http_ok); i++)
		CHECK_MSG(daemon_config_set(&c, "http_listen", http_ok[i], &err) == 0, "%s: %s",
			  http_ok[i], err.msg);
	for (size_t i = 0; i < CM_ARRAY_LEN(http_bad); i++)
		CHECK_MSG(daemon_config_set(&c, "http_listen", http_bad[i], &err) == -EINVAL,
			  "%s accepted", http_bad[i]);
	CHECK_EQ_INT(daemon_config_set(&c, "state_file", "tuning.state", &err), -EINVAL);
	CHECK_EQ_INT(daemon_config_set(&c, "metrics_textfile", "x.prom", &err), -EINVAL);
	CHECK_OK(daemon_config_set(&c, "metrics_textfile", "", &err));
	CHECK_EQ_INT(daemon_config_set(&c, "model", "a\nb", &err), -EINVAL);

	char big[5000];
	memset(big, 'a', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	CHECK_EQ_INT(daemon_config_set(&c, "model", big, &err), -ENAMETOOLONG);

	/* A CLI override replaces the list. */
	CHECK_OK(daemon_config_set(&c, "listen", "ipc:///tmp/a.sock tcp://127.0.0.1:5555", &err));
	CHECK_EQ_INT(c.n_listen, 2);
	CHECK_STREQ(c.listen[1], "tcp://127.0.0.1:5555");
	CHECK_OK(daemon_config_set(&c, "listen", "ipc:///tmp/b.sock", &err));
	CHECK_EQ_INT(c.n_listen, 1);
	CHECK_STREQ(c.listen[0], "ipc:///tmp/b.sock");
	CHECK_EQ_INT(daemon_config_set(&c, "listen", "/tmp/b.sock", &err), -EINVAL);
	CHECK_EQ_INT(daemon_config_set(&c, "listen",
	                               "a://1 b://2 c://3 d://4 e://5 f://6 g://7 "
	                               "h://8 i://9",
	                               &err),
	             -E2BIG);
	CHECK_EQ_INT(c.n_listen, 1);

	CHECK_EQ_INT(daemon_config_set(&c, "thread", "4", &err), -ENOENT);
	CHECK_STREQ(err.msg, "unknown key 'thread' (did you mean 'threads'?)");
	CHECK_EQ_INT(daemon_config_set(&c, "zzzzzz", "4", &err), -ENOENT);
	CHECK_STREQ(err.msg, "unknown key 'zzzzzz'");
}

static void test_load(void)
{
	struct daemon_config c;
	const char *p =
	    write_tmp("ok.conf", "# edgelm test\n"
	                         "\n"
	                         "   # indented comment\n"
	                         "model /var/lib/edgelm/models/my model.gguf\n"
	                         "threads 2\n"
	                         "threads 6   # last wins\n"
	                         "governor \"performance|schedutil\"\n"
	                         "metrics_textfile \"\"\n"
	                         "socket_group \"  spaced # group \"  # comment after quotes\n"
	                         "listen ipc:///tmp/one.sock\n"
	                         "listen\ttcp://127.0.0.1:7000\r\n"
	                         "isa \"a \\\"quoted\\\" \\\\ value\"\n"
	                         "epp balance#performance\n"
	                         "prefix_cache no\n");
	daemon_config_default(&c);
	CHECK_OK(daemon_config_load(&c, p, &err));
	CHECK_STREQ(c.model, "/var/lib/edgelm/models/my model.gguf");
	CHECK_EQ_INT(c.threads, 6);
	CHECK_STREQ(c.governor, "performance|schedutil");
	CHECK_STREQ(c.metrics_textfile, "");
	CHECK_STREQ(c.socket_group, "  spaced # group ");
	CHECK_EQ_INT(c.n_listen, 2); /* the file's lines replace the default */
	CHECK_STREQ(c.listen[0], "ipc:///tmp/one.sock");
	CHECK_STREQ(c.listen[1], "tcp://127.0.0.1:7000");
	CHECK_STREQ(c.isa, "a \"quoted\" \\ value");
	CHECK_STREQ(c.epp, "balance#performance");
	CHECK(!c.prefix_cache);
	CHECK_EQ_INT(c.parallel, 4); /* untouched keys keep their values */

	/* Loading again (SIGHUP) starts a fresh list, it does not append. */
	CHECK_OK(daemon_config_load(&c, p, &err));
	CHECK_EQ_INT(c.n_listen, 2);
}

static void test_load_errors(void)
{
	struct daemon_config c, before;
	const char *p;
	char want[4200];

	daemon_config_default(&c);
	before = c;
	p = write_tmp("typo.conf", "# comment\nmodel /m.gguf\n\nparalel 8\n");
	CHECK_EQ_INT(daemon_config_load(&c, p, &err), -ENOENT);
	snprintf(want, sizeof(want), "%s:4: unknown key 'paralel' (did you mean 'parallel'?)", p);
	CHECK_STREQ(err.msg, want);
	CHECK_STREQ(c.model, ""); /* a file with an error changes nothing */

	p = write_tmp("typo2.conf", "max_token_limit 10\n");
	CHECK_EQ_INT(daemon_config_load(&c, p, &err), -ENOENT);
	CHECK(strstr(err.msg,
	             ":1: unknown key 'max_token_limit' (did you mean 'max_tokens_limit'?)"));

	p = write_tmp("range.conf", "threads 4\n\nparallel 1000\n");
	CHECK_EQ_INT(daemon_config_load(&c, p, &err), -ERANGE);
	snprintf(want, sizeof(want), "%s:3: parallel: 1000 is out of range 1..256", p);
	CHECK_STREQ(err.msg, want);
	CHECK_EQ_INT(c.threads, 0);

	p = write_tmp("quote.conf", "model \"/m.gguf\n");
	CHECK_EQ_INT(daemon_config_load(&c, p, &err), -EINVAL);
	CHECK(strstr(err.msg, ":1: model: missing closing quote"));

	p = write_tmp("after.conf", "model \"/m.gguf\" extra\n");
	CHECK_EQ_INT(daemon_config_load(&c, p, &err), -EINVAL);
	CHECK(strstr(err.msg, ":1: model: text after the closing quote"));

	p = write_tmp("novalue.conf", "\n\nmodel\n");
	CHECK_EQ_INT(daemon_config_load(&c, p, &err), -EINVAL);
	CHECK(strstr(err.msg, ":3: model: missing value"));

	p = write_tmp("toomany.conf", "listen a://1\nlisten a://2\nlisten a://3\nlisten a://4\n"
	                              "listen a://5\nlisten a://6\nlisten a://7\nlisten a://8\n"
	                              "listen a://9\n");
	CHECK_EQ_INT(daemon_config_load(&c, p, &err), -E2BIG);
	CHECK(strstr(err.msg, ":9: listen: more than 8 URLs"));

	snprintf(want, sizeof(want), "%s/does-not-exist.conf", test_tmpdir());
	CHECK_EQ_INT(daemon_config_load(&c, want, &err), -ENOENT);
	CHECK(strstr(err.msg, "does-not-exist.conf: No such file or directory"));

	const char *key = NULL;
	CHECK(config_equal(&c, &before, &key));
}

static void fill_odd_values(struct daemon_config *c)
{
	daemon_config_default(c);
	CHECK_OK(daemon_config_set(c, "model", "/models/with space #and hash.gguf", &err));
	CHECK_OK(daemon_config_set(c, "threads", "3", &err));
	CHECK_OK(daemon_config_set(c, "isa", " lead\"ing\\ ", &err));
	CHECK_OK(daemon_config_set(c, "socket_group", "", &err));
	CHECK_OK(daemon_config_set(c, "socket_mode", "0600", &err));
	CHECK_OK(daemon_config_set(c, "listen", "ipc:///a ipc:///b tcp://[::1]:1", &err));
	CHECK_OK(daemon_config_set(c, "peak_bandwidth_gbs", "0.1", &err));
	CHECK_OK(daemon_config_set(c, "nice", "keep", &err));
	CHECK_OK(daemon_config_set(c, "oom_score_adj", "-100", &err));
	CHECK_OK(daemon_config_set(c, "prefault", "no", &err));
	CHECK_OK(daemon_config_set(c, "governor", "\"q\"", &err));
	CHECK_OK(daemon_config_set(c, "log_level", "debug", &err));
	CHECK_OK(daemon_config_set(c, "watchdog_stall_ms", "5000", &err));
}

static void roundtrip(const struct daemon_config *c, const char *name)
{
	struct daemon_config back;
	char path[4096];
	const char *key = NULL;
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", test_tmpdir(), name);
	f = fopen(path, "w");
	CHECK(f != NULL);
	if (!f)
		return;
	daemon_config_print(f, c, false);
	fclose(f);
	daemon_config_default(&back);
	cm_err_clear(&err);
	CHECK_MSG(daemon_config_load(&back, path, &err) == 0, "%s", err.msg);
	CHECK_MSG(config_equal(c, &back, &key), "%s differs after print + load (%s)", key, path);
}

static void test_print_roundtrip(void)
{
	struct daemon_config c;

	daemon_config_default(&c);
	roundtrip(&c, "rt-default.conf");
	fill_odd_values(&c);
	roundtrip(&c, "rt-odd.conf");
}

static void test_print_marks_defaults(void)
{
	struct daemon_config c;
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	fill_odd_values(&c);
	daemon_config_print(f, &c, false);
	fclose(f);
	CHECK(strstr(buf, "\nthreads 3  # default: 0\n"));
	CHECK(strstr(buf, "\nparallel 4\n"));
	CHECK(strstr(buf, "\nsocket_group \"\"  # default: edgelm\n"));
	CHECK(strstr(buf, "\nnice keep  # default: -5\n"));
	CHECK(strstr(buf, "\nlisten ipc:///a\nlisten ipc:///b\nlisten tcp://[::1]:1\n"));
	CHECK(strstr(buf, "# default: listen ipc:///run/edgelm/edgelm.sock\n"));
	CHECK(strstr(buf, "\nwatchdog_stall_ms 5000  # default: 0\n"));
	CHECK(strstr(buf, "\nlog_level debug  # default: info\n"));
	free(buf);

	/* A hidden key at its default stays out of the file. */
	daemon_config_default(&c);
	buf = NULL;
	f = open_memstream(&buf, &len);
	daemon_config_print(f, &c, false);
	fclose(f);
	CHECK(!strstr(buf, "watchdog_stall_ms"));
	CHECK(!strstr(buf, "# default:"));
	free(buf);
}

static void test_doc(void)
{
	struct daemon_config c;
	char *buf = NULL, needle[128];
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	int rows = 0;

	daemon_config_default(&c);
	daemon_config_print(f, &c, true);
	fclose(f);
	CHECK(strncmp(buf, "| key | type | default | range | reloadable | description |\n", 59) ==
	      0);
	for (size_t i = 0; i < n_options; i++) {
		snprintf(needle, sizeof(needle), "| `%s` |", options[i].name);
		if (options[i].flags & CONFIG_HIDDEN)
			CHECK_MSG(!strstr(buf, needle), "hidden %s in the docs", options[i].name);
		else
			CHECK_MSG(strstr(buf, needle), "%s missing from the docs", options[i].name);
	}
	for (char *p = buf; (p = strchr(p, '\n')); p++)
		rows++;
	CHECK_EQ_INT(rows, 2 + 56);
	CHECK(strstr(
	    buf, "| `log_level` | choice | `info` | err, warning, notice, info, debug | yes |"));
	CHECK(strstr(buf, "| `socket_mode` | octal | `0660` | 0000..0777 | no |"));
	CHECK(strstr(buf, "| `nice` | integer | `-5` | -20..19, keep | no |"));
	CHECK(strstr(buf, "| `model` | string | \"\" |  | yes |"));
	CHECK(strstr(buf, "(\"a\\|b\": the first offered)")); /* '|' escaped in a cell */
	free(buf);
}

static void test_reload(void)
{
	struct daemon_config c, nc;
	const char *key = "x";

	daemon_config_default(&c);
	CHECK_OK(daemon_config_set(&c, "model", "/m1.gguf", &err));
	nc = c;
	CHECK_EQ_INT(daemon_config_apply_reload(&c, &nc, &key), 0);
	CHECK(key == NULL);

	CHECK_OK(daemon_config_set(&nc, "log_level", "debug", &err));
	CHECK_OK(daemon_config_set(&nc, "queue_size", "64", &err));
	CHECK_OK(daemon_config_set(&nc, "max_tokens_default", "100", &err));
	CHECK_OK(daemon_config_set(&nc, "max_tokens_limit", "200", &err));
	CHECK_OK(daemon_config_set(&nc, "stream_idle_ms", "1000", &err));
	CHECK_OK(daemon_config_set(&nc, "deadline_ms_default", "5000", &err));
	CHECK_OK(daemon_config_set(&nc, "drain_timeout_ms", "2000", &err));
	CHECK_OK(daemon_config_set(&nc, "metrics_textfile", "/var/lib/x.prom", &err));
	CHECK_OK(daemon_config_set(&nc, "peak_bandwidth_gbs", "20", &err));
	CHECK_EQ_INT(daemon_config_apply_reload(&c, &nc, &key), 0);
	CHECK(config_equal(&c, &nc, &key));
	CHECK_STREQ(c.log_level, "debug");
	CHECK_STREQ(c.metrics_textfile, "/var/lib/x.prom");

	CHECK_OK(daemon_config_set(&nc, "model", "/m2.gguf", &err));
	CHECK_EQ_INT(daemon_config_apply_reload(&c, &nc, &key), 1);
	CHECK_STREQ(c.model, "/m1.gguf"); /* the daemon swaps, then sets it */
	CHECK(key == NULL);

	CHECK_OK(daemon_config_set(&nc, "threads", "2", &err));
	CHECK_OK(daemon_config_set(&nc, "listen", "ipc:///x", &err));
	CHECK_OK(daemon_config_set(&nc, "queue_size", "8", &err));
	CHECK_EQ_INT(daemon_config_apply_reload(&c, &nc, &key), 3);
	CHECK_STREQ(key, "threads"); /* the first one, in table order */
	CHECK_EQ_INT(c.threads, 0);
	CHECK_EQ_INT(c.n_listen, 1);
	CHECK_STREQ(c.listen[0], "ipc:///run/edgelm/edgelm.sock");
	CHECK_EQ_INT(c.queue_size, 8); /* reloadable keys still apply */

	/* Exactly the documented keys are reloadable. */
	static const char *const want[] = {"model",
	                                   "queue_size",
	                                   "max_tokens_default",
	                                   "max_tokens_limit",
	                                   "context_shift",
	                                   "context_keep",
	                                   "stream_idle_ms",
	                                   "deadline_ms_default",
	                                   "drain_timeout_ms",
	                                   "tenant_weights",
	                                   "admin_uids",
	                                   "tls_cert_file",
	                                   "tls_key_file",
	                                   "tls_ca_file",
	                                   "metrics_textfile",
	                                   "peak_bandwidth_gbs",
	                                   "log_level"};
	int n = 0;
	for (size_t i = 0; i < n_options; i++) {
		if (!(options[i].flags & CONFIG_RELOADABLE))
			continue;
		n++;
		bool found = false;
		for (size_t j = 0; j < CM_ARRAY_LEN(want); j++)
			found |= strcmp(want[j], options[i].name) == 0;
		CHECK_MSG(found, "%s is reloadable", options[i].name);
	}
	CHECK_EQ_INT(n, (int)CM_ARRAY_LEN(want));
}

/* packaging/edgelm.conf lists every key, commented out, at its default. */
static void test_packaged_config(void)
{
	const char *path = "packaging/edgelm.conf";
	struct daemon_config def, c;
	char *text = NULL, line[4200];
	size_t len = 0;
	const char *key = NULL;
	FILE *f, *m;

	if (!test_file_exists(path)) {
		TEST_SKIP("%s not found (run from the source tree's top)", path);
		return;
	}
	daemon_config_default(&def);
	c = def;
	CHECK_OK(daemon_config_load(&c, path, &err));
	CHECK(config_equal(&c, &def, &key));

	/* Uncommented, it must still give the defaults (model aside). */
	f = fopen(path, "r");
	m = open_memstream(&text, &len);
	while (fgets(line, sizeof(line), f)) {
		const char *p = line;
		if (p[0] == '#' && p[1] >= 'a' && p[1] <= 'z')
			p++;
		fputs(p, m);
	}
	fclose(f);
	fclose(m);
	const char *un = write_tmp("uncommented.conf", text);
	c = def;
	CHECK_MSG(daemon_config_load(&c, un, &err) == 0, "%s", err.msg);
	for (size_t i = 0; i < n_options; i++) {
		char needle[128];
		if (options[i].flags & CONFIG_HIDDEN)
			continue;
		snprintf(needle, sizeof(needle), "\n%s ", options[i].name);
		CHECK_MSG(strstr(text, needle), "%s not in %s", options[i].name, path);
		if (strcmp(options[i].name, "model") != 0)
			CHECK_MSG(daemon_config_opt_equal(&c, &def, &options[i]),
			          "%s is not at its default in %s", options[i].name, path);
	}
	free(text);
}

/* edgelm.conf(5) documents every key. */
static void test_man_page(void)
{
	const char *path = "packaging/man/edgelm.conf.5";
	char *text = NULL, needle[128];
	size_t len = 0;
	FILE *f = fopen(path, "r");

	if (!f) {
		TEST_SKIP("%s not found (run from the source tree's top)", path);
		return;
	}
	if (getdelim(&text, &len, '\0', f) < 0)
		CHECK(0);
	fclose(f);
	for (size_t i = 0; text && i < n_options; i++) {
		snprintf(needle, sizeof(needle), ".BI \"%s \"", options[i].name);
		if (options[i].flags & CONFIG_HIDDEN)
			CHECK_MSG(!strstr(text, needle), "hidden %s in %s", options[i].name, path);
		else
			CHECK_MSG(strstr(text, needle), "%s not in %s", options[i].name, path);
	}
	free(text);
}

/* kv_type takes exactly the engine's names, its default is the engine's. */
static void test_kv_type(void)
{
	const struct opt *o = daemon_config_opt_find("kv_type");
	struct daemon_config c;
	CHECK(o != NULL);
	if (!o)
		return;
	CHECK_STREQ(o->choices, engine_kv_type_list());
	CHECK_STREQ(o->def, engine_kv_type_name(ENGINE_KV_DEFAULT));
	daemon_config_default(&c);
	CHECK_OK(daemon_config_set(&c, "kv_type", "q8_0", &err));
	CHECK_STREQ(c.kv_type, "q8_0");
	CHECK_EQ_INT(daemon_config_set(&c, "kv_type", "q4_0", &err), -EINVAL);
	CHECK(strstr(err.msg, "f32") != NULL);
}

/* quantize takes exactly the engine's recipe names (any case), "" is off. */
static void test_quantize(void)
{
	struct daemon_config c;
	daemon_config_default(&c);
	CHECK_STREQ(c.quantize, "");
	CHECK_OK(daemon_config_set(&c, "quantize", "q4_k_m", &err));
	CHECK_STREQ(c.quantize, "q4_k_m");
	CHECK_OK(daemon_config_set(&c, "quantize", "Q8_0", &err));
	CHECK_EQ_INT(daemon_config_set(&c, "quantize", "q4_k_z", &err), -EINVAL);
	CHECK(strstr(err.msg, "unknown type 'q4_k_z'") && strstr(err.msg, "Q4_K_M"));
	CHECK_EQ_INT(daemon_config_set(&c, "quantize", "iq2_xxs", &err), -ENOTSUP);
	CHECK(strstr(err.msg, "importance matrix") != NULL);
	CHECK_STREQ(c.quantize, "Q8_0"); /* errors change nothing */
	CHECK_OK(daemon_config_set(&c, "quantize", "", &err));
	CHECK_STREQ(c.quantize, "");
}

/* kv_budget_mib caps a ctx_size of 0 and refuses an explicit one over it. */
static void test_kv_budget(void)
{
	struct daemon_config c;
	uint32_t n;

	daemon_config_default(&c);
	n = 2048;
	CHECK_OK(daemon_config_fit_kv_budget(&c, 22528, &n, &err)); /* no budget */
	CHECK_EQ_INT(n, 2048);
	/* TinyLlama f16: 22 KiB per token; 4 sequences in 64 MiB: 744 tokens */
	CHECK_OK(daemon_config_set(&c, "kv_budget_mib", "64", &err));
	n = 2048;
	CHECK_OK(daemon_config_fit_kv_budget(&c, 22528, &n, &err));
	CHECK_EQ_INT(n, (64u << 20) / (22528u * 4));
	n = 512; /* fits */
	CHECK_OK(daemon_config_fit_kv_budget(&c, 22528, &n, &err));
	CHECK_EQ_INT(n, 512);
	CHECK_OK(daemon_config_set(&c, "ctx_size", "2048", &err));
	n = 2048;
	CHECK_EQ_INT(daemon_config_fit_kv_budget(&c, 22528, &n, &err), -ENOMEM);
	CHECK(strstr(err.msg, "ctx_size 2048 x parallel 4 needs 176.0 MiB of f16 KV cache, over "
			      "kv_budget_mib 64") != NULL);
	CHECK_EQ_INT(n, 2048);
	CHECK_OK(daemon_config_set(&c, "ctx_size", "0", &err));
	CHECK_OK(daemon_config_set(&c, "kv_budget_mib", "1", &err));
	n = 2048;
	CHECK_EQ_INT(daemon_config_fit_kv_budget(&c, 1u << 20, &n, &err), -ENOMEM);
	CHECK(strstr(err.msg, "does not hold one token") != NULL);
}

int main(void)
{
	options = daemon_config_options(&n_options);
	TEST_RUN(test_table_covers_struct);
	TEST_RUN(test_every_default_parses);
	TEST_RUN(test_defaults);
	TEST_RUN(test_validate);
	TEST_RUN(test_set);
	TEST_RUN(test_load);
	TEST_RUN(test_load_errors);
	TEST_RUN(test_print_roundtrip);
	TEST_RUN(test_print_marks_defaults);
	TEST_RUN(test_doc);
	TEST_RUN(test_reload);
	TEST_RUN(test_packaged_config);
	TEST_RUN(test_man_page);
	TEST_RUN(test_kv_type);
	TEST_RUN(test_quantize);
	TEST_RUN(test_kv_budget);
	return test_finish();
}
