/* engine/chat.c: chat messages -> prompt text.
 *
 * No Jinja interpreter: the model's tokenizer.chat_template is matched
 * against a table of known formats (../shared/docs/gguf-formats.md §6), and
 * the messages are rendered by the format's rules. A model without a
 * template gets chatml, as llama.cpp does. */
#include "engine/engine_impl.h"

#include <stdio.h>
#include <string.h>

struct buf {
	char *p;
	size_t n, cap;
	int err;
};

static void put(struct buf *b, const char *s, size_t n)
{
	if (b->err)
		return;
	if (b->n + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		while (cap < b->n + n + 1)
			cap *= 2;
		char *np = cm_realloc(b->p, cap);
		if (!np) {
			b->err = -ENOMEM;
			return;
		}
		b->p = np;
		b->cap = cap;
	}
	memcpy(b->p + b->n, s, n);
	b->n += n;
	b->p[b->n] = '\0';
}

static void puts_(struct buf *b, const char *s)
{
	put(b, s, strlen(s));
}

static const char *const role_names[] = {"system", "user", "assistant"};

const char *engine_chat_format_name(enum engine_chat_format f)
{
	switch (f) {
	case ENGINE_CHAT_CHATML: return "chatml";
	default: return "?";
	}
}

int engine_chat_detect(const engine_model *m, const char *override, enum engine_chat_format *ret,
		       struct cm_err *err)
{
	if (override && *override) {
		if (strcmp(override, "chatml") == 0) {
			*ret = ENGINE_CHAT_CHATML;
			return 0;
		}
		return cm_err_set(err, -ENOTSUP, "chat: unknown format '%s' (known: chatml)",
				  override);
	}
	struct gguf_str tmpl = {0};
	if (!m->file || gguf_get_str(m->file, "tokenizer.chat_template", &tmpl, NULL) != 0 ||
	    tmpl.len == 0) {
		*ret = ENGINE_CHAT_CHATML; /* llama.cpp's default without a template */
		return 0;
	}
	if (memmem(tmpl.ptr, tmpl.len, "<|im_start|>", 12)) {
		*ret = ENGINE_CHAT_CHATML;
		return 0;
	}
	return cm_err_set(err, -ENOTSUP,
			  "chat: the model's chat template is not a known format; set the "
			  "chat_template option to one of: chatml");
}

int engine_chat_render(enum engine_chat_format f, const struct engine_chat_msg *msgs, size_t n,
		       bool add_generation_prompt, char **ret_text, size_t *ret_len,
		       struct cm_err *err)
{
	struct buf b = {0};
	for (size_t i = 0; i < n; i++) {
		if ((unsigned)msgs[i].role > 2)
			return cm_free(b.p), cm_err_set(err, -EINVAL, "chat: bad role");
		switch (f) {
		case ENGINE_CHAT_CHATML:
			puts_(&b, "<|im_start|>");
			puts_(&b, role_names[msgs[i].role]);
			puts_(&b, "\n");
			put(&b, msgs[i].content, msgs[i].len);
			puts_(&b, "<|im_end|>\n");
			break;
		}
	}
	if (add_generation_prompt && f == ENGINE_CHAT_CHATML)
		puts_(&b, "<|im_start|>assistant\n");
	if (b.err) {
		cm_free(b.p);
		return cm_err_set(err, -ENOMEM, "chat: out of memory");
	}
	if (!b.p)
		put(&b, "", 0);
	*ret_text = b.p;
	if (ret_len)
		*ret_len = b.n;
	return 0;
}
