/* tests/unit/test_engine_chat.c: chat formats. The expected strings are the
 * renderings of the standard conversation written down in
 * ../shared/docs/gguf-formats.md §6.3 (and derived from the §6.2 rules for
 * the formats §6.3 does not list); detection from real templates' telling
 * parts, the override, and the refusal of an unknown template. */
#include "engine/engine.h"
#include "engine/gguf.h"
#include "tests/test.h"

/* The conversation of §6.3. */
static const struct engine_chat_msg conv[] = {
    {ENGINE_CHAT_SYSTEM, "You are a helpful assistant", 27},
    {ENGINE_CHAT_USER, "Hello", 5},
    {ENGINE_CHAT_ASSISTANT, "Hi there", 8},
    {ENGINE_CHAT_USER, "Who are you", 11},
    {ENGINE_CHAT_ASSISTANT, "   I am an assistant   ", 23},
    {ENGINE_CHAT_USER, "Another question", 16},
};
#define N_CONV (sizeof(conv) / sizeof(conv[0]))

static char *render(enum engine_chat_format f, const struct engine_chat_msg *m, size_t n, bool gen)
{
	char *s = NULL;
	size_t len = 0;
	struct cm_err err = {0};
	int r = engine_chat_render(f, m, n, gen, &s, &len, &err);
	CHECK_MSG(r == 0, "%s", err.msg);
	if (s)
		CHECK_EQ_INT(strlen(s), len);
	return s;
}

static void check_format(const char *name, const char *want)
{
	enum engine_chat_format f;
	CHECK_OK(engine_chat_format_from_name(name, &f));
	CHECK_STREQ(engine_chat_format_name(f), name);
	char *s = render(f, conv, N_CONV, true);
	CHECK_MSG(s && strcmp(s, want) == 0, "%s:\n got  '%s'\n want '%s'", name, s, want);
	free(s);
}

