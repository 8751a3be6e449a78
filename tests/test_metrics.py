"""The disk tier's series: read from each model's tier when the page is made."""

from __future__ import annotations

from mlxcel.metrics import Metrics, PromptDiskStats


def test_the_disk_tiers_counters_are_read_at_each_scrape() -> None:
    metrics = Metrics()
    assert b"prompt_cache_disk" not in metrics.exposition()  # no tier, no series
    readings = [PromptDiskStats(hits=1, spills=2, stored_bytes=300, files=1)]
    metrics.watch_prompt_disk("a", lambda: readings[-1])
    text = metrics.exposition().decode()
    assert 'mlxcel_prompt_cache_disk_hits_total{model="a"} 1.0' in text
    assert 'mlxcel_prompt_cache_disk_spills_total{model="a"} 2.0' in text
    assert 'mlxcel_prompt_cache_disk_stored_bytes{model="a"} 300.0' in text
    assert "# TYPE mlxcel_prompt_cache_disk_files gauge" in text
    readings.append(PromptDiskStats(hits=5, rejected=1))
    metrics.watch_prompt_disk("b", lambda: PromptDiskStats(misses=3))
    text = metrics.exposition().decode()
    assert 'mlxcel_prompt_cache_disk_hits_total{model="a"} 5.0' in text
    assert 'mlxcel_prompt_cache_disk_rejected_total{model="a"} 1.0' in text
    assert 'mlxcel_prompt_cache_disk_misses_total{model="b"} 3.0' in text
