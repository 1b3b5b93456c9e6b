/* engine/chat.c: chat messages -> prompt text.
 *
 * No Jinja interpreter: the model's tokenizer.chat_template is matched
 * against a table of known formats (../shared/docs/gguf-formats.md §6), and
 * the messages are rendered by the format's rules (§6.2), byte for byte
 * what llama.cpp's legacy renderer writes (§6.3). A model without a
 * template gets chatml, as llama.cpp does.
 *
 * Detection differs from llama.cpp's where llama.cpp is wrong for models
 * people run: a template with <|user|> and <|assistant|> that ends
 * messages with eos_token (TinyLlama, Zephyr-beta) is zephyr with </s>,
 * not glmedge; a chatml template that knows enable_thinking (Qwen3) gets
 * the empty think block after the generation prompt, as Qwen3's own
 * template writes it with thinking off; llama3 is tested before the [INST]
 * family, because Llama 3 templates never contain [INST] but could mention
 * it in text. */
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

static const char *const format_names[ENGINE_CHAT_N_FORMATS] = {
    [ENGINE_CHAT_CHATML] = "chatml",
    [ENGINE_CHAT_QWEN3] = "qwen3",
    [ENGINE_CHAT_LLAMA2] = "llama2",
    [ENGINE_CHAT_LLAMA2_SYS] = "llama2-sys",
    [ENGINE_CHAT_LLAMA2_SYS_BOS] = "llama2-sys-bos",
    [ENGINE_CHAT_LLAMA2_SYS_STRIP] = "llama2-sys-strip",
    [ENGINE_CHAT_MISTRAL_V1] = "mistral-v1",
    [ENGINE_CHAT_MISTRAL_V3] = "mistral-v3",
    [ENGINE_CHAT_MISTRAL_V3_TEKKEN] = "mistral-v3-tekken",
    [ENGINE_CHAT_MISTRAL_V7] = "mistral-v7",
    [ENGINE_CHAT_LLAMA3] = "llama3",
    [ENGINE_CHAT_PHI3] = "phi3",
    [ENGINE_CHAT_PHI4] = "phi4",
    [ENGINE_CHAT_ZEPHYR] = "zephyr",
    [ENGINE_CHAT_ZEPHYR_EOS] = "zephyr-eos",
    [ENGINE_CHAT_FALCON3] = "falcon3",
    [ENGINE_CHAT_GEMMA] = "gemma",
    [ENGINE_CHAT_DEEPSEEK3] = "deepseek3",
};

const char *engine_chat_format_name(enum engine_chat_format f)
{
	return (unsigned)f < ENGINE_CHAT_N_FORMATS ? format_names[f] : "?";
}

const char *engine_chat_format_list(void)
{
	static char list[512];
	if (!list[0]) {
		size_t o = 0;
		for (int f = 0; f < ENGINE_CHAT_N_FORMATS; f++)
			o += (size_t)snprintf(list + o, sizeof(list) - o, "%s%s", f ? ", " : "",
			                      format_names[f]);
	}
	return list;
}

int engine_chat_format_from_name(const char *name, enum engine_chat_format *ret)
{
	for (int f = 0; name && f < ENGINE_CHAT_N_FORMATS; f++) {
		if (strcmp(name, format_names[f]) == 0) {
			*ret = (enum engine_chat_format)f;
			return 0;
		}
	}
	return -ENOENT;
}

/* ---- detection ----------------------------------------------------------- */

struct tmpl {
	const char *s;
	size_t n;
};

static bool has(struct tmpl t, const char *needle)
{
	return memmem(t.s, t.n, needle, strlen(needle)) != NULL;
}

