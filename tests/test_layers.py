import pytest
import torch

from vit_flowers.models.layers import Attention, Block, DropPath, FeedForward, Transformer


def _random_mask(b, nq, nk):
    mask = torch.rand(b, 1, nq, nk) > 0.4
    mask[..., 0] = True  # every row attends somewhere
    return mask


@pytest.mark.parametrize("use_mask", [False, True])
@pytest.mark.parametrize("cross", [False, True])
def test_fast_path_equals_explicit_softmax(use_mask, cross):
    attn = Attention(32, heads=4).eval()
    x = torch.randn(2, 7, 32)
    context = torch.randn(2, 5, 32) if cross else None
    mask = _random_mask(2, 7, 5 if cross else 7) if use_mask else None
    fast = attn(x, context=context, mask=mask)
    slow, weights = attn(x, context=context, mask=mask, return_attn=True)
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)
    assert weights.shape == (2, 4, 7, 5 if cross else 7)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 7))
    if use_mask:
        assert (weights.masked_select(~mask.expand_as(weights)) == 0).all()


def test_attention_matches_reference_formula():
    attn = Attention(16, heads=2).eval()
    x = torch.randn(1, 4, 16)
    q, k, v = attn.to_qkv(x).chunk(3, dim=-1)
    def split(t):
        return t.view(1, 4, 2, 8).transpose(1, 2)  # (B, H, N, D)
    q, k, v = map(split, (q, k, v))
    ref = torch.softmax(q @ k.transpose(-2, -1) / 8**0.5, dim=-1) @ v
    ref = attn.to_out(ref.transpose(1, 2).reshape(1, 4, 16))
    torch.testing.assert_close(attn(x), ref, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("cross", [False, True])
def test_fold_scale_moves_the_scale_into_the_queries_with_the_same_outputs(cross):
    attn = Attention(32, heads=4).eval()
    x, context = torch.randn(2, 7, 32), (torch.randn(2, 5, 32) if cross else None)
    before_fast = attn(x, context=context)
    before_slow, before_weights = attn(x, context=context, return_attn=True)
    key_rows = attn.to_qkv.weight[32:].clone()
    attn.fold_scale()
    assert attn.scale == 1.0
    torch.testing.assert_close(attn.to_qkv.weight[32:], key_rows)  # keys and values untouched
    torch.testing.assert_close(attn(x, context=context), before_fast, atol=1e-5, rtol=1e-5)
    after_slow, after_weights = attn(x, context=context, return_attn=True)
    torch.testing.assert_close(after_slow, before_slow, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(after_weights, before_weights, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("return_attn", [False, True])
def test_fully_masked_row_gives_zeros_not_nan(return_attn):
    attn = Attention(16, heads=2).eval()
    x = torch.randn(2, 3, 16)
    mask = torch.ones(2, 1, 3, 3, dtype=torch.bool)
    mask[0, :, 1] = False  # query 1 of sample 0 may attend nowhere
    out = attn(x, mask=mask, return_attn=return_attn)
    out = out[0] if return_attn else out
    assert torch.isfinite(out).all()
    # the empty row contributes nothing but the output bias
    torch.testing.assert_close(out[0, 1], attn.to_out.bias)
    out.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in attn.parameters())


def test_mask_must_be_bool():
    with pytest.raises(TypeError, match="bool"):
        Attention(8, heads=2)(torch.randn(1, 2, 8), mask=torch.ones(1, 1, 2, 2))


def test_dim_not_divisible_by_heads():
    with pytest.raises(ValueError, match="divisible"):
        Attention(10, heads=3)


def test_feedforward_activation_choice():
    ff = FeedForward(8, 16, activation="relu")
    assert isinstance(ff.net[1], torch.nn.ReLU)
    with pytest.raises(ValueError, match="activation"):
        FeedForward(8, 16, activation="tanh")


def test_drop_path_drops_whole_samples_and_keeps_expectation():
    dp = DropPath(0.5).train()
    x = torch.ones(4000, 3, 2)
    y = dp(x)
    per_sample = y.flatten(1)
    assert ((per_sample == 0).all(1) | (per_sample == 2).all(1)).all()
    assert abs(y.mean().item() - 1.0) < 0.1
    assert torch.equal(dp.eval()(x), x)


def test_pre_norm_block_formula():
    block = Block(16, heads=2, mlp_dim=32).eval()
    x = torch.randn(2, 5, 16)
    h = x + block.attn(block.norm1(x))
    ref = h + block.ff(block.norm2(h))
    torch.testing.assert_close(block(x), ref)


def test_transformer_returns_attention_per_layer_and_drop_path_schedule():
    enc = Transformer(16, depth=3, heads=2, mlp_dim=32, drop_path=0.2).eval()
    x = torch.randn(2, 5, 16)
    y, maps = enc(x, return_attn=True)
    torch.testing.assert_close(y, enc(x))
    assert len(maps) == 3 and maps[0].shape == (2, 2, 5, 5)
    assert [layer.drop_path.p for layer in enc.layers] == pytest.approx([0.0, 0.1, 0.2])


def test_drop_path_residual_equals_add_of_drop_path():
    dp = DropPath(0.5).train()
    x, branch = torch.randn(64, 3, 4), torch.randn(64, 3, 4)
    torch.manual_seed(1)
    fused = dp.residual(x, branch)
    torch.manual_seed(1)
    torch.testing.assert_close(fused, x + dp(branch))
    assert torch.equal(dp.eval().residual(x, branch), x + branch)


@pytest.mark.parametrize("activation", ["gelu", "relu"])
def test_inference_without_autograd_equals_with_it_and_leaves_the_input_alone(activation):
    enc = Transformer(16, depth=2, heads=2, mlp_dim=32, activation=activation, drop_path=0.1).eval()
    x = torch.randn(2, 5, 16)
    before = x.clone()
    ref = enc(x)
    for mode in (torch.no_grad, torch.inference_mode):
        with mode():
            fast = enc(x)
        assert torch.equal(fast, ref)
        assert torch.equal(x, before)


def test_residual_without_autograd_reuses_the_branch_only_when_dtype_and_shape_match():
    dp = DropPath(0.1).eval()
    x, branch = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    expected, x_before = x + branch, x.clone()
    with torch.inference_mode():
        out = dp.residual(x, branch)
        assert out.data_ptr() == branch.data_ptr() and torch.equal(out, expected) and torch.equal(x, x_before)
        bf16 = torch.randn(2, 3, 4, dtype=torch.bfloat16)  # autocast's branch on an fp32 stream
        out = dp.residual(x, bf16)
        assert out.dtype == torch.float32 and out.data_ptr() != bf16.data_ptr()
        narrow = torch.randn(2, 1, 4)  # broadcast: the sum is larger than the branch
        assert dp.residual(x, narrow).shape == (2, 3, 4)
    with torch.no_grad():
        torch.testing.assert_close(dp.residual(x, narrow), x + narrow)
