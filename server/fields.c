/* fields.c - see fields.h. */
#include "fields.h"

#include <stdio.h>
#include <string.h>

static const char *const generate_fields[] = {
    "model", "prompt", "tokens", "add_bos", "max_tokens", "temperature", "top_p", "top_k", "min_p",
    "repetition_penalty", "presence_penalty", "frequency_penalty", "seed", "stop", "ignore_eos", "logprobs",
    "stream", "logit_bias", "min_tokens", "cache_prompt", NULL};
static const char *const score_fields[] = {"model", "text", "tokens", "texts", "add_bos", "cache_prompt", NULL};
static const char *const completions_fields[] = {
    "model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
    "presence_penalty", "frequency_penalty", "seed", "stop", "ignore_eos", "logprobs", "echo", "n", "best_of",
    "suffix", "stream", "stream_options", "logit_bias", "min_tokens", "user", "cache_prompt", NULL};
static const char *const chat_fields[] = {
    "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p",
    "repetition_penalty", "presence_penalty", "frequency_penalty", "seed", "stop", "ignore_eos", "logprobs",
    "top_logprobs", "n", "stream", "stream_options", "logit_bias", "min_tokens", "user", "add_generation_prompt",
    "continue_final_message", "chat_template_kwargs", "add_special_tokens", "response_format", "tools",
    "tool_choice", "parallel_tool_calls", "echo", "cache_prompt", NULL};

const char *const *api_fields(int kind)
{
    switch (kind) {
    case API_GENERATE: return generate_fields;
    case API_SCORE: return score_fields;
    case API_COMPLETIONS: return completions_fields;
    default: return chat_fields;
    }
}

/* Sampling controls of other servers that would change the output here if
 * they were honoured; each is refused by name rather than ignored. */
static const char *const unsupported[] = {
    "use_beam_search", "num_beams", "length_penalty", "early_stopping", "do_sample", "typical_p", "tfs_z",
    "top_a", "top_n_sigma", "mirostat", "mirostat_mode", "mirostat_tau", "mirostat_eta", "dynatemp_range",
    "dynatemp_exponent", "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n",
    "dry_sequence_breakers", "xtc_probability", "xtc_threshold", "penalty_last_n", "repeat_penalty",
    "repeat_last_n", "penalize_nl", "n_probs", "n_predict", "max_new_tokens", "bad_words", "allowed_token_ids",
    "stop_token_ids", "include_stop_str_in_output", "skip_special_tokens", "spaces_between_special_tokens",
    "truncate_prompt_tokens", "prompt_logprobs", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
    "guided_decoding_backend", "guided_whitespace_pattern", "structured_outputs", "grammar", "json_schema",
    "logits_processors", "smoothing_factor", "smoothing_curve", "epsilon_cutoff", "eta_cutoff", "watermark",
    "samplers", "sampler_order", "temperature_last", "return_tokens_as_token_ids", "functions", "function_call",
    "logprob", NULL};

static int in_list(const char *const *l, const char *s)
{
    for (; *l; l++)
        if (!strcmp(*l, s)) return 1;
    return 0;
}

/* A name no table knows that still reads like a sampling control. */
static int looks_like_sampling(const char *s)
{
    static const char *const parts[] = {"penalty", "top_", "temperature", "sampl", "logit", "stop", "beam",
                                        "guided", "grammar", "seed", "bias", "token", "min_", "max_", NULL};
    for (int i = 0; parts[i]; i++)
        if (strstr(s, parts[i])) return 1;
    size_t n = strlen(s);
    return n > 2 && !strcmp(s + n - 2, "_p");
}

int api_check_fields(int kind, const cJSON *o, api_error *e)
{
    const char *const *known = api_fields(kind);
    const cJSON *it;
    cJSON_ArrayForEach(it, o) {
        const char *k = it->string;
        if (in_list(known, k) || cJSON_IsNull(it)) continue;
        if (in_list(unsupported, k) || looks_like_sampling(k)) {
            const char *where = kind == API_GENERATE ? "/generate" : kind == API_SCORE ? "/score"
                              : kind == API_COMPLETIONS ? "/v1/completions" : "/v1/chat/completions";
            snprintf(e->message, sizeof e->message, "\"%s\" is not a field %s supports (unknown sampling parameter)",
                     k, where);
            snprintf(e->param, sizeof e->param, "%s", k);
            e->status = 400;
            return -1;
        }
    }
    return 0;
}