static int classify(struct tmpl t, enum engine_chat_format *ret)
{
	enum engine_chat_format f;
	if (has(t, "<|im_start|>")) {
		if (has(t, "<|im_sep|>"))
			f = ENGINE_CHAT_PHI4;
		else if (has(t, "enable_thinking") && has(t, "<think>"))
			f = ENGINE_CHAT_QWEN3;
		else
			f = ENGINE_CHAT_CHATML;
	} else if (has(t, "<|start_header_id|>") && has(t, "<|end_header_id|>")) {
		f = ENGINE_CHAT_LLAMA3;
	} else if ((t.n >= 7 && memcmp(t.s, "mistral", 7) == 0) || has(t, "[INST]")) {
		if (has(t, "[SYSTEM_PROMPT]"))
			f = ENGINE_CHAT_MISTRAL_V7;
		else if (has(t, "' [INST] ' + system_message") || has(t, "[AVAILABLE_TOOLS]"))
			f = has(t, " [INST]")      ? ENGINE_CHAT_MISTRAL_V1
			    : has(t, "\"[INST]\"") ? ENGINE_CHAT_MISTRAL_V3_TEKKEN
			                           : ENGINE_CHAT_MISTRAL_V3;
		else if (has(t, "content.strip()"))
			f = ENGINE_CHAT_LLAMA2_SYS_STRIP;
		else if (has(t, "bos_token + '[INST]"))
			f = ENGINE_CHAT_LLAMA2_SYS_BOS;
		else if (has(t, "<<SYS>>"))
			f = ENGINE_CHAT_LLAMA2_SYS;
		else
			f = ENGINE_CHAT_LLAMA2;
	} else if (has(t, "<|assistant|>") && has(t, "<|end|>")) {
		f = ENGINE_CHAT_PHI3;
	} else if (has(t, "<|user|>") && has(t, "<|endoftext|>")) {
		f = ENGINE_CHAT_ZEPHYR;
	} else if (has(t, "<|user|>") && has(t, "<|assistant|>") && has(t, "eos_token")) {
		f = ENGINE_CHAT_ZEPHYR_EOS;
	} else if (has(t, "<|user|>") && has(t, "<|assistant|>") && has(t, "</s>")) {
		f = ENGINE_CHAT_FALCON3;
	} else if (has(t, "<start_of_turn>")) {
		f = ENGINE_CHAT_GEMMA;
	} else if (has(t, "<\xef\xbd\x9c"
	                  "Assistant\xef\xbd\x9c>") &&
	           has(t, "<\xef\xbd\x9c"
	                  "User\xef\xbd\x9c>")) {
		f = ENGINE_CHAT_DEEPSEEK3;
	} else {
		return -ENOTSUP;
	}
	*ret = f;
	return 0;
}

int engine_chat_detect_template(const char *tmpl, size_t len, enum engine_chat_format *ret,
                                struct cm_err *err)
{
	if (!tmpl || len == 0) {
		*ret = ENGINE_CHAT_CHATML; /* llama.cpp's default without a template */
		return 0;
	}
	for (int f = 0; f < ENGINE_CHAT_N_FORMATS; f++) {
		if (strlen(format_names[f]) == len && memcmp(format_names[f], tmpl, len) == 0) {
			*ret = (enum engine_chat_format)f;
			return 0;
		}
	}
	if (classify((struct tmpl){tmpl, len}, ret) == 0)
		return 0;
	return cm_err_set(err, -ENOTSUP,
	                  "chat: unknown chat template; set chat_template (--chat-template) to "
	                  "one of: %s",
	                  engine_chat_format_list());
}

int engine_chat_detect(const engine_model *m, const char *override, enum engine_chat_format *ret,
                       struct cm_err *err)
{
	if (override && *override) {
		if (engine_chat_format_from_name(override, ret) == 0)
			return 0;
		return cm_err_set(err, -ENOTSUP, "chat: unknown chat_template '%.64s' (known: %s)",
		                  override, engine_chat_format_list());
	}
	struct gguf_str tmpl = {0};
	if (!m || !m->file || gguf_get_str(m->file, "tokenizer.chat_template", &tmpl, NULL) != 0)
		tmpl.len = 0;
	return engine_chat_detect_template(tmpl.ptr, tmpl.len, ret, err);
}

/* ---- rendering (§6.2) ------------------------------------------------------- */

static inline bool is_space(char c)
{
	return c == ' ' || (c >= '\t' && c <= '\r');
}

/* The content without leading and trailing whitespace. */
static struct tmpl trim(const struct engine_chat_msg *m)
{
	const char *s = m->content ? m->content : "";
	size_t n = m->content ? m->len : 0;
	while (n && is_space(*s))
		s++, n--;
	while (n && is_space(s[n - 1]))
		n--;
	return (struct tmpl){s, n};
}

static void put_c(struct buf *b, const struct engine_chat_msg *m)
{
	if (m->content)
		put(b, m->content, m->len);
}

static void put_t(struct buf *b, struct tmpl t)
{
	put(b, t.s, t.n);
}

/* Qwen3's template keeps only what follows the last </think> of an
 * assistant message in the history, without its leading newlines. */
static struct tmpl strip_think(const struct engine_chat_msg *m)
{
	struct tmpl t = {m->content ? m->content : "", m->content ? m->len : 0};
	const char *end = NULL;
	for (const char *p = t.s; (p = memmem(p, t.n - (size_t)(p - t.s), "</think>", 8)); p += 8)
		end = p + 8;
	if (!end)
		return t;
	while (end < t.s + t.n && *end == '\n')
		end++;
	return (struct tmpl){end, t.n - (size_t)(end - t.s)};
}

