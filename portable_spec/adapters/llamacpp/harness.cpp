// portable-spec's llama.cpp harness: llama.cpp's own `llama-speculative-simple` decode loop
// (examples/speculative-simple/speculative-simple.cpp at llama.cpp b11434, MIT), recording what a
// conformance check needs and printing it as one JSON line.
//
// Why not the example itself: it tokenizes a text prompt (a drafter's reference runs on token ids) and
// prints only totals; conformance compares per-round acceptance and first-round draft logits. Everything
// that decides the output is llama.cpp's: the target and draft graphs, common_speculative_* (the DFlash
// drafter runtime, ngram modes), common_sampler_sample_and_accept_n (verification). The harness decides
// nothing: it feeds ids, records, and times.
//
// Flags: llama.cpp's own (common_params_parse, the speculative example's set), except that -p holds the
// prompt as comma-separated token ids. Without a draft model and without --spec-type it decodes plainly,
// one token per llama_process call, as llama-completion does. Output: one line on stdout starting with
// "PORTABLE_SPEC_RESULT " followed by JSON.

#include "arg.h"
#include "common.h"
#include "llama.h"
#include "log.h"
#include "sampling.h"
#include "speculative.h"

#include <algorithm>
#include <clocale>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

static const int TOP_LOGITS = 8;  // first-round draft logits recorded per slot

static std::vector<llama_token> parse_ids(const std::string & text) {
    std::vector<llama_token> ids;
    size_t start = 0;
    while (start < text.size()) {
        size_t end = text.find(',', start);
        if (end == std::string::npos) {
            end = text.size();
        }
        ids.push_back((llama_token) std::stol(text.substr(start, end - start)));
        start = end + 1;
    }
    return ids;
}

static std::string ids_json(const std::vector<llama_token> & ids) {
    std::string out = "[";
    for (size_t i = 0; i < ids.size(); ++i) {
        out += (i ? "," : "") + std::to_string(ids[i]);
    }
    return out + "]";
}

// The (logit, id) entries of one draft row, best first, TOP_LOGITS of them. With draft sampling on the backend
// (llama.cpp's default, --spec-draft-backend-sampling) the row holds the top-k sampler's candidates and their
// logits; otherwise the full-vocabulary logits (-inf outside a draft vocabulary's d2t rows).
static std::vector<std::pair<float, int32_t>> top_entries(llama_context * ctx, int32_t row, int32_t n_vocab) {
    std::vector<std::pair<float, int32_t>> entries;
    const llama_token * candidates = llama_get_sampled_candidates_ith(ctx, row);
    const float * sampled = llama_get_sampled_logits_ith(ctx, row);
    if (candidates != nullptr && sampled != nullptr) {
        const uint32_t n = std::min(llama_get_sampled_candidates_count_ith(ctx, row),
                                    llama_get_sampled_logits_count_ith(ctx, row));
        for (uint32_t i = 0; i < n; ++i) {
            entries.emplace_back(sampled[i], candidates[i]);
        }
    } else {
        const float * logits = llama_get_logits_ith(ctx, row);
        for (int32_t i = 0; i < n_vocab; ++i) {
            if (std::isfinite(logits[i])) {
                entries.emplace_back(logits[i], i);
            }
        }
    }
    const size_t k = std::min((size_t) TOP_LOGITS, entries.size());
    std::partial_sort(entries.begin(), entries.begin() + k, entries.end(),
                      [](const auto & a, const auto & b) { return a.first > b.first; });
    entries.resize(k);
    return entries;
}

static std::string entries_json(const std::vector<std::pair<float, int32_t>> & entries) {
    std::string out = "[";
    char buf[64];
    for (size_t i = 0; i < entries.size(); ++i) {
        snprintf(buf, sizeof(buf), "%s[%d,%.9g]", i ? "," : "", entries[i].second, entries[i].first);
        out += buf;
    }
    return out + "]";
}

