"""``attnlab bench --suite modern`` at toy sizes: the harness runs, the KV cache shrinks with the
key/value heads exactly as 2 x layers x H_kv x d_head x 4 bytes, and attnlab decodes the same
tokens as transformers on the same weights (the timings of a tiny run mean nothing)."""

from __future__ import annotations

import json

import pytest

from attnlab.cli import main

pytest.importorskip("transformers")


def test_modern_suite_tiny(tmp_path):
    out = tmp_path / "r.json"
    assert main(["bench", "--tiny", "--threads", "1", "--quiet", "--suite", "modern",
                 "--json", str(out)]) == 0  # fmt: skip
    suite = json.loads(out.read_text())["suites"]["modern"]
    assert suite["status"] == "ok", suite
    rows = {r["attention"]: r for r in suite["kv_heads"]}
    assert list(rows) == ["MHA", "GQA-3", "GQA-2", "MQA"]
    for r in rows.values():  # tiny shape: 2 layers, d_head 8, fp32
        assert r["kv_bytes_per_token"] == 2 * 2 * r["n_kv_heads"] * 8 * 4
        assert r["tokens_per_s"] > 0
    assert rows["MHA"]["kv_bytes_per_token"] == 6 * rows["MQA"]["kv_bytes_per_token"]
    for r in suite["vs_transformers"]:
        assert r["tokens_agree"] == 1.0 and r["attnlab_vs_transformers"] > 0