static void render_llama2(struct buf *b, enum engine_chat_format f,
                          const struct engine_chat_msg *msgs, size_t n)
{
	bool sys_tags = f != ENGINE_CHAT_LLAMA2;
	bool strip = f == ENGINE_CHAT_LLAMA2_SYS_STRIP;
	bool in_turn = true;
	puts_(b, "[INST] ");
	for (size_t i = 0; i < n; i++) {
		const struct engine_chat_msg *m = &msgs[i];
		struct tmpl c = {m->content ? m->content : "", m->content ? m->len : 0};
		if (strip)
			c = trim(m);
		if (!in_turn) {
			in_turn = true;
			puts_(b, f == ENGINE_CHAT_LLAMA2_SYS_BOS ? "<s>[INST] " : "[INST] ");
		}
		if (m->role == ENGINE_CHAT_SYSTEM) {
			puts_(b, sys_tags ? "<<SYS>>\n" : "");
			put_t(b, c);
			puts_(b, sys_tags ? "\n<</SYS>>\n\n" : "\n");
		} else if (m->role == ENGINE_CHAT_USER) {
			put_t(b, c);
			puts_(b, " [/INST]");
		} else {
			put_t(b, c);
			puts_(b, "</s>");
			in_turn = false;
		}
	}
}

static void render_mistral(struct buf *b, enum engine_chat_format f,
                           const struct engine_chat_msg *msgs, size_t n)
{
	const char *lead = f == ENGINE_CHAT_MISTRAL_V1 ? " " : "";
	const char *trail = f == ENGINE_CHAT_MISTRAL_V3_TEKKEN ? "" : " ";
	bool in_turn = false;
	for (size_t i = 0; i < n; i++) {
		const struct engine_chat_msg *m = &msgs[i];
		if (!in_turn) {
			puts_(b, lead);
			puts_(b, "[INST]");
			puts_(b, trail);
			in_turn = true;
		}
		if (m->role == ENGINE_CHAT_SYSTEM) {
			put_c(b, m);
			puts_(b, "\n\n");
		} else if (m->role == ENGINE_CHAT_USER) {
			put_c(b, m);
			puts_(b, lead);
			puts_(b, "[/INST]");
		} else {
			puts_(b, trail);
			if (f == ENGINE_CHAT_MISTRAL_V3)
				put_t(b, trim(m));
			else
				put_c(b, m);
			puts_(b, "</s>");
			in_turn = false;
		}
	}
}

static void render_gemma(struct buf *b, const struct engine_chat_msg *msgs, size_t n, bool gen)
{
	struct tmpl sys = {NULL, 0};
	for (size_t i = 0; i < n; i++) {
		const struct engine_chat_msg *m = &msgs[i];
		if (m->role == ENGINE_CHAT_SYSTEM) {
			sys = trim(m);
			continue;
		}
		bool model = m->role == ENGINE_CHAT_ASSISTANT;
		puts_(b, "<start_of_turn>");
		puts_(b, model ? "model\n" : "user\n");
		if (sys.n && !model) {
			put_t(b, sys);
			puts_(b, "\n\n");
			sys.n = 0;
		}
		put_t(b, trim(m));
		puts_(b, "<end_of_turn>\n");
	}
	if (gen)
		puts_(b, "<start_of_turn>model\n");
}

/* Formats where every message is prefix + role + middle + content + suffix
 * and the generation prompt a fixed string. */
struct simple_fmt {
	const char *pre, *mid, *suf, *gen;
	bool trim;
};

static const struct simple_fmt *simple_format(enum engine_chat_format f)
{
	static const struct simple_fmt chatml = {"<|im_start|>", "\n", "<|im_end|>\n",
	                                         "<|im_start|>assistant\n", false};
	static const struct simple_fmt qwen3 = {"<|im_start|>", "\n", "<|im_end|>\n",
	                                        "<|im_start|>assistant\n<think>\n\n</think>\n\n",
	                                        false};
	static const struct simple_fmt llama3 = {
	    "<|start_header_id|>", "<|end_header_id|>\n\n", "<|eot_id|>",
	    "<|start_header_id|>assistant<|end_header_id|>\n\n", true};
	static const struct simple_fmt phi3 = {"<|", "|>\n", "<|end|>\n", "<|assistant|>\n", false};
	static const struct simple_fmt phi4 = {"<|im_start|>", "<|im_sep|>", "<|im_end|>",
	                                       "<|im_start|>assistant<|im_sep|>", false};
	static const struct simple_fmt zephyr = {"<|", "|>\n", "<|endoftext|>\n", "<|assistant|>\n",
	                                         false};
	static const struct simple_fmt zephyr_eos = {"<|", "|>\n", "</s>\n", "<|assistant|>\n",
	                                             false};
	static const struct simple_fmt falcon3 = {"<|", "|>\n", "\n", "<|assistant|>\n", false};
	switch (f) {
	case ENGINE_CHAT_CHATML:
		return &chatml;
	case ENGINE_CHAT_QWEN3:
		return &qwen3;
	case ENGINE_CHAT_LLAMA3:
		return &llama3;
	case ENGINE_CHAT_PHI3:
		return &phi3;
	case ENGINE_CHAT_PHI4:
		return &phi4;
	case ENGINE_CHAT_ZEPHYR:
		return &zephyr;
	case ENGINE_CHAT_ZEPHYR_EOS:
		return &zephyr_eos;
	case ENGINE_CHAT_FALCON3:
		return &falcon3;
	default:
		return NULL;
	}
}

