"""Plots: every figure renders to a non-empty image with the right axes; attention collection
returns the model's real weights; the `attnlab plot` commands write files or explain why not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from attnlab.cli import main
from attnlab.config import ModelConfig
from attnlab.data import CharTokenizer
from attnlab.errors import DataError
from attnlab.models import LanguageModel, ModelOutput, build_model
from attnlab.nn import sinusoidal_table
from attnlab.viz import (
    attention_maps,
    find_metrics_file,
    model_attention_figures,
    plot_alignment,
    plot_attention,
    plot_loss_curves,
    plot_position_encoding,
    read_metrics,
    save_figure,
)
from attnlab.viz.attention import MAX_ROW_INCHES

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TOK = CharTokenizer("abcdefghijklmnopqrstuvwxyz $")


def tiny(kind: str = "decoder_lm", **kw):
    kw = {"max_len": 32, **kw}
    cfg = ModelConfig(kind=kind, vocab_size=TOK.vocab_size, d_model=16, n_heads=2, n_layers=2, **kw)
    return build_model(cfg).eval()


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 2000, path


def heatmaps(fig) -> list:
    return [ax for ax in fig.axes if ax.images and ax.get_label() != "<colorbar>"]


def test_attention_grid_has_a_panel_per_layer_and_head(tmp_path):
    w = torch.softmax(torch.randn(3, 2, 5, 7), dim=-1)  # (L, H, T, S)
    queries, keys = list("abcde"), ["k$1", "k2", " ", "k4", "k5", "k6", "a-long-token-name"]
    fig = plot_attention(w, queries, keys, "cross")
    assert len(heatmaps(fig)) == 6 and len(fig.axes) == 7  # 6 panels + colorbar
    bottom_left = fig.axes[4]
    assert [t.get_text() for t in bottom_left.get_yticklabels()] == queries
    shown = [t.get_text() for t in bottom_left.get_xticklabels()]
    assert shown[0] == r"k\$1" and shown[2] == "\u2423" and shown[6].endswith("\u2026")
    assert bottom_left.images[0].get_array().shape == (5, 7)
    assert_png(save_figure(fig, tmp_path / "sub" / "attn.png"))
    assert len(heatmaps(plot_attention(w[0]))) == 2  # (H, T, S)
    assert len(heatmaps(plot_attention(w[0, 0].numpy()))) == 1  # (T, S) array


def test_attention_panels_name_their_layer_and_head():
    w = torch.softmax(torch.randn(2, 2, 3, 3), dim=-1)  # (L, H, T, S)
    titles = [ax.get_title() for ax in heatmaps(plot_attention(w))]
    assert titles == ["layer 1, head 1", "layer 1, head 2", "layer 2, head 1", "layer 2, head 2"]
    last = [ax.get_title() for ax in heatmaps(plot_attention(w[-1], first_layer=3))]  # a slice
    assert last == ["layer 3, head 1", "layer 3, head 2"]


def test_long_sequences_cap_figure_size_and_thin_labels():
    w = torch.softmax(torch.randn(1, 1, 300, 300), dim=-1)
    tokens = [f"t{i}" for i in range(300)]
    fig = plot_attention(w, tokens, tokens)
    assert max(fig.get_size_inches()) <= 22.0
    assert len(fig.axes[0].get_xticklabels()) < 60


def test_a_wide_grid_shrinks_its_labels_before_leaving_any_out():
    """Eight heads of a 15 x 15 map: the figure is capped at 22 in, so the panels are small, and
    every query and key still gets its label (a smaller font), none every other one."""
    w = torch.softmax(torch.randn(1, 8, 15, 15), dim=-1)
    tokens = [f"tok{i}" for i in range(15)]
    fig = plot_attention(w, tokens, tokens)
    panels = heatmaps(fig)
    assert max(fig.get_size_inches()) <= 22.0
    assert [t.get_text() for t in panels[0].get_yticklabels()] == tokens
    assert [t.get_text() for t in panels[-1].get_xticklabels()] == tokens
    assert all(t.get_fontsize() >= 5 for t in panels[0].get_yticklabels())


def test_many_heads_wrap_onto_rows_and_every_column_is_labelled():
    """Eight heads of a 14 x 20 cross-attention map would make one row ~40 in wide (shrunk to
    22 in): they wrap onto rows of at most MAX_ROW_INCHES, with no empty panel, each row's first
    panel labelled with the queries and each column's lowest panel with every key."""
    w = torch.softmax(torch.randn(8, 14, 20), dim=-1)  # (H, T, S)
    queries, keys = [f"q{i}" for i in range(14)], [f"word{i}" for i in range(20)]
    fig = plot_attention(w, queries, keys)
    panels = heatmaps(fig)
    assert len(panels) == 8 and len(fig.axes) == 9  # the unused grid cell is removed
    assert fig.get_size_inches()[0] <= MAX_ROW_INCHES + 2
    rows = sorted({round(ax.get_position().y0, 3) for ax in panels}, reverse=True)
    assert len(rows) == 3  # 3 + 3 + 2 panels
    for ax in panels:
        first_in_row = ax.get_position().x0 == min(a.get_position().x0 for a in panels)
        if first_in_row:
            assert [t.get_text() for t in ax.get_yticklabels()] == queries
    for x0 in {ax.get_position().x0 for ax in panels}:
        column = [ax for ax in panels if ax.get_position().x0 == x0]
        lowest = min(column, key=lambda ax: ax.get_position().y0)
        assert [t.get_text() for t in lowest.get_xticklabels() if t.get_visible()] == keys
        assert lowest.xaxis.get_tick_params()["labelbottom"]