static void test_standard_conversation(void)
{
	check_format(
	    "chatml",
	    "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\n"
	    "Hello<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\n"
	    "Who are you<|im_end|>\n<|im_start|>assistant\n   I am an assistant   "
	    "<|im_end|>\n<|im_start|>user\nAnother question<|im_end|>\n"
	    "<|im_start|>assistant\n");
	check_format("llama3",
	             "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant"
	             "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
	             "<|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|>"
	             "<|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|>"
	             "<|start_header_id|>assistant<|end_header_id|>\n\nI am an assistant<|eot_id|>"
	             "<|start_header_id|>user<|end_header_id|>\n\nAnother question<|eot_id|>"
	             "<|start_header_id|>assistant<|end_header_id|>\n\n");
	check_format("llama2", "[INST] You are a helpful assistant\nHello [/INST]Hi there</s>"
	                       "[INST] Who are you [/INST]   I am an assistant   </s>"
	                       "[INST] Another question [/INST]");
	check_format(
	    "llama2-sys",
	    "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there"
	    "</s>[INST] Who are you [/INST]   I am an assistant   </s>"
	    "[INST] Another question [/INST]");
	check_format(
	    "llama2-sys-bos",
	    "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there"
	    "</s><s>[INST] Who are you [/INST]   I am an assistant   </s>"
	    "<s>[INST] Another question [/INST]");
	check_format(
	    "llama2-sys-strip",
	    "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there"
	    "</s>[INST] Who are you [/INST]I am an assistant</s>"
	    "[INST] Another question [/INST]");
	check_format("mistral-v1",
	             " [INST] You are a helpful assistant\n\nHello [/INST] Hi there</s>"
	             " [INST] Who are you [/INST]    I am an assistant   </s>"
	             " [INST] Another question [/INST]");
	check_format(
	    "mistral-v3",
	    "[INST] You are a helpful assistant\n\nHello[/INST] Hi there</s>"
	    "[INST] Who are you[/INST] I am an assistant</s>[INST] Another question[/INST]");
	check_format("mistral-v3-tekken",
	             "[INST]You are a helpful assistant\n\nHello[/INST]Hi there</s>"
	             "[INST]Who are you[/INST]   I am an assistant   </s>"
	             "[INST]Another question[/INST]");
	check_format(
	    "mistral-v7",
	    "[SYSTEM_PROMPT] You are a helpful assistant[/SYSTEM_PROMPT][INST] Hello[/INST]"
	    " Hi there</s>[INST] Who are you[/INST]    I am an assistant   </s>"
	    "[INST] Another question[/INST]");
	check_format("phi3",
	             "<|system|>\nYou are a helpful assistant<|end|>\n<|user|>\nHello<|end|>\n"
	             "<|assistant|>\nHi there<|end|>\n<|user|>\nWho are you<|end|>\n"
	             "<|assistant|>\n   I am an assistant   <|end|>\n<|user|>\n"
	             "Another question<|end|>\n<|assistant|>\n");
	check_format("phi4",
	             "<|im_start|>system<|im_sep|>You are a helpful assistant<|im_end|>"
	             "<|im_start|>user<|im_sep|>Hello<|im_end|><|im_start|>assistant<|im_sep|>"
	             "Hi there<|im_end|><|im_start|>user<|im_sep|>Who are you<|im_end|>"
	             "<|im_start|>assistant<|im_sep|>   I am an assistant   <|im_end|>"
	             "<|im_start|>user<|im_sep|>Another question<|im_end|>"
	             "<|im_start|>assistant<|im_sep|>");
	check_format("gemma",
	             "<start_of_turn>user\nYou are a helpful assistant\n\nHello<end_of_turn>\n"
	             "<start_of_turn>model\nHi there<end_of_turn>\n<start_of_turn>user\n"
	             "Who are you<end_of_turn>\n<start_of_turn>model\nI am an assistant"
	             "<end_of_turn>\n<start_of_turn>user\nAnother question<end_of_turn>\n"
	             "<start_of_turn>model\n");
	check_format("zephyr",
	             "<|system|>\nYou are a helpful assistant<|endoftext|>\n<|user|>\nHello"
	             "<|endoftext|>\n<|assistant|>\nHi there<|endoftext|>\n<|user|>\nWho are you"
	             "<|endoftext|>\n<|assistant|>\n   I am an assistant   <|endoftext|>\n"
	             "<|user|>\nAnother question<|endoftext|>\n<|assistant|>\n");
	/* the §6.4 TinyLlama/Zephyr-beta shape: zephyr with </s> */
	check_format("zephyr-eos",
	             "<|system|>\nYou are a helpful assistant</s>\n<|user|>\nHello</s>\n"
	             "<|assistant|>\nHi there</s>\n<|user|>\nWho are you</s>\n"
	             "<|assistant|>\n   I am an assistant   </s>\n<|user|>\nAnother question</s>\n"
	             "<|assistant|>\n");
	check_format("falcon3",
	             "<|system|>\nYou are a helpful assistant\n<|user|>\nHello\n<|assistant|>\n"
	             "Hi there\n<|user|>\nWho are you\n<|assistant|>\n   I am an assistant   \n"
	             "<|user|>\nAnother question\n<|assistant|>\n");
	check_format("deepseek3",
	             "You are a helpful assistant\n\n<\xef\xbd\x9cUser\xef\xbd\x9c>Hello"
	             "<\xef\xbd\x9c"
	             "Assistant\xef\xbd\x9c>Hi there"
	             "<\xef\xbd\x9c"
	             "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
	             "<\xef\xbd\x9cUser\xef\xbd\x9c>Who are you"
	             "<\xef\xbd\x9c"
	             "Assistant\xef\xbd\x9c>   I am an assistant   "
	             "<\xef\xbd\x9c"
	             "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
	             "<\xef\xbd\x9cUser\xef\xbd\x9c>Another question"
	             "<\xef\xbd\x9c"
	             "Assistant\xef\xbd\x9c>");
	/* qwen3, thinking off (§6.4): chatml, the empty think block after
	 * the generation prompt */
	check_format(
	    "qwen3",
	    "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\n"
	    "Hello<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\n"
	    "Who are you<|im_end|>\n<|im_start|>assistant\n   I am an assistant   "
	    "<|im_end|>\n<|im_start|>user\nAnother question<|im_end|>\n"
	    "<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

/* Every format: no generation prompt, a single user message, no messages. */
static void test_shapes(void)
{
	static const struct engine_chat_msg one[] = {{ENGINE_CHAT_USER, "Hi", 2}};
	for (int f = 0; f < ENGINE_CHAT_N_FORMATS; f++) {
		char *a = render((enum engine_chat_format)f, conv, N_CONV, true);
		char *b = render((enum engine_chat_format)f, conv, N_CONV, false);
		/* the generation prompt only ever appends */
		CHECK(a && b && strncmp(a, b, strlen(b)) == 0);
		free(a);
		free(b);
		a = render((enum engine_chat_format)f, one, 1, true);
		CHECK(a && strstr(a, "Hi"));
		free(a);
		a = render((enum engine_chat_format)f, NULL, 0, false);
		CHECK(a != NULL);
		free(a);
	}
	char *s = render(ENGINE_CHAT_CHATML, one, 1, false);
	CHECK_STREQ(s, "<|im_start|>user\nHi<|im_end|>\n");
	free(s);
	s = render(ENGINE_CHAT_LLAMA3, one, 1, true);
	CHECK_STREQ(s, "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
	               "<|start_header_id|>assistant<|end_header_id|>\n\n");
	free(s);
	/* qwen3 drops the thinking of earlier assistant turns */
	static const struct engine_chat_msg think[] = {
	    {ENGINE_CHAT_USER, "Q", 1},
	    {ENGINE_CHAT_ASSISTANT, "<think>\nhmm\n</think>\n\nA", 23},
	};
	s = render(ENGINE_CHAT_QWEN3, think, 2, false);
	CHECK_STREQ(s, "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n");
	free(s);
	/* a bad role is refused */
	struct engine_chat_msg bad = {(enum engine_chat_role)7, "x", 1};
	char *t = NULL;
	CHECK_EQ_INT(engine_chat_render(ENGINE_CHAT_CHATML, &bad, 1, true, &t, NULL, NULL),
	             -EINVAL);
	CHECK(t == NULL);
}

static enum engine_chat_format detect(const char *tmpl)
{
	enum engine_chat_format f = ENGINE_CHAT_N_FORMATS;
	struct cm_err err = {0};
	int r = engine_chat_detect_template(tmpl, tmpl ? strlen(tmpl) : 0, &f, &err);
	CHECK_MSG(r == 0, "'%s': %s", tmpl, err.msg);
	return f;
}

static void test_detect(void)
{
	CHECK_EQ_INT(detect(NULL), ENGINE_CHAT_CHATML);
	CHECK_EQ_INT(detect("gemma"), ENGINE_CHAT_GEMMA); /* a format name */
	/* Qwen2.5 / SmolLM2 */
	CHECK_EQ_INT(detect("{%- for message in messages %}{{'<|im_start|>' + message['role'] + "
	                    "'\\n' + message['content'] + '<|im_end|>' + '\\n'}}"),
	             ENGINE_CHAT_CHATML);
	/* Qwen3 */
	CHECK_EQ_INT(detect("{%- if enable_thinking is defined and enable_thinking is false %}"
	                    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}<|im_start|>"),
	             ENGINE_CHAT_QWEN3);
	/* Phi-4 */
	CHECK_EQ_INT(detect("{{'<|im_start|>' + message['role'] + '<|im_sep|>'}}"),
	             ENGINE_CHAT_PHI4);
	/* Llama 3.x */
	CHECK_EQ_INT(detect("{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>"
	                    "\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}"),
	             ENGINE_CHAT_LLAMA3);
	/* TinyLlama / Zephyr-beta: eos_token, not glmedge */
	CHECK_EQ_INT(detect("{% for message in messages %}\n{% if message['role'] == 'user' %}\n"
	                    "{{ '<|user|>\\n' + message['content'] + eos_token }}\n{% elif "
	                    "message['role'] == 'assistant' %}\n{{ '<|assistant|>\\n'  + "
	                    "message['content'] + eos_token }}\n{% endif %}\n{% if loop.last and "
	                    "add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n"
	                    "{% endfor %}"),
	             ENGINE_CHAT_ZEPHYR_EOS);
	CHECK_EQ_INT(detect("{{ '<|user|>\\n' + message['content'] + '<|endoftext|>' }}"),
	             ENGINE_CHAT_ZEPHYR);
	/* Phi-3 */
	CHECK_EQ_INT(detect("{{'<|user|>' + '\\n' + message['content'] + '<|end|>' + '\\n' + "
	                    "'<|assistant|>' + '\\n'}}"),
	             ENGINE_CHAT_PHI3);
	/* Mistral 7B Instruct v0.2 (llama2 without <<SYS>>) */
	CHECK_EQ_INT(detect("{{ bos_token }}{% for message in messages %}{% if message['role'] "
	                    "== 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
	                    "{% elif message['role'] == 'assistant' %}{{ message['content'] + "
	                    "eos_token}}{% endif %}{% endfor %}"),
	             ENGINE_CHAT_LLAMA2);
	CHECK_EQ_INT(detect("[INST] <<SYS>>\\n' + system_message + '\\n<</SYS>>"),
	             ENGINE_CHAT_LLAMA2_SYS);
	CHECK_EQ_INT(detect("{{ bos_token + '[INST] ' + content.strip() }}"),
	             ENGINE_CHAT_LLAMA2_SYS_STRIP);
	CHECK_EQ_INT(detect("{{ bos_token + '[INST] ' + content }}<<SYS>>"),
	             ENGINE_CHAT_LLAMA2_SYS_BOS);
	CHECK_EQ_INT(detect("[AVAILABLE_TOOLS] {{ ' [INST] ' + message['content'] }}"),
	             ENGINE_CHAT_MISTRAL_V1);
	CHECK_EQ_INT(detect("[AVAILABLE_TOOLS]{{ '[INST] ' + message['content'] }}"),
	             ENGINE_CHAT_MISTRAL_V3);
	CHECK_EQ_INT(detect("[AVAILABLE_TOOLS]{{ \"[INST]\" + message['content'] }}"),
	             ENGINE_CHAT_MISTRAL_V3_TEKKEN);
	CHECK_EQ_INT(detect("{{ '[SYSTEM_PROMPT] ' + system }}[INST]"), ENGINE_CHAT_MISTRAL_V7);
	/* Gemma */
	CHECK_EQ_INT(detect("{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + "
	                    "'<end_of_turn>\\n' }}"),
	             ENGINE_CHAT_GEMMA);
	CHECK_EQ_INT(detect("{{'<|user|>\\n' + message['content'] + '</s>\\n<|assistant|>\\n'}}"),
	             ENGINE_CHAT_FALCON3);
	CHECK_EQ_INT(detect("{{'<\xef\xbd\x9cUser\xef\xbd\x9c>' + content + "
	                    "'<\xef\xbd\x9c"
	                    "Assistant\xef\xbd\x9c>'}}"),
	             ENGINE_CHAT_DEEPSEEK3);
}

static void test_unknown_and_override(void)
{
	enum engine_chat_format f;
	struct cm_err err = {0};
	const char *t = "{% for m in messages %}### {{ m.role }}: {{ m.content }}{% endfor %}";
	CHECK_EQ_INT(engine_chat_detect_template(t, strlen(t), &f, &err), -ENOTSUP);
	CHECK(strstr(err.msg, "chat_template") != NULL);
	CHECK(strstr(err.msg, "--chat-template") != NULL);
	CHECK(strstr(err.msg, "zephyr-eos") != NULL);
	/* the override wins over anything */
	CHECK_OK(engine_chat_detect(NULL, "mistral-v7", &f, &err));
	CHECK_EQ_INT(f, ENGINE_CHAT_MISTRAL_V7);
	CHECK_EQ_INT(engine_chat_detect(NULL, "jinja2", &f, &err), -ENOTSUP);
	CHECK(strstr(err.msg, "chat_template") && strstr(err.msg, "chatml"));
	CHECK_EQ_INT(engine_chat_format_from_name("nope", &f), -ENOENT);
	/* every name round-trips */
	for (int i = 0; i < ENGINE_CHAT_N_FORMATS; i++) {
		const char *nm = engine_chat_format_name((enum engine_chat_format)i);
		CHECK(strstr(engine_chat_format_list(), nm) != NULL);
		CHECK_OK(engine_chat_format_from_name(nm, &f));
		CHECK_EQ_INT(f, i);
	}
}

/* The templates stored in the vocab files. */
static void test_vocab_templates(void)
{
	static const struct {
		const char *file;
		enum engine_chat_format want;
	} cases[] = {
	    {"vocab/ggml-vocab-llama-bpe.gguf", ENGINE_CHAT_LLAMA3},
	    /* the qwen2 vocab carries Qwen3's template (enable_thinking) */
	    {"vocab/ggml-vocab-qwen2.gguf", ENGINE_CHAT_QWEN3},
	    {"vocab/ggml-vocab-phi-3.gguf", ENGINE_CHAT_PHI3},
	};
	int n = 0;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const char *path = test_data_path(cases[i].file);
		struct gguf_file *g = NULL;
		if (gguf_open(path, &g, NULL) != 0)
			continue;
		n++;
		struct gguf_str s = {0};
		CHECK_OK(gguf_get_str(g, "tokenizer.chat_template", &s, NULL));
		enum engine_chat_format f = ENGINE_CHAT_N_FORMATS;
		struct cm_err err = {0};
		CHECK_OK(engine_chat_detect_template(s.ptr, s.len, &f, &err));
		CHECK_MSG(f == cases[i].want, "%s: %s", path, engine_chat_format_name(f));
		gguf_close(g);
	}
	if (!n)
		TEST_SKIP_DATA("no vocab files with chat templates");
}

int main(void)
{
	TEST_RUN(test_standard_conversation);
	TEST_RUN(test_shapes);
	TEST_RUN(test_detect);
	TEST_RUN(test_unknown_and_override);
	TEST_RUN(test_vocab_templates);
	return test_finish();
}
