"""What a vLLM server says about its load, parsed from bytes alone."""

from __future__ import annotations

import pytest

from llmbatch._servers.load import Load, parse_load_header, parse_metrics


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        # vLLM's ORCA report in its JSON form (what it sends with the format header).
        (
            'JSON {"named_metrics": {"num_requests_waiting": 3.0, "kv_cache_usage_perc": 0.42}}',
            Load(waiting=3, kv_cache_usage=0.42),
        ),
        ('{"num_requests_waiting": 0, "num_requests_running": 7}', Load(waiting=0, running=7)),
        ('json {"named_metrics": {"gpu_cache_usage_perc": 0.9}}', Load(kv_cache_usage=0.9)),
        (None, None),
        ("", None),
        ("TEXT named_metrics.kv_cache_usage_perc=0.5", None),  # the text form: not asked for
        ("JSON {not json", None),
        ('JSON ["a list"]', None),
        ('JSON {"named_metrics": {"num_requests_waiting": "many"}}', None),
        ('JSON {"named_metrics": {"kv_cache_usage_perc": NaN}}', None),
    ],
)
def test_load_header(value: str | None, expected: Load | None) -> None:
    assert parse_load_header(value) == expected


METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 12.0
vllm:num_requests_running{engine="1",model_name="m"} 4.0
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"} 12.5
vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} 250.0
vllm:time_per_output_token_seconds_sum{engine="0",model_name="m"} 12.5
vllm:time_per_output_token_seconds_count{engine="0",model_name="m"} 250.0
vllm:time_to_first_token_seconds_sum{model_name="m"} 3.0 1700000000000
vllm:time_to_first_token_seconds_count{model_name="m"} 30.0
vllm:e2e_request_latency_seconds_bucket{le="1.0",model_name="m"} 5.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 40.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 7.0
process_cpu_seconds_total 3.5
"""


def test_metrics_gauges_are_summed_over_engines_and_latency_totals_kept() -> None:
    sample = parse_metrics(METRICS)
    assert sample is not None
    assert sample.load == Load(waiting=2, running=16, kv_cache_usage=0.25)
    # Both names of the inter-token histogram are exported; one is read, not both.
    assert (sample.tpot_sum, sample.tpot_count) == (12.5, 250.0)
    assert (sample.ttft_sum, sample.ttft_count) == (3.0, 30.0)  # (a timestamp followed)
    assert sample.finished == 47.0  # every finish reason


def test_metrics_from_a_server_without_vllms_names_are_none() -> None:
    assert parse_metrics("process_cpu_seconds_total 3.5\n") is None
    assert parse_metrics("") is None
    assert parse_metrics('vllm:num_requests_running{model_name="m"} not-a-number\n') is None