def test_plot_errors_name_the_problem(tmp_path):
    w = torch.softmax(torch.randn(2, 4, 4), dim=-1)
    with pytest.raises(ValueError, match="query_tokens has 3 labels but the weights have 4"):
        plot_attention(w, list("abc"), list("abcd"))
    with pytest.raises(ValueError, match=r"\(L, H, T, S\)"):
        plot_attention(torch.zeros(1, 1, 1, 2, 2))
    with pytest.raises(ValueError, match="NaN"):
        plot_attention(torch.full((2, 2), float("nan")))
    with pytest.raises(ValueError, match="one head"):
        plot_alignment(w)
    with pytest.raises(ValueError, match="ending in .png"):
        save_figure(plot_attention(w), tmp_path / "x.jpg")


def test_alignment_is_one_grayscale_panel_with_source_on_top(tmp_path):
    w = torch.softmax(torch.randn(1, 1, 4, 6), dim=-1)  # as an attention LSTM returns it
    fig = plot_alignment(w, list("source"), ["le", "chat", "noir", "<eos>"])
    assert len(fig.axes) == 2
    ax = fig.axes[0]
    assert ax.xaxis.get_ticks_position() == "top"
    assert ax.images[0].get_cmap().name == "gray"
    assert [t.get_text() for t in ax.get_yticklabels()] == ["le", "chat", "noir", "<eos>"]
    assert_png(save_figure(fig, tmp_path / "align.png"))


def test_position_encoding_shows_the_table_and_some_columns(tmp_path):
    table = sinusoidal_table(torch.arange(50), 32)
    fig = plot_position_encoding(table)
    heat, curves, _colorbar = fig.axes
    torch.testing.assert_close(torch.as_tensor(heat.images[0].get_array()), table.double())
    assert len(curves.lines) == 4
    torch.testing.assert_close(torch.as_tensor(curves.lines[0].get_ydata()), table[:, 0].double())
    assert_png(save_figure(fig, tmp_path / "pe.png"))


def test_position_plot_draws_a_schemes_own_description():
    scheme = tiny(positional="rotary", rope_scaling="linear", rope_factor=4.0).embed.pos_enc
    described = scheme.describe(torch.arange(12))
    fig = plot_position_encoding(described)
    heat = fig.axes[0]
    torch.testing.assert_close(torch.as_tensor(heat.images[0].get_array()), described.values)
    assert "rotary" in fig._suptitle.get_text()
    with pytest.raises(ValueError, match="'none' position scheme has no table"):
        plot_position_encoding(tiny(positional="none").embed.pos_enc.describe(torch.arange(3)))


