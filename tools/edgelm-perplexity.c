/* tools/edgelm-perplexity.c: perplexity of a model over a text, and the KL
 * divergence of its distributions from a base run's, as llama.cpp's
 * llama-perplexity computes them, so the figures compare.
 *
 *   edgelm-perplexity -m MODEL -f TEXT [--ctx N] [--chunks N] [--batch N]
 *                     [--save-logits FILE | --kl-divergence FILE]
 *
 * The text is tokenized once (BOS first when the model adds one) and cut
 * into chunks of --ctx tokens (the rest dropped). Each chunk is evaluated
 * from an empty cache with its first token replaced by BOS, and the second
 * half is scored: the logits at positions ctx/2 .. ctx-2 against the
 * tokens that follow (ctx/2 - 1 a chunk). PPL = exp(mean NLL), its error
 * exp(mean) times the standard error of the NLLs, as llama-perplexity
 * prints it. --save-logits writes every scored position's log-softmax (as
 * f32: f16's steps of up to 0.008 at log p = -10 would be as large as a
 * good quantization's KL) with the tokens; --kl-divergence reads such a file (a base run,
 * usually F32 or F16) and reports the mean KL(base || this), the share of
 * positions whose top token agrees, and the change of the true token's
 * probability (Δp, mean and RMS).
 *
 * Exit codes: 0 ok, 1 usage, 2 bad model, text or base file, 3 runtime. */
#include "engine/engine.h"
#include "tools/lib/tools.h"

#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXIT_USAGE 1
#define EXIT_INPUT 2
#define EXIT_RUNTIME 3

/* The --save-logits file: this header, the tokens (int32, n_chunk * n_ctx
 * of them), then per scored position n_vocab log-probabilities as f32. */
#define LOGITS_MAGIC "EDGLPPL2"
struct logits_hdr {
	char magic[8];
	uint32_t n_vocab, n_ctx, n_chunk, reserved;
};

static void usage(FILE *o)
{
	fprintf(o,
		"usage: edgelm-perplexity -m MODEL -f TEXT [options]\n"
		"Perplexity of MODEL over TEXT, as llama-perplexity computes it (chunks of\n"
		"--ctx tokens from BOS, the second half of each scored).\n"
		"  -m, --model FILE       GGUF model\n"
		"  -f, --file FILE        the text (UTF-8; - for stdin)\n"
		"  -c, --ctx N            tokens per chunk (default 512)\n"
		"      --chunks N         chunks at most (default: as many as the text holds)\n"
		"  -b, --batch N          tokens per engine step (default: --ctx)\n"
		"  -t, --threads N        worker threads (default: one per CPU)\n"
		"      --isa NAME         force a kernel variant (also EDGELM_ISA)\n"
		"      --kv-type TYPE     KV cache type (default f32, as the references)\n"
		"      --save-logits FILE write the scored positions' log-probabilities (a base\n"
		"                         for --kl-divergence)\n"
		"      --kl-divergence FILE  compare with a base run's --save-logits: mean KL,\n"
		"                         top-token agreement, Δp\n"
		"  -q, --quiet            no progress on stderr\n"
		"  -h, --help\n");
}

static char *read_all(const char *path, size_t *ret_len)
{
	FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
	if (!f)
		return NULL;
	size_t cap = 1 << 16, n = 0;
	char *buf = malloc(cap);
	size_t r;
	while (buf && (r = fread(buf + n, 1, cap - n - 1, f)) > 0) {
		n += r;
		if (n + 1 == cap) {
			char *nb = realloc(buf, cap *= 2);
			if (!nb) {
				free(buf);
				buf = NULL;
			}
			buf = nb;
		}
	}
	if (f != stdin)
		fclose(f);
	if (buf)
		buf[n] = '\0';
	*ret_len = n;
	return buf;
}

/* log-softmax of n logits into out (double sums); returns the argmax */
static int log_softmax(const float *l, int n, float *out)
{
	float mx = -INFINITY;
	int am = 0;
	for (int i = 0; i < n; i++)
		if (l[i] > mx) {
			mx = l[i];
			am = i;
		}
	double s = 0;
	for (int i = 0; i < n; i++)
		s += exp((double)l[i] - mx);
	double lse = (double)mx + log(s);
	for (int i = 0; i < n; i++)
		out[i] = (float)((double)l[i] - lse);
	return am;
}

