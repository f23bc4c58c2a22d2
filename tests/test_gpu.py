"""The CUDA paths, compared with the CPU: training, resume, generation (eager and compiled), DDP.

Marked ``gpu``; every test skips without CUDA (CI and most development machines). Run them with
``pytest -m gpu`` on a machine with one (two GPUs add the two-process NCCL run). Last run: all
passed on one NVIDIA H200 (PyTorch 2.11.0+cu130), 2026-11-26; see the README's "Tested versions".

Tolerances: CPU and CUDA sum in different orders (and cuBLAS picks its own kernels), so float32
results differ by a few ulps per operation; over a few steps of a tiny model that stays well
below 1e-3 relative, while a wrong device path (a mask, a dropout draw, a cache index) moves the
loss at 1e-2 or more from the first step. Within one device, resume is bit-identical (with
PyTorch's deterministic algorithms on, as a user wanting that guarantee on CUDA must set).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
import torch

from attnlab.config import ModelConfig
from attnlab.train import RunConfig, TrainConfig, train

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS (before init)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

TINY_LM = ModelConfig(kind="decoder_lm", d_model=32, n_heads=4, n_layers=2, d_ff=64, max_len=32)
TINY_S2S = ModelConfig(
    kind="encoder_decoder", d_model=32, n_heads=4, n_layers=1, d_ff=64, max_len=24
)


@pytest.fixture(scope="module")
def text(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("gpu") / "text.txt"
    path.write_text("the cat sat on a mat and the dog ran off to the park. " * 300)
    return str(path)


@pytest.fixture
def deterministic():
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(before)


def _lm(text: str, device: str, **kw) -> RunConfig:
    cfg = dict(task="lm", data=text, context_len=16, steps=6, batch_size=8, warmup_steps=2,
               eval_every=3, eval_batches=2, save_every=0, log_every=1, progress=False,
               device=device, threads=1, matmul_precision="highest")  # fmt: skip
    return RunConfig(TINY_LM, TrainConfig(**{**cfg, **kw}))


def _s2s(device: str, **kw) -> RunConfig:
    cfg = dict(task="seq2seq", data="reverse", n_train=200, n_val=16, steps=6, batch_size=8,
               grad_accum=2, warmup_steps=2, eval_every=0, save_every=0, log_every=1,
               progress=False, device=device, threads=1, matmul_precision="highest")  # fmt: skip
    return RunConfig(TINY_S2S, TrainConfig(**{**cfg, **kw}))


def test_lm_training_on_cuda_follows_the_cpu_curve(tmp_path, text):
    cpu = train(_lm(text, "cpu"), run_dir=tmp_path / "cpu")
    gpu = train(_lm(text, "cuda"), run_dir=tmp_path / "gpu")
    assert next(gpu.model.parameters()).is_cuda
    assert [s for s, _ in gpu.losses] == [s for s, _ in cpu.losses]
    assert [x for _, x in gpu.losses] == pytest.approx([x for _, x in cpu.losses], rel=1e-3)
    assert gpu.metrics["val_loss"] == pytest.approx(cpu.metrics["val_loss"], rel=1e-3)


def test_seq2seq_training_on_cuda_follows_the_cpu_curve(tmp_path):
    cpu = train(_s2s("cpu"), run_dir=tmp_path / "cpu")  # TINY_S2S: dropout 0
    gpu = train(_s2s("cuda"), run_dir=tmp_path / "gpu")
    assert [x for _, x in gpu.losses] == pytest.approx([x for _, x in cpu.losses], rel=1e-3)


def test_tf32_is_the_default_on_cuda_and_the_run_says_so(tmp_path, text):
    seen = []

    def on_event(name, data):
        if name == "record":
            seen.append(torch.get_float32_matmul_precision())
        if name == "runtime":
            seen.append(data["line"])

    before = torch.get_float32_matmul_precision()
    cpu = train(_lm(text, "cpu"), run_dir=tmp_path / "cpu")
    tf32 = train(_lm(text, "cuda", matmul_precision="high"), run_dir=tmp_path / "gpu",
                 on_event=on_event)  # fmt: skip
    assert "fp32 matmuls in TF32 (matmul_precision='high')" in seen[0]
    assert set(seen[1:]) == {"high"}  # in force while training
    assert torch.get_float32_matmul_precision() == before  # restored afterwards
    assert TrainConfig().matmul_precision == "high"
    # TF32 products (10-bit mantissa) move a tiny model's losses by far less than a wrong path
    assert [x for _, x in tf32.losses] == pytest.approx([x for _, x in cpu.losses], rel=2e-2)


def test_qk_norm_under_bf16_autocast_dispatches_without_a_dtype_mismatch():
    import warnings

    from attnlab.models import build_model

    model = build_model(TINY_LM.replace(qk_norm=True, positional="rotary")).cuda()
    ids = torch.randint(0, TINY_LM.vocab_size, (2, 16), device="cuda")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            model(ids).logits.float().sum().backward()
    assert not [w for w in caught if "Mismatch dtype" in str(w.message)]


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_bf16_autocast_on_cuda_trains(tmp_path, text):
    if not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bfloat16")
    result = train(_lm(text, "cuda", dtype="bf16"), run_dir=tmp_path)
    assert result.losses[-1][1] < result.losses[0][1]


def test_resume_on_cuda_is_bit_identical(tmp_path, deterministic):
    cfg = RunConfig(TINY_S2S.replace(dropout=0.1), _s2s("cuda", optimizer="muon").train)
    straight = train(cfg, run_dir=tmp_path / "a")
    train(cfg, run_dir=tmp_path / "b", stop_at=3)
    resumed = train(cfg, run_dir=tmp_path / "b", resume=True)
    assert resumed.start_step == 3
    assert resumed.losses == straight.losses[3:]  # exact float equality, dropout on
    for a, b in zip(straight.model.state_dict().values(), resumed.model.state_dict().values()):
        assert torch.equal(a, b)


def _peaked_lm(seed: int = 0):
    from attnlab.models import build_model

    torch.manual_seed(seed)
    model = build_model(TINY_LM.replace(vocab_size=40)).eval()
    with torch.no_grad():  # a peaked next-token distribution: no near-ties for greedy
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.3)
    return model


@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_lm_generation_on_cuda_matches_the_cpu(compile):
    from attnlab.generate import GenerationConfig, generate

    model = _peaked_lm()
    prompts = [[1, 5, 9, 3], [1, 7]]
    config = GenerationConfig(max_new_tokens=12, temperature=0.0)
    cpu = generate(model, prompts, config)
    gpu = generate(model.cuda(), prompts, config.replace(compile=compile))
    assert gpu.tokens == cpu.tokens
    sampled = config.replace(temperature=0.8, top_k=10, seed=3)
    once = generate(model, prompts, sampled.replace(compile=compile)).tokens
    assert generate(model, prompts, sampled.replace(compile=compile)).tokens == once  # seeded


@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_seq2seq_generation_on_cuda_matches_the_cpu(compile):
    from attnlab.generate import GenerationConfig, generate_seq2seq
    from attnlab.models import build_model

    torch.manual_seed(0)
    model = build_model(TINY_S2S.replace(vocab_size=40)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.3)
    sources = [[5, 9, 3, 4, 2], [7, 8, 2]]
    config = GenerationConfig(
        max_new_tokens=10, temperature=0.0, bos_token_id=1, stop_token_ids=(2,)
    )
    beams = config.replace(num_beams=3)
    cpu, cpu_beams = (generate_seq2seq(model, sources, c).tokens for c in (config, beams))
    model.cuda()
    assert generate_seq2seq(model, sources, config.replace(compile=compile)).tokens == cpu
    assert generate_seq2seq(model, sources, beams).tokens == cpu_beams


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ddp_init_on_cuda_wraps_and_averages_like_one_process():
    """NCCL process group on this GPU (world size 1): DDP's gradients equal the plain model's."""
    import torch.distributed as dist
    from torch import nn

    from attnlab.models import build_model
    from attnlab.train.distributed import resolve_device

    device = resolve_device("cuda")
    torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1
    )
    try:
        torch.manual_seed(0)
        plain = build_model(TINY_LM.replace(vocab_size=40)).to(device)
        copy = build_model(TINY_LM.replace(vocab_size=40)).to(device)
        copy.load_state_dict(plain.state_dict())
        ddp = nn.parallel.DistributedDataParallel(copy, device_ids=[device.index])
        ids = torch.randint(0, 40, (4, 16), device=device)
        for net in (plain, ddp):
            net(ids).logits.float().logsumexp(-1).mean().backward()
        for (name, a), b in zip(plain.named_parameters(), copy.parameters()):
            torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-6, msg=name)
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_two_gpu_ddp_matches_one_cpu_process(tmp_path, text):
    args = ["train", "--text", text, "--steps", "6", "--warmup-steps", "2", "--d-model", "16",
            "--n-heads", "2", "--n-layers", "1", "--d-ff", "32", "--context-len", "16",
            "--max-len", "16", "--eval-every", "3", "--eval-batches", "2", "--log-every", "1",
            "--no-progress", "--no-plots", "--threads", "1"]  # fmt: skip
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_port", str(_free_port()), "-m", "attnlab", *args, "--out",
           str(tmp_path / "ddp"), "--batch-size", "4", "--device", "cuda"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    from attnlab.cli import main
    from attnlab.train.report import read_metrics

    assert main([*args, "--out", str(tmp_path / "cpu"), "--batch-size", "8",
                 "--device", "cpu"]) == 0  # fmt: skip
    ddp = [r["train_loss"] for r in read_metrics(tmp_path / "ddp" / "metrics.jsonl")]
    cpu = [r["train_loss"] for r in read_metrics(tmp_path / "cpu" / "metrics.jsonl")]
    assert ddp == pytest.approx(cpu, rel=1e-3)


def test_a_model_too_big_for_the_gpu_stops_before_moving(tmp_path, text, monkeypatch):
    from attnlab import budget
    from attnlab.budget import MemoryBudgetError

    monkeypatch.setattr(budget, "gpu_available_bytes", lambda device: 1024)  # a 1 KiB GPU
    with pytest.raises(MemoryBudgetError, match="cuda:0 has 0.0 GiB available"):
        train(_lm(text, "cuda"), run_dir=tmp_path)
