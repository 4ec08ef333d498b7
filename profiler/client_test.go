package profiler

import (
	"strings"
	"testing"
)

// vLLM's /metrics, as its v1 engine writes them (trimmed): the scheduler gauges, the KV-cache
// usage and the cache config, whose blocks × block size is the KV capacity.
const vllmMetrics = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 12.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.25
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",num_gpu_blocks="59062",num_gpu_blocks_override="None"} 1.0
`

func TestParseMetrics(t *testing.T) {
	m, err := ParseMetrics(strings.NewReader(vllmMetrics))
	if err != nil {
		t.Fatal(err)
	}
	if m != (Metrics{Running: 12, Waiting: 3, KVUsage: 0.25, HasKVUsage: true, KVCapacity: 59062 * 16}) {
		t.Fatalf("%+v", m)
	}
	// The older name of the usage gauge; no cache config.
	old := strings.ReplaceAll(strings.Split(vllmMetrics, "# HELP vllm:cache_config_info")[0], "kv_cache_usage_perc", "gpu_cache_usage_perc")
	if m, err := ParseMetrics(strings.NewReader(old)); err != nil || m.KVUsage != 0.25 || m.KVCapacity != 0 {
		t.Fatalf("older names: %+v %v", m, err)
	}
	// An engine without vLLM's names has no metrics to use.
	if _, err := ParseMetrics(strings.NewReader("# TYPE up gauge\nup 1\n")); err == nil {
		t.Fatal("metrics without vLLM's names were taken")
	}
}
