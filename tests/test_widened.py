"""The float64 truth without a float64 copy of the model: a copy that holds each module's
weights, widened, only while that module runs, and computes what a whole float64 copy computes
(to float64's last bits: a kernel may take another path for a tensor at another address)."""

from __future__ import annotations

import copy
import sys

import pytest
from conftest import ROOT

torch = pytest.importorskip("torch")
from layerdiff.torch._capture import _first_tensor, capture  # noqa: E402
from layerdiff.torch._widened import widened_copy  # noqa: E402
from torch import nn  # noqa: E402


class Tied(nn.Module):
    """An embedding tied to its head, an attention that reads its out_proj's weight itself, a
    batch norm's buffers, and a parent that reads its child's weight (dtype and values)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 16)
        self.attention = nn.MultiheadAttention(16, 2, batch_first=True)
        self.norm = nn.BatchNorm1d(16)
        self.scale = nn.Linear(16, 16)
        self.head = nn.Linear(16, 20, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        h = self.embed(ids)
        h = self.attention(h, h, h, need_weights=False)[0]
        h = self.norm(h.transpose(1, 2)).transpose(1, 2)
        h = h * self.scale.weight.diagonal()  # its child's weight, never calling it
        return self.head(h)


def _models():
    sys.path.insert(0, str(ROOT / "tests"))
    from builders import encoder

    torch.manual_seed(0)
    yield "tied", Tied().eval(), (torch.randint(0, 20, (2, 5)),)
    model, inputs = encoder.build()
    yield "encoder", model.eval(), inputs


@pytest.mark.parametrize("name", ["tied", "encoder"])
def test_the_copy_computes_what_a_whole_float64_copy_does_and_holds_nothing_after(name):
    model, inputs = dict((n, (m, i)) for n, m, i in _models())[name]
    listing = capture(model, inputs)
    assert listing.reads_outside, "the listing pass names the modules that read outside"
    wide = tuple(t.double() if t.is_floating_point() else t for t in inputs)
    whole = copy.deepcopy(model).double()
    held = widened_copy(model, lambda t: t.double(), reads_outside=listing.reads_outside)
    assert all(p.device.type == "meta" for p in held.parameters())
    with torch.no_grad():
        expected, got = _first_tensor(whole(*wide)), _first_tensor(held(*wide))
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, expected, rtol=1e-13, atol=1e-15)
    assert all(p.device.type == "meta" for p in held.parameters())
    assert all(b.device.type == "meta" for b in held.buffers())
    assert next(model.parameters()).dtype == torch.float32  # the model is untouched


def test_a_module_reading_a_weight_it_does_not_hold_fails_loudly():
    """Without the listing's names, the parent reading its child's weight meets a placeholder:
    an error, never a value computed from something else."""
    model, inputs = next((m, i) for n, m, i in _models() if n == "tied")
    held = widened_copy(model, lambda t: t.double(), reads_outside=["attention"])
    with pytest.raises((NotImplementedError, RuntimeError)), torch.no_grad():
        held(*inputs)


class Vocabulary(nn.Module):
    """A language model's widest modules: a token embedding and an untied output head."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(300, 16)
        self.mix = nn.Linear(16, 16)
        self.head = nn.Linear(16, 300)

    def forward(self, ids):
        return self.head(torch.tanh(self.mix(self.embed(ids))))


def test_the_widest_modules_hold_no_float64_weight_and_compute_the_same(monkeypatch):
    """An embedding gathers from the model's own table and widens the rows; a head past the
    banding size computes a band of rows at a time, never holding its float64 weight whole:
    the values of a whole float64 copy, and the placeholders back in float64 after."""
    from layerdiff.torch import _widened

    monkeypatch.setattr(_widened, "CHUNKED_ABOVE", 300 * 16 * 8 - 1)  # the head, not `mix`
    monkeypatch.setattr(_widened, "BAND", 7 * 16 * 8)  # bands of 7 rows: 300 is no multiple
    torch.manual_seed(0)
    model = Vocabulary().eval()
    ids = torch.randint(0, 300, (2, 9))
    held = widened_copy(model, lambda t: t.double())
    seen = {}
    held.embed.register_forward_pre_hook(
        lambda m, a: seen.update(table=(m.weight.dtype, m.weight.data_ptr()))
    )
    held.head.register_forward_pre_hook(lambda m, a: seen.update(head=m.weight.device.type))
    with torch.no_grad():
        got = held(ids)
        expected = copy.deepcopy(model).double()(ids)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, expected, rtol=1e-13, atol=1e-15)
    assert seen["table"] == (torch.float32, model.embed.weight.data_ptr()), "the model's table"
    assert seen["head"] == "meta", "the head's weight is never held whole"
    assert {p.dtype for p in held.parameters()} == {torch.float64}
    assert all(p.device.type == "meta" for p in held.parameters())