def write_metrics(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def test_loss_curves_from_jsonl_with_resume_and_partial_last_line(tmp_path):
    records = [{"step": s, "train_loss": 5.0 - s / 100, "lr": 1e-3} for s in range(0, 200, 10)]
    records += [{"step": 100, "val_loss": 4.2}, {"step": 50, "train_loss": 9.9}]  # resumed
    lines = [json.dumps(r) for r in records] + ['{"step": 210, "train_lo']  # being written
    path = write_metrics(tmp_path / "metrics.jsonl", lines)
    assert len(read_metrics(tmp_path)) == len(records)
    fig = plot_loss_curves(path, tmp_path / "loss.png")
    ax, lr_ax = fig.axes
    train, val = ax.lines
    assert list(train.get_xdata()) == list(range(0, 200, 10))
    assert train.get_ydata()[5] == 9.9  # the later record of step 50 wins
    assert list(val.get_ydata()) == [4.2]
    assert len(lr_ax.lines) == 1
    assert_png(tmp_path / "loss.png")
    no_lr = plot_loss_curves([{"step": 1, "train_loss": 2.0}, {"step": 2, "train_loss": 1.5}])
    assert len(no_lr.axes) == 1


def test_metrics_errors(tmp_path):
    bad = write_metrics(tmp_path / "bad.jsonl", ['{"step": 1, "train_loss": 2}', "{oops", "{}"])
    with pytest.raises(DataError, match="line 2 is not valid JSON"):
        read_metrics(bad)
    binary = tmp_path / "binary" / "metrics.jsonl"
    binary.parent.mkdir()
    binary.write_bytes(b'{"step": 1, "train_loss": 2}\n\xff\xfe\n{"step": 2}\n')
    with pytest.raises(DataError, match="line 2 is not valid JSON"):  # not a UnicodeDecodeError
        read_metrics(binary.parent)
    array = write_metrics(tmp_path / "array.jsonl", ['{"step": 1, "train_loss": 2}', "[1]", "{}"])
    with pytest.raises(DataError, match="line 2 is not a JSON object"):
        read_metrics(array)
    with pytest.raises(DataError, match="no loss values.*'acc'"):
        plot_loss_curves([{"step": 1, "acc": 0.5}])
    with pytest.raises(DataError, match="no run directory"):
        find_metrics_file(tmp_path / "missing")
    write_metrics(tmp_path / "other.jsonl", ["{}"])
    with pytest.raises(DataError, match="several candidates"):
        find_metrics_file(tmp_path)


def test_attention_maps_of_a_decoder_lm_are_its_causal_weights():
    model = tiny().train()
    ids = torch.tensor(TOK.encode("the cat"))
    maps = attention_maps(model, ids)
    assert model.training  # the flag is restored
    assert maps.self_attn.shape == (2, 2, 7, 7) and maps.cross_attn is None
    torch.testing.assert_close(maps.self_attn.sum(-1), torch.ones(2, 2, 7))
    assert maps.self_attn.triu(diagonal=1).abs().max() == 0  # no query sees the future
    with torch.no_grad():
        ref = model.eval()(ids[None], need_weights=True).attentions[1].self_attn[0]
    torch.testing.assert_close(maps.self_attn[1], ref)


def test_attention_maps_of_seq2seq_and_classifier():
    model = tiny("encoder_decoder")
    src, tgt_in = TOK.encode("abc de"), [TOK.bos_id, *TOK.encode("xy")]
    maps = attention_maps(model, src, target=tgt_in)
    assert maps.cross_attn.shape == (2, 2, 3, 6)
    assert maps.self_attn.shape == (2, 2, 3, 3) and maps.encoder_attn.shape == (2, 2, 6, 6)
    with pytest.raises(ValueError, match="needs target ids"):
        attention_maps(model, src)
    clf = tiny("classifier", n_classes=3)
    assert attention_maps(clf, [src, src], row=1).self_attn.shape == (2, 2, 6, 6)
    with pytest.raises(ValueError, match="seq2seq models, not EncoderClassifier"):
        attention_maps(clf, src, target=tgt_in)


def test_attention_maps_refuse_models_without_attention():
    class NoAttention(LanguageModel):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(1, 1)

        def forward(self, ids, **kw):
            return ModelOutput(torch.zeros(*ids.shape, 3), None)

    with pytest.raises(ValueError, match="NoAttention computes no attention weights"):
        attention_maps(NoAttention(), [1, 2])
    with pytest.raises(TypeError, match="cannot collect attention from a Linear"):
        attention_maps(torch.nn.Linear(2, 2), [1, 2])


def test_model_figures_for_an_lm_and_a_greedy_seq2seq(tmp_path):
    figs = model_attention_figures(tiny(), TOK, "a cat")
    assert list(figs) == ["self_attention.png"] and len(heatmaps(figs["self_attention.png"])) == 4
    from attnlab.generate.config import GenerationConfig
    from attnlab.generate.seq2seq import generate_seq2seq

    model = tiny("encoder_decoder", max_len=10)
    figs = model_attention_figures(model, TOK, "abc")  # no target: decode greedily
    assert set(figs) == {
        "cross_attention.png",
        "decoder_self_attention.png",
        "encoder_self_attention.png",
    }
    greedy = generate_seq2seq(
        model, ["abc"], GenerationConfig(max_new_tokens=9, temperature=0), tokenizer=TOK
    ).tokens[0]
    assert figs["cross_attention.png"].axes[0].images[0].get_array().shape == (len(greedy) + 1, 3)
    with pytest.raises(ValueError, match="max_len=32; shorten"):
        model_attention_figures(tiny(), TOK, "a" * 40)
    with pytest.raises(ValueError, match="no tokens"):
        model_attention_figures(tiny(), TOK, "")


def test_bahdanau_model_gets_an_alignment_plot():
    model = tiny("lstm_seq2seq", rnn_attention="additive")
    figs = model_attention_figures(model, TOK, "abc", target="cba")
    assert "alignment.png" in figs and "cross_attention.png" in figs
    assert len(figs["alignment.png"].axes) == 2


def test_plot_cli_positions_loss_and_attention(tmp_path, capsys):
    from attnlab.checkpoint import save_checkpoint

    out = tmp_path / "pe.png"
    assert main(["plot", "positions", "--d-model", "16", "--max-len", "20", "--out", str(out)]) == 0
    assert_png(out)
    run = tmp_path / "run"
    run.mkdir()
    write_metrics(
        run / "metrics.jsonl",
        [json.dumps({"step": s, "train_loss": 3.0 - s / 10}) for s in range(5)],
    )
    assert main(["plot", "loss", "--run", str(run), "--out", str(tmp_path / "loss.png")]) == 0
    assert_png(tmp_path / "loss.png")
    model = tiny()
    save_checkpoint(run, model=model, config=model.cfg, tokenizer=TOK, step=1)
    args = ["plot", "attention", "--checkpoint", str(run), "--input", "hi", "--out"]
    assert main([*args, str(tmp_path / "maps")]) == 0
    assert_png(tmp_path / "maps" / "self_attention.png")
    assert "self_attention.png" in capsys.readouterr().out
    assert main(["plot", "positions", "--d-model", "0", "--out", str(out)]) == 2
    assert main(["plot", "loss", "--run", str(tmp_path / "nope"), "--out", str(out)]) == 2
    assert main([*args[:-1], "--target", "x", "--out", str(tmp_path / "m2")]) == 2
    err = " ".join(capsys.readouterr().err.split())  # the CLI wraps messages at 100 columns
    assert "--d-model must be a positive integer" in err and "no run directory" in err
    assert "seq2seq models, not DecoderLM" in err