int main(int argc, char ** argv) {
    std::setlocale(LC_NUMERIC, "C");

    common_params params;
    common_init();
    if (!common_params_parse(argc, argv, params, LLAMA_EXAMPLE_SPECULATIVE)) {
        return 1;
    }
    const std::vector<llama_token> inp = parse_ids(params.prompt);
    if (inp.empty() || params.n_predict < 1) {
        LOG_ERR("%s: -p needs comma-separated token ids and -n >= 1\n", __func__);
        return 1;
    }

    const auto output_limits = common_speculative_get_output_limits(
            params.n_batch, params.n_parallel, common_speculative_n_max(&params.speculative));
    params.n_outputs_max = output_limits.total;
    params.n_outputs_max_per_seq = output_limits.per_seq;

    llama_backend_init();
    llama_numa_init(params.numa);

    auto init_tgt = common_init_from_params(params);
    llama_model * model_tgt = init_tgt->model();
    llama_context * ctx_tgt = init_tgt->context();
    const llama_vocab * vocab = llama_model_get_vocab(model_tgt);
    const int32_t n_vocab = llama_vocab_n_tokens(vocab);

    common_speculative_init_result_ptr spec_init;
    {
        common_params params_dft = common_base_params_to_speculative(params);
        spec_init = common_speculative_init_from_params(params_dft, model_tgt, ctx_tgt);
        params.speculative.draft.ctx_tgt = ctx_tgt;
        params.speculative.draft.ctx_dft = spec_init->context();
    }
    llama_context * ctx_dft = params.speculative.draft.ctx_dft;
    // Which noise-block rows hold the draft slots' logits: rows 1..n ([id_last, mask...]), rows 0..n-1 for a DSpark
    // drafting from the anchor's slot; none for DFlash2, whose selector reads a lattice instead of logits rows
    // (common/speculative.cpp common_speculative_impl_draft_dflash::draft).
    bool draft_logits = ctx_dft != nullptr;
    int32_t first_row = 1;
    if (ctx_dft != nullptr) {
        const llama_model * model_dft = llama_get_model(ctx_dft);
        char buf[16] = {};
        draft_logits = llama_model_meta_val_str(model_dft, "dflash.selector_top_k", buf, sizeof(buf)) < 0;
        if (llama_model_meta_val_str(model_dft, "dflash.sample_from_anchor", buf, sizeof(buf)) >= 0 &&
                std::string(buf) == "true") {
            first_row = 0;
        }
    }
    common_speculative * spec = common_speculative_init(params.speculative, 1);
    const bool speculative = spec != nullptr;
    if (speculative && common_context_can_seq_rm(ctx_tgt) == COMMON_CONTEXT_SEQ_RM_TYPE_FULL) {
        // speculative-simple restores checkpoints for such targets (recurrent, hybrid); this harness does not
        LOG_ERR("%s: the target cannot remove part of a sequence; not supported by this harness\n", __func__);
        return 1;
    }

    const llama_seq_id seq_id = 0;
    common_sampler_ptr smpl(common_sampler_init(model_tgt, params.sampling));

    std::vector<llama_token> out;
    std::string rounds = "[";
    std::string first_logits = "[]";
    int n_rounds = 0;

    // The prompt is prefilled whole and the target's greedy token after it comes first, as llama-server and vLLM
    // do (speculative-simple instead keeps the last prompt token for its first round); round 1 then drafts from
    // that token, as portable-spec's reference loop does, so rounds compare one for one.
    const int64_t t_prefill = ggml_time_us();
    common_batch batch_prompt(ctx_tgt);
    for (size_t i = 0; i < inp.size(); ++i) {
        batch_prompt.add(inp[i], i, seq_id, i + 1 == inp.size());
    }
    if (llama_process(ctx_tgt, LLAMA_PROCESS_TYPE_DECODE, batch_prompt.get()) != 0) {
        LOG_ERR("%s: the target failed to decode the prompt\n", __func__);
        return 1;
    }
    if (speculative && !common_speculative_process(spec, batch_prompt)) {
        LOG_ERR("%s: failed to process the prompt in the drafter\n", __func__);
        return 1;
    }
    llama_tokens prompt_tgt(inp.begin(), inp.end());
    llama_token id_last = common_sampler_sample(smpl.get(), ctx_tgt, -1);
    common_sampler_accept(smpl.get(), id_last, true);
    out.push_back(id_last);
    int n_past = (int) inp.size();
    bool has_eos = llama_vocab_is_eog(vocab, id_last);
    if (speculative) {
        common_speculative_begin(spec, seq_id, prompt_tgt);
    }
    const int64_t t_start = ggml_time_us();

    common_batch batch_tgt(ctx_tgt);
    llama_tokens draft;
    std::string margins;
    while ((int) out.size() < params.n_predict && !has_eos) {
        draft.clear();
        margins.clear();
        if (speculative) {
            common_speculative_get_draft_params(spec, seq_id) = {
                /* .drafting   = */ true,
                /* .n_max      = */ std::max(0, (int) llama_n_ctx(ctx_tgt) - n_past - 2),
                /* .pos0       = */ n_past,
                /* .id_last    = */ id_last,
                /* .prompt     = */ &prompt_tgt,
                /* .result     = */ &draft,
            };
            common_speculative_draft(spec);
            margins = "[";
            if (draft_logits && !draft.empty()) {
                // the draft slots' rows of the noise block (first_row on). Each slot's margin (best logit - second
                // best) says where another runtime's rounding could pick another draft
                if (n_rounds == 0) {
                    first_logits = "[";
                }
                char buf[32];
                for (size_t i = 1; i <= draft.size(); ++i) {
                    const auto entries = top_entries(ctx_dft, first_row + (int32_t) i - 1, n_vocab);
                    const float margin = entries.size() > 1 ? entries[0].first - entries[1].first : 1e30f;
                    snprintf(buf, sizeof(buf), "%s%.6g", i > 1 ? "," : "", margin);
                    margins += buf;
                    if (n_rounds == 0) {
                        first_logits += (i > 1 ? "," : "") + entries_json(entries);
                    }
                }
                if (n_rounds == 0) {
                    first_logits += "]";
                }
            }
            margins += "]";
            if (ctx_dft) {  // the noise block leaves the draft cache before the verified batch is injected
                llama_memory_seq_rm(llama_get_memory(ctx_dft), seq_id, n_past, -1);
            }
        }

        batch_tgt.clear();
        batch_tgt.add(id_last, n_past++, seq_id, true);
        for (size_t i = 0; i < draft.size(); ++i) {
            batch_tgt.add(draft[i], n_past + i, seq_id, true);
        }
        llama_process(ctx_tgt, LLAMA_PROCESS_TYPE_DECODE, batch_tgt.get());
        if (speculative && !common_speculative_process(spec, batch_tgt)) {
            LOG_ERR("%s: failed to process the verified batch in the drafter\n", __func__);
            return 1;
        }

        const auto ids = common_sampler_sample_and_accept_n(smpl.get(), ctx_tgt, draft);
        if (speculative) {
            common_speculative_accept(spec, seq_id, ids.size() - 1);
        }
        rounds += std::string(n_rounds ? "," : "") + "{\"draft\":" + ids_json(draft) +
                  ",\"accepted\":" + std::to_string(ids.size() - 1) +
                  ",\"margins\":" + (margins.empty() ? std::string("[]") : margins) + "}";
        ++n_rounds;
        n_past += ids.size() - 1;
        for (const llama_token id : ids) {
            prompt_tgt.push_back(id_last);
            id_last = id;
            out.push_back(id);
            if (llama_vocab_is_eog(vocab, id) || (int) out.size() >= params.n_predict) {
                has_eos = llama_vocab_is_eog(vocab, id);
                break;
            }
        }
        llama_memory_seq_rm(llama_get_memory(ctx_tgt), seq_id, n_past, -1);
        if (ctx_dft) {
            llama_memory_seq_rm(llama_get_memory(ctx_dft), seq_id, n_past, -1);
        }
    }
    const int64_t t_end = ggml_time_us();
    rounds += "]";

    printf("PORTABLE_SPEC_RESULT {\"prompt_tokens\":%zu,\"tokens\":%s,\"rounds\":%s,\"first_draft_logits\":%s,"
           "\"prefill_seconds\":%.6f,\"decode_seconds\":%.6f,\"speculative\":%s}\n",
           inp.size(), ids_json(out).c_str(), rounds.c_str(), first_logits.c_str(),
           (t_start - t_prefill) / 1e6, (t_end - t_start) / 1e6, speculative ? "true" : "false");
    fflush(stdout);

    if (spec) {
        common_speculative_free(spec);
    }
    llama_backend_free();
    return 0;
}
