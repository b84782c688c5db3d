import math

import pytest
import torch
from torch import nn

from vit_flowers.models.seq2seq import (
    DecoderLayer,
    EncoderLayer,
    Seq2SeqTransformer,
    causal_mask,
    padding_mask,
    sinusoidal_positions,
    target_mask,
)

PAD, BOS, EOS = 0, 1, 2


def small_model(**kw):
    cfg = dict(src_vocab_size=13, tgt_vocab_size=11, d_model=32, n_heads=4, num_encoder_layers=2,
               num_decoder_layers=2, d_ff=64, dropout=0.0)
    return Seq2SeqTransformer(**{**cfg, **kw})


def test_mask_helpers_follow_true_means_attend():
    tokens = torch.tensor([[5, 6, PAD], [7, PAD, PAD]])
    assert padding_mask(tokens, PAD).shape == (2, 1, 1, 3)
    assert padding_mask(tokens, PAD)[1, 0, 0].tolist() == [True, False, False]
    assert causal_mask(3)[0, 0].tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    assert target_mask(tokens, PAD)[0, 0].tolist() == [[True, False, False], [True, True, False], [True, True, False]]


def test_sinusoidal_positions_match_the_paper_formula():
    pe = sinusoidal_positions(50, 16)
    for pos in (0, 7, 49):
        for i in range(8):
            angle = pos / 10000 ** (2 * i / 16)
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-5)
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-5)
    assert sinusoidal_positions(4, 7).shape == (4, 7)  # odd widths work too


def _copy_attention(ours, theirs):
    with torch.no_grad():
        ours.to_qkv.weight.copy_(theirs.in_proj_weight)
        ours.to_qkv.bias.copy_(theirs.in_proj_bias)
        ours.to_out.weight.copy_(theirs.out_proj.weight)
        ours.to_out.bias.copy_(theirs.out_proj.bias)


def _copy_common(ours, theirs, norms):
    with torch.no_grad():
        ours.ff.net[0].weight.copy_(theirs.linear1.weight)
        ours.ff.net[0].bias.copy_(theirs.linear1.bias)
        ours.ff.net[3].weight.copy_(theirs.linear2.weight)
        ours.ff.net[3].bias.copy_(theirs.linear2.bias)
        for name in norms:
            getattr(ours, name).load_state_dict(getattr(theirs, name).state_dict())


def _perturb(module):
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p) * 0.1)


@pytest.mark.parametrize("with_mask", [False, True])
def test_encoder_layer_equals_torch(with_mask):
    theirs = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True, norm_first=False,
                                        activation="relu").eval()
    _perturb(theirs)
    ours = EncoderLayer(32, 4, 64, dropout=0.0).eval()
    _copy_attention(ours.self_attn, theirs.self_attn)
    _copy_common(ours, theirs, ["norm1", "norm2"])
    x = torch.randn(3, 6, 32)
    tokens = torch.tensor([[4, 4, 4, 4, 4, 4], [4, 4, 4, PAD, PAD, PAD], [4, 4, 4, 4, 4, PAD]])
    if with_mask:
        ref = theirs(x, src_key_padding_mask=tokens == PAD)  # True = ignore in torch
        out = ours(x, padding_mask(tokens, PAD))
    else:
        ref, out = theirs(x), ours(x)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("with_mask", [False, True])
