/* tests/fuzz/replay.c: run a libFuzzer entry point over every file of a
 * corpus directory (SQLite's fuzzcheck idea), so the corpus is replayed by
 * `make check` without clang. Each input that returns counts as passed; a
 * crash or sanitizer report fails the whole binary. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return -1;
	size_t cap = 1 << 16, n = 0;
	uint8_t *buf = malloc(cap);
	size_t r;
	while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
		n += r;
		if (n == cap) {
			uint8_t *nb = realloc(buf, cap *= 2);
			if (!nb) {
				free(buf);
				buf = NULL;
			}
			buf = nb;
		}
	}
	fclose(f);
	if (!buf)
		return -1;
	/* Give the target an exact-size heap copy so ASan sees overreads. */
	uint8_t *exact = malloc(n ? n : 1);
	memcpy(exact, buf, n);
	free(buf);
	LLVMFuzzerTestOneInput(exact, n);
	free(exact);
	return 0;
}

int main(int argc, char **argv)
{
	int pass = 0, fail = 0;
	for (int i = 1; i < argc; i++) {
		DIR *d = opendir(argv[i]);
		if (!d) {
			if (replay_file(argv[i]) == 0)
				pass++;
			else {
				fprintf(stderr, "replay: cannot read %s\n", argv[i]);
				fail++;
			}
			continue;
		}
		struct dirent *e;
		while ((e = readdir(d))) {
			if (e->d_name[0] == '.')
				continue;
			char p[4096];
			snprintf(p, sizeof(p), "%s/%s", argv[i], e->d_name);
			if (replay_file(p) == 0)
				pass++;
			else {
				fprintf(stderr, "replay: cannot read %s\n", p);
				fail++;
			}
		}
		closedir(d);
	}
	if (pass + fail == 0) {
		fprintf(stderr, "replay: empty corpus\n");
		fail = 1;
	}
	printf("%d passed, %d failed\n", pass, fail);
	return fail ? 1 : 0;
}
