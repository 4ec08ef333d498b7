// Package enginesim is a simulated OpenAI-compatible LLM model server for demos and
// end-to-end tests of Narwhal. The tokens it emits are placeholder text; what it reproduces
// is the timing and the counts of a real engine, as described by a config.Profile.
//
// # Endpoints
//
// POST /v1/completions and POST /v1/chat/completions take OpenAI request bodies (any model
// name; unknown fields are ignored) and answer in OpenAI's shapes: one JSON object with usage,
// or with "stream": true server-sent events, one "data: {json}" frame per token (object
// text_completion with "text", or chat.completion.chunk with "delta"), each flushed, then a
// final frame carrying finish_reason and usage, then "data: [DONE]". GET /health answers
// {"status", "role", "model"}; GET /metrics serves Prometheus text with vLLM's metric names
// (vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc,
// vllm:prompt_tokens_total, vllm:generation_tokens_total, vllm:request_success_total), all
// labelled model_name, from a private registry. GET /v1/models lists the model (with
// max_model_len when Options.MaxModelLen is set). With Options.RoleSwitch, POST /pd_role_switch
// switches the reported role in place as SGLang does (switch.go). Bad bodies and wrong methods
// get OpenAI-style error JSON ({"error": {"message", "type", "code"}}) with a 4xx status.
//
// # Counting tokens
//
// A text is ceil(UTF-8 bytes / 4) tokens. A completions prompt that is a string is sized as a
// text; an array of token ids is its length; an array of strings (or of token-id arrays) is
// the sum of its elements. A chat prompt is, per message, its text content (a string, or the
// text parts of an array, concatenated) sized as a text, plus 4. The output length is
// max_completion_tokens, else max_tokens (finish_reason "length"); without either it is drawn
// from a seeded exponential distribution with mean Options.DefaultOutputTokens, rounded up and
// clamped to [1, 4×mean] (finish_reason "stop").
//
// # Timing
//
// One scheduler per engine models vLLM without chunked prefill. Requests wait in a FIFO
// queue until the batch can admit them (max_streams, and max_kv_tokens counting each admitted
// request's prompt plus output tokens, so nothing is ever preempted). Prompts are prefilled
// one at a time, each taking Prefill.Seconds(prompt tokens) times a seeded log-normal factor;
// the prefill produces the first token. The request then joins the decode batch: each decode
// step gives every resident one token and takes Decode.StepSeconds(streams, KV tokens). At
// every step boundary a prefill goes before a decode step, so decoding stalls while prompts
// are prefilled. Steps are chained on absolute deadlines, so timer lateness does not drift.
//
// # Disaggregated prefill
//
// A request with the header x-prefiller-host-port (llm-d's decode-sidecar convention) is first
// sent to that prefiller, same path and body but max_tokens 1, stream false and
// kv_transfer_params {"do_remote_decode": true}; after its 200 the engine waits
// Profile.KVTransferS, then the request joins the local batch without a local prefill (its
// first token comes from its first decode step). A failing or unreachable prefiller gives 502.
// Without the header the engine does both phases. Options.Role is only informational.
//
// A client that goes away is removed from the queue or batch at once, freeing its KV.
package enginesim