def test_decoder_layer_equals_torch(with_mask):
    theirs = nn.TransformerDecoderLayer(32, 4, 64, dropout=0.0, batch_first=True, norm_first=False,
                                        activation="relu").eval()
    _perturb(theirs)
    ours = DecoderLayer(32, 4, 64, dropout=0.0).eval()
    _copy_attention(ours.self_attn, theirs.self_attn)
    _copy_attention(ours.cross_attn, theirs.multihead_attn)
    _copy_common(ours, theirs, ["norm1", "norm2", "norm3"])
    tgt_x, memory = torch.randn(2, 5, 32), torch.randn(2, 7, 32)
    src = torch.tensor([[3] * 7, [3, 3, 3, 3, PAD, PAD, PAD]])
    tgt = torch.tensor([[BOS, 5, 6, 7, 8], [BOS, 5, 6, PAD, PAD]])
    if with_mask:
        ref = theirs(tgt_x, memory, tgt_mask=torch.ones(5, 5, dtype=torch.bool).triu(1),  # True = blocked
                     tgt_key_padding_mask=tgt == PAD, memory_key_padding_mask=src == PAD, tgt_is_causal=True)
        out = ours(tgt_x, memory, target_mask(tgt, PAD), padding_mask(src, PAD))
    else:
        ref, out = theirs(tgt_x, memory), ours(tgt_x, memory)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_forward_shape_gradients_and_no_nan():
    model = small_model(dropout=0.1).train()
    src = torch.randint(3, 13, (4, 9))
    src[1, 5:] = PAD
    tgt = torch.randint(3, 11, (4, 6))
    tgt[2, 4:] = PAD
    logits = model(src, tgt)
    assert logits.shape == (4, 6, 11)
    assert torch.isfinite(logits).all()
    logits.logsumexp(-1).mean().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        if "embed" not in name:  # embeddings only get gradients for the tokens used
            assert p.grad.abs().sum() > 0, name


def test_causality_future_targets_do_not_change_the_past():
    model = small_model().eval()
    src = torch.randint(3, 13, (2, 8))
    tgt = torch.randint(3, 11, (2, 7))
    t = 3
    changed = tgt.clone()
    changed[:, t + 1:] = torch.randint(3, 11, (2, 7 - t - 1))
    a, b = model(src, tgt), model(src, changed)
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(a[:, t + 1:], b[:, t + 1:])


def test_source_padding_does_not_change_logits():
    model = small_model().eval()
    src = torch.randint(3, 13, (2, 6))
    tgt = torch.randint(3, 11, (2, 5))
    padded = torch.cat([src, torch.full((2, 4), PAD)], dim=1)
    torch.testing.assert_close(model(src, tgt), model(padded, tgt), atol=1e-5, rtol=1e-5)


def test_greedy_decode_stops_and_pads_after_eos():
    model = small_model().eval()
    with torch.no_grad():  # force the generator to always say EOS
        model.generator.weight.zero_()
        model.generator.bias.fill_(-10.0)
        model.generator.bias[EOS] = 10.0
    out = model.greedy_decode(torch.randint(3, 13, (3, 5)), max_len=10, bos_idx=BOS, eos_idx=EOS)
    assert out.tolist() == [[BOS, EOS]] * 3


def test_bad_config():
    with pytest.raises(ValueError, match="divisible"):
        small_model(d_model=30, n_heads=4)


def _reverse_batch(n, generator, vocab=10, min_len=3, max_len=8):
    """Random sequences of tokens 3..vocab-1 with random lengths, padded; targets reversed."""
    lengths = torch.randint(min_len, max_len + 1, (n,), generator=generator)
    src = torch.full((n, max_len), PAD)
    tgt = torch.full((n, max_len + 2), PAD)
    for i, length in enumerate(lengths.tolist()):
        seq = torch.randint(3, vocab, (length,), generator=generator)
        src[i, :length] = seq
        tgt[i, : length + 2] = torch.cat([torch.tensor([BOS]), seq.flip(0), torch.tensor([EOS])])
    return src, tgt


def test_learns_to_reverse_sequences():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    model = Seq2SeqTransformer(src_vocab_size=10, tgt_vocab_size=10, d_model=64, n_heads=4, num_encoder_layers=2,
                               num_decoder_layers=2, d_ff=128, dropout=0.0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    steps = 600
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-3, total_steps=steps, pct_start=0.1)
    loss_fn = nn.CrossEntropyLoss(ignore_index=PAD)
    model.train()
    for _ in range(steps):
        src, tgt = _reverse_batch(64, g)
        logits = model(src, tgt[:, :-1])
        loss = loss_fn(logits.reshape(-1, 10), tgt[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    src, tgt = _reverse_batch(200, torch.Generator().manual_seed(12345))
    out = model.greedy_decode(src, max_len=tgt.shape[1], bos_idx=BOS, eos_idx=EOS)
    out = torch.nn.functional.pad(out, (0, tgt.shape[1] - out.shape[1]), value=PAD)
    exact = (out == tgt).all(dim=1).float().mean().item()
    print(f"reversal exact match {exact:.1%}")
    assert exact >= 0.95, f"only {exact:.1%} of held-out sequences reversed exactly"
