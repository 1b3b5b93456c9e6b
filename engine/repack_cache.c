/* engine/repack_cache.c: the repack cache (engine_params.repack_cache).
 *
 * Building the repacked copy costs fresh anonymous memory as large as the
 * model, and the kernel zeroes every page of it on first touch: for a
 * TinyLlama Q8_0 that was two thirds of the load (docs/performance.md
 * §13). The first load writes its copy to a file; later loads map that
 * file, whose pages the page cache already holds when it is warm, and
 * build nothing. The price: a file mapping gets 4 KiB pages, not the
 * copy's transparent huge pages (measured in §13).
 *
 * An entry is one file, DIR/NAME-KEY.x16 (NAME: the model file's base
 * name), a 4 KiB header then the copy's bytes exactly as the load would
 * have made them. KEY hashes everything the bytes depend on: the model
 * file's identity as opened (device, inode, size, mtime), the layout
 * version, and each repacked matrix's place, type, shape and K-segment
 * (so another kernel variant, or another segment setting, is another
 * entry). Writing another entry for NAME removes the older ones, so a
 * replaced model does not leave its copy behind. Entries are written to
 * a temporary file, synced, and renamed into place; one that fails its
 * checks when mapped (magic, version, key, sizes) is ignored and
 * rewritten. The panels hold numbers only (no offsets), so a damaged
 * entry can give wrong outputs but never a read out of bounds. */
#include "engine/engine_impl.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define CACHE_MAGIC "EDGLX16\n"
#define CACHE_VERSION 1 /* bump with any change of the x16 layouts (kern.h) */
#define CACHE_HDR 4096

struct cache_hdr {
	char magic[8];
	uint32_t version, hdr_size;
	char key[REPACK_CACHE_KEY];
	uint64_t data_len;
};

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
	const uint8_t *b = p;
	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 1099511628211ull;
	return h;
}

void repack_cache_key(const struct engine_weights *ws, struct weight *const *sel, int n_w,
		      char key[REPACK_CACHE_KEY])
{
	const struct gguf_file *f = ws->file;
	uint64_t h[2] = {14695981039346656037ull, 0x9e3779b97f4a7c15ull};
	for (int k = 0; k < 2; k++) {
		uint64_t v[] = {CACHE_VERSION, KERN_X16_ROWS, ENGINE_X16_GROUP, f->dev, f->ino,
				(uint64_t)f->size, f->mtime_ns, (uint64_t)n_w};
		h[k] = fnv(h[k], v, sizeof(v));
		for (int i = 0; i < n_w; i++) {
			const struct weight *w = sel[i];
			uint64_t m[] = {(uint64_t)((const uint8_t *)w->data - f->base), w->type,
					(uint64_t)w->n_out, (uint64_t)w->n_in, (uint64_t)w->x16_seg};
			h[k] = fnv(h[k], m, sizeof(m));
		}
	}
	snprintf(key, REPACK_CACHE_KEY, "%016llx%016llx", (unsigned long long)h[0],
		 (unsigned long long)h[1]);
}

/* DIR/NAME-KEY.x16, or DIR/NAME- (prefix) when key is NULL. */
static int entry_path(const struct gguf_file *f, const char *dir, const char *key, char *buf,
		      size_t cap)
{
	const char *name = strrchr(f->path, '/');
	name = name ? name + 1 : f->path;
	int n = key ? snprintf(buf, cap, "%s/%s-%s.x16", dir, name, key)
		    : snprintf(buf, cap, "%s/%s-", dir, name);
	return n > 0 && (size_t)n < cap ? 0 : -ENAMETOOLONG;
}

