"""The seq2seq demo (vit_flowers/seq2seq_demo.py) and its library parts: the model's cross-attention, the toy
reversal data, the fit and its scores, the heat map, and the command's files and errors."""

import json
import logging
import os
from pathlib import Path

import pytest
import torch

from vit_flowers import seq2seq_demo
from vit_flowers.data.toy_sequences import BOS, EOS, PAD, ToyBatch, reversal_batch, token_names, tokens_to_text
from vit_flowers.reporting.seq2seq_figure import cross_attention_figure
from vit_flowers.training.seq2seq_fit import attention_example, fit_reversal, greedy_score, small_seq2seq

os.environ.setdefault("OMP_NUM_THREADS", "1")


def test_reversal_batch_targets_are_the_sources_reversed_between_bos_and_eos():
    data = reversal_batch(50, 2, 6, torch.Generator().manual_seed(0))
    assert data.src.shape == (50, 6) and data.tgt.shape == (50, 8)
    for src, tgt in zip(data.src, data.tgt):
        digits = src[src != PAD].tolist()
        assert 2 <= len(digits) <= 6 and all(d >= 3 for d in digits)
        assert tgt[: len(digits) + 2].tolist() == [BOS, *digits[::-1], EOS]
        assert (tgt[len(digits) + 2:] == PAD).all()
        assert tokens_to_text(tgt) == " ".join(str(d - 3) for d in digits[::-1])
    with pytest.raises(ValueError, match="min_len"):
        reversal_batch(4, 5, 3, torch.Generator())


def test_cross_attention_has_one_map_per_layer_each_row_a_distribution_off_the_padding():
    torch.manual_seed(0)
    model = small_seq2seq(d_model=32, layers=3)
    src = torch.tensor([[5, 6, 7, 8, 9], [4, 5, 6, PAD, PAD]])
    tgt = torch.tensor([[BOS, 9, 8, 7], [BOS, 6, 5, PAD]])
    model.train()
    maps = model.cross_attention(src, tgt)
    assert model.training  # put back as it was
    assert len(maps) == 3
    for weights in maps:
        assert weights.shape == (2, 4, 4, 5)  # (B, heads, T, S)
        torch.testing.assert_close(weights.sum(dim=-1), torch.ones(2, 4, 4))
        assert (weights >= 0).all()
        assert (weights[1, :, :, 3:] == 0).all()  # the padded source positions get no attention
    assert not torch.allclose(maps[0][0, 0], maps[0][0, 1])  # the heads differ: not a constant


def test_greedy_score_counts_tokens_and_whole_sequences():
    tgt = torch.tensor([[BOS, 5, 4, 3, EOS], [BOS, 7, 6, EOS, PAD]])
    data = ToyBatch(torch.zeros(2, 3, dtype=torch.long), tgt)

    class Decodes:  # stands in for the model: greedy_score only asks it to decode
        def greedy_decode(self, src, max_len, bos_idx, eos_idx):
            return torch.tensor([[BOS, 5, 4, 3, EOS], [BOS, 7, 9, EOS, PAD]])  # the second one token wrong

    score = greedy_score(Decodes(), data)
    assert score.sequence_accuracy == pytest.approx(0.5)
    assert score.token_accuracy == pytest.approx(6 / 7)  # 4 + 3 target tokens after BOS, one wrong


@pytest.fixture(scope="module")
def fitted():
    """A short fit, small enough for a test (about 5 s of CPU time): sequences of 2-5 digits."""
    torch.set_num_threads(1)
    return fit_reversal(300, seed=0, min_len=2, max_len=5, held_out=100, progress=False)


def test_a_short_fit_learns_to_reverse_sequences_it_never_saw(fitted):
    score = greedy_score(fitted.model, fitted.held_out)
    # chance is 10^-n a sequence (0.1 a digit); a model that does not use the source, or copies it unreversed,
    # gets a few percent at most
    assert fitted.steps == 300
    assert score.sequence_accuracy >= 0.8, score
    assert score.token_accuracy >= 0.9, score


def test_attention_example_is_one_row_per_output_token_over_the_real_source(fitted):
    score = greedy_score(fitted.model, fitted.held_out)
    i = int((fitted.held_out.src != PAD).sum(dim=1).argmax())
    example = attention_example(fitted.model, fitted.held_out.src[i], score.decoded[i])
    source = fitted.held_out.src[i][fitted.held_out.src[i] != PAD]
    assert example.source == token_names(source)
    assert example.output[-1] == "EOS" and len(example.output) == len(source) + 1
    assert example.weights.shape == (len(example.output), len(example.source))
    torch.testing.assert_close(example.weights.sum(dim=-1), torch.ones(len(example.output)))


def test_the_figure_refuses_weights_that_do_not_match_the_tokens(tmp_path):
    with pytest.raises(ValueError, match="3 output tokens x 2 source tokens"):
        cross_attention_figure(torch.rand(2, 3), ["1", "2"], ["a", "b", "c"], tmp_path / "a.png")
    path = cross_attention_figure(torch.rand(3, 2), ["1", "2"], ["a", "b", "c"], tmp_path / "a.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_command_writes_its_files_and_refuses_to_overwrite_them(tmp_path, caplog):
    out = tmp_path / "demo"
    args = ["--steps", "3", "--max-len", "4", "--seed", "2", "--threads", "1", "--output", str(out)]
    assert seq2seq_demo.main(args) == 0
    metrics = json.loads((out / seq2seq_demo.METRICS).read_text())
    assert metrics["steps_trained"] == 3 and metrics["held_out"] == 200 and metrics["max_len"] == 4
    assert 0.0 <= metrics["sequence_accuracy"] <= metrics["token_accuracy"] <= 1.0
    assert len(metrics["examples"]) == 5 and set(metrics["examples"][0]) == {"source", "target", "decoded",
                                                                              "right"}
    png = (out / seq2seq_demo.FIGURE).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    caplog.clear()
    with caplog.at_level(logging.ERROR):
        assert seq2seq_demo.main(args) == 1
    assert f"--output {out} already exists: pass --overwrite" in caplog.text
    assert (out / seq2seq_demo.FIGURE).read_bytes() == png  # untouched
    assert seq2seq_demo.main([*args[:-2], "--steps", "2", "--output", str(out), "--overwrite"]) == 0
    assert json.loads((out / seq2seq_demo.METRICS).read_text())["steps_trained"] == 2


@pytest.mark.parametrize("argv, message", [
    (["--steps", "0"], "argument --steps: '0' must be above 0"),
    (["--steps", "ten"], "argument --steps: 'ten' is not an integer"),
    (["--time-budget", "-5"], "argument --time-budget: '-5' must be above 0"),
    (["--min-len", "6", "--max-len", "4"], "--min-len 6 is above --max-len 4"),
])
def test_bad_arguments_are_named(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as done:
        seq2seq_demo.main([*argv, "--output", str(tmp_path / "never")])
    assert done.value.code == 2
    assert message in capsys.readouterr().err
    assert not Path(tmp_path / "never").exists()