struct kl_stats {
	double kl, kl2, dp, dp2;
	long same, n;
};

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"model", required_argument, NULL, 'm'},   {"file", required_argument, NULL, 'f'},
		{"ctx", required_argument, NULL, 'c'},     {"chunks", required_argument, NULL, 'C'},
		{"batch", required_argument, NULL, 'b'},   {"threads", required_argument, NULL, 't'},
		{"isa", required_argument, NULL, 'I'},     {"kv-type", required_argument, NULL, 'K'},
		{"save-logits", required_argument, NULL, 'S'},
		{"kl-divergence", required_argument, NULL, 'D'},
		{"quiet", no_argument, NULL, 'q'},         {"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	const char *model = NULL, *text_path = NULL, *isa = getenv("EDGELM_ISA"), *save = NULL,
		   *base = NULL, *kv = "f32";
	int n_ctx = 512, max_chunks = -1, n_batch = 0, threads = 0;
	bool quiet = false, bad = false;
	int c;
	static const char P[] = "edgelm-perplexity";
	while ((c = getopt_long(argc, argv, "m:f:c:b:t:qh", opts, NULL)) != -1) {
		switch (c) {
		case 'm': model = optarg; break;
		case 'f': text_path = optarg; break;
		case 'c': bad |= tools_opt_int(P, "--ctx", optarg, 8, 1 << 20, &n_ctx) != 0; break;
		case 'C': bad |= tools_opt_int(P, "--chunks", optarg, 1, 1 << 30, &max_chunks) != 0; break;
		case 'b': bad |= tools_opt_int(P, "--batch", optarg, 1, 1 << 20, &n_batch) != 0; break;
		case 't': bad |= tools_opt_int(P, "--threads", optarg, 0, 4096, &threads) != 0; break;
		case 'I': isa = optarg; break;
		case 'K': kv = optarg; break;
		case 'S': save = optarg; break;
		case 'D': base = optarg; break;
		case 'q': quiet = true; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return EXIT_USAGE;
		}
	}
	if (bad || optind < argc || !model || !text_path || (save && base)) {
		usage(stderr);
		return EXIT_USAGE;
	}
	enum engine_kv_type kvt;
	if (engine_kv_type_from_name(kv, &kvt) != 0) {
		fprintf(stderr, "%s: --kv-type: expected %s, not '%s'\n", P, engine_kv_type_list(), kv);
		return EXIT_USAGE;
	}
	size_t text_len;
	char *text = read_all(text_path, &text_len);
	if (!text) {
		fprintf(stderr, "%s: %s: cannot read\n", P, text_path);
		return EXIT_INPUT;
	}

	struct cm_err err = {0};
	struct engine_params ep = {.n_threads = threads, .isa = isa};
	engine_model *m = NULL;
	engine_ctx *cx = NULL;
	int rc = 0;
	int32_t *toks = NULL;
	float *lp = NULL, *blp = NULL;
	FILE *sf = NULL, *bf = NULL;
	if (engine_model_load(model, &ep, &m, &err) != 0) {
		fprintf(stderr, "%s: %s: %s\n", P, model, err.msg);
		free(text);
		return EXIT_INPUT;
	}
	struct engine_model_info info;
	engine_model_get_info(m, &info);
	if ((uint32_t)n_ctx > info.n_ctx) {
		fprintf(stderr, "%s: --ctx %d is beyond the model's context of %u\n", P, n_ctx,
			info.n_ctx);
		rc = EXIT_USAGE;
		goto out;
	}
	struct engine_ctx_params cp = {.n_ctx = (uint32_t)n_ctx,
				       .n_seq = 1,
				       .n_batch = (uint32_t)(n_batch ? n_batch : n_ctx),
				       .kv_type = kvt};
	if (engine_ctx_new(m, &cp, &cx, &err) != 0) {
		fprintf(stderr, "%s: %s\n", P, err.msg);
		rc = EXIT_RUNTIME;
		goto out;
	}
	const engine_tokenizer *tok = engine_model_tokenizer(m);
	int cap = (int)CM_MIN(text_len + 16, (size_t)INT32_MAX / 4), n_tok = 0;
	toks = malloc((size_t)cap * sizeof(*toks));
	if (!toks || engine_tokenize(tok, text, text_len, true, false, toks, cap, &n_tok, &err)) {
		fprintf(stderr, "%s: %s: %s\n", P, text_path, toks ? err.msg : "out of memory");
		rc = EXIT_INPUT;
		goto out;
	}
	int n_chunk = n_tok / n_ctx;
	if (max_chunks > 0 && max_chunks < n_chunk)
		n_chunk = max_chunks;
	if (n_chunk < 1) {
		fprintf(stderr, "%s: %s: %d tokens, fewer than one chunk of %d\n", P, text_path,
			n_tok, n_ctx);
		rc = EXIT_INPUT;
		goto out;
	}
	int nv = (int)info.n_vocab, first = n_ctx / 2;
	int32_t bos = engine_tokenizer_bos(tok);
	lp = malloc((size_t)nv * sizeof(*lp));
	struct logits_hdr hdr = {.n_vocab = (uint32_t)nv, .n_ctx = (uint32_t)n_ctx,
				 .n_chunk = (uint32_t)n_chunk};
	memcpy(hdr.magic, LOGITS_MAGIC, 8);
	if (save) {
		sf = fopen(save, "wb");
		if (!sf || fwrite(&hdr, sizeof(hdr), 1, sf) != 1 ||
		    fwrite(toks, sizeof(*toks), (size_t)n_chunk * n_ctx, sf) != (size_t)n_chunk * n_ctx) {
			fprintf(stderr, "%s: %s: cannot write\n", P, save);
			rc = EXIT_RUNTIME;
			goto out;
		}
	}
	if (base) {
		struct logits_hdr bh;
		bf = fopen(base, "rb");
		int32_t *bt = malloc((size_t)n_chunk * n_ctx * sizeof(*bt));
		bool ok = bf && bt && fread(&bh, sizeof(bh), 1, bf) == 1 &&
			  memcmp(bh.magic, LOGITS_MAGIC, 8) == 0 && bh.n_vocab == (uint32_t)nv &&
			  bh.n_ctx == (uint32_t)n_ctx && bh.n_chunk >= (uint32_t)n_chunk;
		/* the same tokens: a base of another text or tokenizer compares nothing */
		if (ok && (fread(bt, sizeof(*bt), (size_t)n_chunk * n_ctx, bf) !=
				   (size_t)n_chunk * n_ctx ||
			   memcmp(bt, toks, (size_t)n_chunk * n_ctx * sizeof(*bt)) != 0))
			ok = false;
		if (ok && bh.n_chunk > (uint32_t)n_chunk)
			ok = fseek(bf, sizeof(bh) + (long)bh.n_chunk * n_ctx * 4, SEEK_SET) == 0;
		free(bt);
		if (!ok) {
			fprintf(stderr,
				"%s: %s: not a --save-logits file of this text and vocabulary with "
				"--ctx %d and at least %d chunks\n",
				P, base, n_ctx, n_chunk);
			rc = EXIT_INPUT;
			goto out;
		}
		blp = malloc((size_t)nv * sizeof(*blp));
	}

	bool *want = malloc((size_t)n_ctx * sizeof(bool));
	int32_t *pos = malloc((size_t)n_ctx * sizeof(int32_t)), *seq = calloc((size_t)n_ctx, 4);
	int32_t *chunk = malloc((size_t)n_ctx * sizeof(int32_t));
	if (!want || !pos || !seq || !chunk || !lp || (base && !blp)) {
		rc = EXIT_RUNTIME;
		goto out2;
	}
	double nll = 0, nll2 = 0;
	long count = 0;
	struct kl_stats ks = {0};
	double t0 = cm_now();
	int step = n_batch ? n_batch : n_ctx;
	for (int ch = 0; ch < n_chunk; ch++) {
		memcpy(chunk, toks + (size_t)ch * n_ctx, (size_t)n_ctx * sizeof(*chunk));
		if (bos >= 0)
			chunk[0] = bos; /* as llama-perplexity: each chunk from BOS */
		engine_seq_truncate(cx, 0, 0);
		for (int s0 = 0; s0 < n_ctx; s0 += step) {
			int n = CM_MIN(step, n_ctx - s0);
			for (int i = 0; i < n; i++) {
				pos[i] = s0 + i;
				want[i] = s0 + i >= first && s0 + i < n_ctx - 1;
			}
			struct engine_batch b = {.n = n, .tokens = chunk + s0, .pos = pos, .seq = seq,
						 .want_logits = want};
			if (engine_decode(cx, &b, &err) != 0) {
				fprintf(stderr, "%s: %s\n", P, err.msg);
				rc = EXIT_RUNTIME;
				goto out2;
			}
			for (int i = 0; i < n; i++) {
				if (!want[i])
					continue;
				int p = s0 + i;
				int am = log_softmax(engine_get_logits(cx, i), nv, lp);
				int32_t next = chunk[p + 1];
				double v = -(double)lp[next];
				nll += v;
				nll2 += v * v;
				count++;
				if (sf && fwrite(lp, sizeof(*lp), (size_t)nv, sf) != (size_t)nv) {
					fprintf(stderr, "%s: %s: cannot write\n", P, save);
					rc = EXIT_RUNTIME;
					goto out2;
				}
				if (bf) {
					if (fread(blp, sizeof(*blp), (size_t)nv, bf) != (size_t)nv) {
						fprintf(stderr, "%s: %s: truncated\n", P, base);
						rc = EXIT_INPUT;
						goto out2;
					}
					int bam = 0;
					double kl = 0;
					for (int k = 0; k < nv; k++)
						if (blp[k] > blp[bam])
							bam = k;
					for (int k = 0; k < nv; k++) {
						double pb = exp((double)blp[k]);
						if (pb > 0)
							kl += pb * ((double)blp[k] - lp[k]);
					}
					double dp = exp((double)lp[next]) - exp((double)blp[next]);
					ks.kl += kl;
					ks.kl2 += kl * kl;
					ks.dp += dp;
					ks.dp2 += dp * dp;
					ks.same += am == bam;
					ks.n++;
				}
			}
		}
		if (!quiet)
			fprintf(stderr, "[%d]%.4f%s", ch + 1, exp(nll / (double)count),
				ch + 1 == n_chunk ? "\n" : ",");
	}
	double mean = nll / (double)count, var = nll2 / (double)count - mean * mean;
	double ppl = exp(mean);
	double se = var > 0 && count > 1 ? sqrt(var / (double)(count - 1)) : 0;
	printf("%d chunks of %d tokens, %ld scored, %.1f s\n", n_chunk, n_ctx, count,
	       cm_now() - t0);
	printf("Final estimate: PPL = %.4f +/- %.5f\n", ppl, se * ppl);
	if (bf && ks.n > 0) {
		double kmean = ks.kl / (double)ks.n;
		double kvar = ks.kl2 / (double)ks.n - kmean * kmean;
		double dmean = ks.dp / (double)ks.n;
		printf("Mean KLD: %.6f +/- %.6f\n", kmean,
		       kvar > 0 && ks.n > 1 ? sqrt(kvar / (double)(ks.n - 1)) : 0.0);
		printf("Same top p: %.3f %%\n", 100.0 * (double)ks.same / (double)ks.n);
		printf("Mean Δp: %.3f %%\n", 100.0 * dmean);
		printf("RMS Δp: %.3f %%\n", 100.0 * sqrt(ks.dp2 / (double)ks.n));
	}
out2:
	free(want);
	free(pos);
	free(seq);
	free(chunk);
out:
	if (sf && fclose(sf) != 0 && rc == 0) {
		fprintf(stderr, "%s: %s: cannot write\n", P, save);
		rc = EXIT_RUNTIME;
	}
	if (bf)
		fclose(bf);
	free(blp);
	free(lp);
	free(toks);
	free(text);
	engine_ctx_free(cx);
	engine_model_free(m);
	return rc;
}