static void render_deepseek3(struct buf *b, const struct engine_chat_msg *msgs, size_t n, bool gen)
{
	static const char user[] = "<\xef\xbd\x9cUser\xef\xbd\x9c>";
	static const char assistant[] = "<\xef\xbd\x9c"
	                                "Assistant\xef\xbd\x9c>";
	static const char eos[] = "<\xef\xbd\x9c"
	                          "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>";
	for (size_t i = 0; i < n; i++) {
		const struct engine_chat_msg *m = &msgs[i];
		if (m->role == ENGINE_CHAT_SYSTEM) {
			put_c(b, m);
			puts_(b, "\n\n");
		} else if (m->role == ENGINE_CHAT_USER) {
			puts_(b, user);
			put_c(b, m);
		} else {
			puts_(b, assistant);
			put_c(b, m);
			puts_(b, eos);
		}
	}
	if (gen)
		puts_(b, assistant);
}

int engine_chat_render(enum engine_chat_format f, const struct engine_chat_msg *msgs, size_t n,
                       bool add_generation_prompt, char **ret_text, size_t *ret_len,
                       struct cm_err *err)
{
	*ret_text = NULL;
	if ((unsigned)f >= ENGINE_CHAT_N_FORMATS)
		return cm_err_set(err, -EINVAL, "chat: bad format %d", (int)f);
	if (n && !msgs)
		return cm_err_set(err, -EINVAL, "chat: no messages");
	for (size_t i = 0; i < n; i++) {
		if ((unsigned)msgs[i].role > 2)
			return cm_err_set(err, -EINVAL, "chat: message %zu: bad role %d", i,
			                  (int)msgs[i].role);
		if (!msgs[i].content && msgs[i].len)
			return cm_err_set(err, -EINVAL, "chat: message %zu: no content", i);
	}
	struct buf b = {0};
	const struct simple_fmt *sf = simple_format(f);
	if (sf) {
		for (size_t i = 0; i < n; i++) {
			const struct engine_chat_msg *m = &msgs[i];
			puts_(&b, sf->pre);
			puts_(&b, role_names[m->role]);
			puts_(&b, sf->mid);
			if (sf->trim)
				put_t(&b, trim(m));
			else if (f == ENGINE_CHAT_QWEN3 && m->role == ENGINE_CHAT_ASSISTANT)
				put_t(&b, strip_think(m));
			else
				put_c(&b, m);
			puts_(&b, sf->suf);
		}
		if (add_generation_prompt)
			puts_(&b, sf->gen);
	} else {
		switch (f) {
		case ENGINE_CHAT_LLAMA2:
		case ENGINE_CHAT_LLAMA2_SYS:
		case ENGINE_CHAT_LLAMA2_SYS_BOS:
		case ENGINE_CHAT_LLAMA2_SYS_STRIP:
			render_llama2(&b, f, msgs, n);
			break;
		case ENGINE_CHAT_MISTRAL_V1:
		case ENGINE_CHAT_MISTRAL_V3:
		case ENGINE_CHAT_MISTRAL_V3_TEKKEN:
			render_mistral(&b, f, msgs, n);
			break;
		case ENGINE_CHAT_MISTRAL_V7:
			for (size_t i = 0; i < n; i++) {
				static const char *const open[] = {"[SYSTEM_PROMPT] ", "[INST] ",
				                                   " "};
				static const char *const close[] = {"[/SYSTEM_PROMPT]", "[/INST]",
				                                    "</s>"};
				puts_(&b, open[msgs[i].role]);
				put_c(&b, &msgs[i]);
				puts_(&b, close[msgs[i].role]);
			}
			break;
		case ENGINE_CHAT_GEMMA:
			render_gemma(&b, msgs, n, add_generation_prompt);
			break;
		case ENGINE_CHAT_DEEPSEEK3:
			render_deepseek3(&b, msgs, n, add_generation_prompt);
			break;
		default:
			break;
		}
	}
	if (!b.p)
		put(&b, "", 0);
	if (b.err) {
		cm_free(b.p);
		return cm_err_set(err, -ENOMEM, "chat: out of memory");
	}
	*ret_text = b.p;
	if (ret_len)
		*ret_len = b.n;
	return 0;
}