int repack_cache_map(struct engine_weights *ws, const char *dir, const char *key, char *note,
		     size_t note_cap)
{
	const struct gguf_file *f = ws->file;
	char path[4096 + 512];
	if (!f->path[0] || entry_path(f, dir, key, path, sizeof(path)))
		return -ENOENT;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		snprintf(note, note_cap, "no entry in %s yet", dir);
		return -ENOENT;
	}
	struct stat st;
	struct cache_hdr h;
	const char *bad = NULL;
	if (fstat(fd, &st) != 0 || pread(fd, &h, sizeof(h), 0) != (ssize_t)sizeof(h))
		bad = "unreadable";
	else if (memcmp(h.magic, CACHE_MAGIC, 8) != 0 || h.version != CACHE_VERSION ||
		 h.hdr_size != CACHE_HDR)
		bad = "another format";
	else if (memcmp(h.key, key, REPACK_CACHE_KEY) != 0 || h.data_len != f->size)
		bad = "another model";
	else if ((uint64_t)st.st_size != CACHE_HDR + h.data_len)
		bad = "truncated";
	void *p = MAP_FAILED;
	if (!bad) {
		p = mmap(NULL, f->size, PROT_READ, MAP_SHARED, fd, CACHE_HDR);
		if (p == MAP_FAILED)
			bad = "cannot be mapped";
	}
	close(fd);
	if (bad) {
		snprintf(note, note_cap, "%s: %s, rebuilt", path, bad);
		return -EINVAL;
	}
	engine_weights_rebase(ws, p);
	ws->own_copy = p;
	ws->own_copy_len = f->size;
	snprintf(note, note_cap, "mapped %s", path);
	return 0;
}

static int write_all(int fd, const void *p, size_t n)
{
	const uint8_t *b = p;
	while (n > 0) {
		ssize_t w = write(fd, b, CM_MIN(n, (size_t)1 << 30));
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return w < 0 ? -errno : -EIO;
		b += w;
		n -= (size_t)w;
	}
	return 0;
}

/* Other entries of the same model name go: a model replaced in place
 * would otherwise leave its copy behind. */
static void remove_older(const struct gguf_file *f, const char *dir, const char *keep)
{
	char prefix[4096 + 512];
	if (entry_path(f, dir, NULL, prefix, sizeof(prefix)))
		return;
	const char *base = prefix + strlen(dir) + 1;
	size_t bl = strlen(base);
	DIR *d = opendir(dir);
	if (!d)
		return;
	struct dirent *e;
	while ((e = readdir(d))) {
		size_t n = strlen(e->d_name);
		if (n != bl + REPACK_CACHE_KEY - 1 + 4 || strncmp(e->d_name, base, bl) != 0 ||
		    strcmp(e->d_name + n - 4, ".x16") != 0 || strcmp(e->d_name, keep) == 0)
			continue;
		(void)unlinkat(dirfd(d), e->d_name, 0);
	}
	closedir(d);
}

int repack_cache_write(const struct engine_weights *ws, const char *dir, const char *key,
		       char *note, size_t note_cap)
{
	const struct gguf_file *f = ws->file;
	char path[4096 + 512], tmp[4096 + 512 + 16];
	if (!f->path[0] || !ws->own_copy || entry_path(f, dir, key, path, sizeof(path)))
		return -EINVAL;
	snprintf(tmp, sizeof(tmp), "%s.XXXXXX", path);
	int fd = mkostemp(tmp, O_CLOEXEC);
	if (fd < 0) {
		snprintf(note, note_cap, "cannot write to %s: %s", dir, strerror(errno));
		return -errno;
	}
	uint8_t hdr[CACHE_HDR] = {0};
	struct cache_hdr h = {.version = CACHE_VERSION, .hdr_size = CACHE_HDR, .data_len = f->size};
	memcpy(h.magic, CACHE_MAGIC, 8);
	memcpy(h.key, key, REPACK_CACHE_KEY);
	memcpy(hdr, &h, sizeof(h));
	/* synced before the rename, so a crash never leaves a whole-looking
	 * entry with missing data */
	int r = write_all(fd, hdr, sizeof(hdr));
	if (r == 0)
		r = write_all(fd, ws->own_copy, f->size);
	if (r == 0 && fsync(fd) != 0)
		r = -errno;
	close(fd);
	if (r == 0 && rename(tmp, path) != 0)
		r = -errno;
	if (r) {
		(void)unlink(tmp);
		snprintf(note, note_cap, "cannot write %s: %s", path, strerror(-r));
		return r;
	}
	remove_older(f, dir, strrchr(path, '/') + 1);
	snprintf(note, note_cap, "wrote %s", path);
	return 0;
}
