"""The LSTMs of an SHA-RNN block and the one way they run (docs/model.md, "LSTM").

``nn.LSTM`` (the paper's cell) runs on one of three paths, chosen by :func:`run_lstm`: under
autocast in the autocast dtype, a window of one position through the cell, otherwise the
sequence kernel (cuDNN's on CUDA). :class:`LayerNormLSTM` (``model.cell = "ln_lstm"``) runs
its own loop. Shapes are time-major: ``x [T, B, d]``, ``(h, c)`` each ``[1, B, d]``.
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor


def run_lstm(
    lstm: nn.LSTM | LayerNormLSTM, x: Tensor, lstm_state: tuple[Tensor, Tensor] | None
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """``u, (h, c) = lstm(x, (h, c))``: the one way the model's LSTMs run (cuDNN's on CUDA),
    whatever runs the model (training, evaluation, generation, compression, the benchmarks).

    Args:
        lstm: a one-layer ``nn.LSTM(d, d)``, or a :class:`LayerNormLSTM`, which runs its
            own loop on every path (under autocast too).
        x: ``[T, B, d]``.
        lstm_state: ``(h, c)``, each ``[1, B, d]`` in the parameters' dtype, or None for zeros.

    Returns:
        ``(u [T, B, d], (h, c))``; ``(h, c)`` in the parameters' dtype on every path.

    Under autocast the LSTM runs in the autocast dtype (:func:`_lstm_under_autocast` says
    why); without it, a window of one position runs through the cell (:func:`_lstm_step`).
    """
    if isinstance(lstm, LayerNormLSTM):
        return lstm(x, lstm_state)
    if torch.is_autocast_enabled(x.device.type):
        return _lstm_under_autocast(lstm, x, lstm_state)
    if x.shape[0] == 1:
        return _lstm_step(lstm, x, lstm_state)
    return lstm(x, lstm_state)


def _lstm_under_autocast(
    lstm: nn.LSTM, x: Tensor, lstm_state: tuple[Tensor, Tensor] | None
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """The LSTM in the autocast dtype: its weights, input and state cast to that dtype, run
    with autocast switched off; ``(h, c)`` cast back to the parameters' dtype.

    Why: PyTorch's CUDA autocast runs cuDNN's LSTM in fp16 whatever the autocast dtype,
    and fp16 gradients underflow without loss scaling (bf16 has fp32's range; CPU's
    autocast would return a bf16 state). Cast explicitly, the LSTM runs in bf16 under bf16
    autocast, gradients reach the fp32 weights through the casts, and a state reads the
    same on every path (fp32, the eager and the fast path, a saved checkpoint).
    """
    device = x.device.type
    dtype = torch.get_autocast_dtype(device)
    weights = {name: w.to(dtype) for name, w in lstm.named_parameters()}
    if lstm_state is not None:
        lstm_state = tuple(t.to(dtype) for t in lstm_state)
    with torch.autocast(device, enabled=False), warnings.catch_warnings():
        # the cast weights are not cuDNN's flat buffer: it packs them itself, once per call
        warnings.filterwarnings("ignore", message="RNN module weights are not part of single contiguous chunk")
        u, (h, c) = torch.func.functional_call(lstm, weights, (x.to(dtype), lstm_state))
    param_dtype = lstm.weight_hh_l0.dtype
    return u, (h.to(param_dtype), c.to(param_dtype))


def _lstm_step(
    lstm: nn.LSTM, x: Tensor, lstm_state: tuple[Tensor, Tensor] | None
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """The same LSTM on a window of one position ``[1, B, d]`` (generation, compression),
    through the cell (``torch.lstm_cell``, what ``nn.LSTMCell`` runs): the sequence
    kernel's set-up per call costs several times the step itself on CPU."""
    if lstm_state is None:
        lstm_state = (x.new_zeros(x.shape), x.new_zeros(x.shape))
    h, c = torch.lstm_cell(
        x[0],
        (lstm_state[0][0], lstm_state[1][0]),
        lstm.weight_ih_l0,
        lstm.weight_hh_l0,
        lstm.bias_ih_l0,
        lstm.bias_hh_l0,
    )
    return h.unsqueeze(0), (h.unsqueeze(0), c.unsqueeze(0))


class LayerNormLSTM(nn.Module):
    """A one-layer LSTM with LayerNorm (``model.cell = "ln_lstm"``; Ba, Kiros & Hinton 2016,
    "Layer Normalization", §3.1, the LN-LSTM; paper §6.2's open question)::

        (f, i, o, g) = LN_hh(W_hh h_{t-1}) + LN_ih(W_ih x_t) + b
        c_t = sigmoid(f) * c_{t-1} + sigmoid(i) * tanh(g)
        h_t = sigmoid(o) * tanh(LN_cell(c_t))

    Each LayerNorm has its own gain and bias: ``LN_ih`` and ``LN_hh`` over the ``4d``
    pre-activations, ``LN_cell`` over the ``d`` cells. The gates are in the paper's order
    ``f, i, o, g`` (``nn.LSTM``'s is ``i, f, g, o``). The input product and its LayerNorm
    are computed for the whole window at once, the recurrence one position at a time, in
    plain PyTorch. The state is the LSTM's: ``(h, c)``, each ``[1, B, d]``.
    """

    def __init__(self, d_model: int, eps: float):
        super().__init__()
        self.weight_ih = nn.Parameter(torch.empty(4 * d_model, d_model))  # W_ih, [4d, d]
        self.weight_hh = nn.Parameter(torch.empty(4 * d_model, d_model))  # W_hh, [4d, d]
        self.bias = nn.Parameter(torch.empty(4 * d_model))  # b, [4d]
        self.ln_ih = nn.LayerNorm(4 * d_model, eps=eps)
        self.ln_hh = nn.LayerNorm(4 * d_model, eps=eps)
        self.ln_cell = nn.LayerNorm(d_model, eps=eps)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """As ``nn.LSTM``'s: weights and bias U(+-1/sqrt(d)); the LayerNorms gain 1, bias 0."""
        bound = 1.0 / math.sqrt(self.weight_hh.shape[1])
        for p in (self.weight_ih, self.weight_hh, self.bias):
            nn.init.uniform_(p, -bound, bound)
        for norm in (self.ln_ih, self.ln_hh, self.ln_cell):
            norm.reset_parameters()

    def forward(
        self, x: Tensor, lstm_state: tuple[Tensor, Tensor] | None = None
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """``x [T, B, d]``, ``(h, c)`` each ``[1, B, d]`` or None for zeros -> ``(u [T, B, d],
        (h, c))``, the state in the parameters' dtype (under autocast too).

        Outside autocast the recurrence runs as one autograd node (:class:`_Recurrence`, its
        backward written out) instead of a dozen per position; under autocast, as plain
        PyTorch one position at a time (:meth:`_loop`). Both compute the equations above."""
        dtype = self.weight_hh.dtype
        if lstm_state is None:
            lstm_state = (x.new_zeros((1, *x.shape[1:]), dtype=dtype),) * 2
        h, c = lstm_state[0][0], lstm_state[1][0]  # [B, d]
        from_input = self.ln_ih(F.linear(x, self.weight_ih)) + self.bias  # [T, B, 4d], the whole window
        if torch.is_autocast_enabled(x.device.type):
            u, h, c = self._loop(from_input, h, c)
        else:
            hh, cell = self.ln_hh, self.ln_cell
            u, h, c = _Recurrence.apply(
                from_input, h, c, self.weight_hh, hh.weight, hh.bias, cell.weight, cell.bias, hh.eps
            )
        return u, (h.to(dtype).unsqueeze(0), c.to(dtype).unsqueeze(0))

    def _loop(self, from_input: Tensor, h: Tensor, c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The recurrence in plain PyTorch: ``from_input [T, B, 4d]``, ``h, c [B, d]`` ->
        ``(u [T, B, d], h, c)``."""
        outputs = []
        for t in range(from_input.shape[0]):
            f, i, o, g = (self.ln_hh(F.linear(h, self.weight_hh)) + from_input[t]).chunk(4, dim=-1)  # [B, d] each
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(self.ln_cell(c))
            outputs.append(h)
        return torch.stack(outputs), h, c


class _Recurrence(torch.autograd.Function):
    """The LN-LSTM's recurrence over a window, forward and backward written out: one
    autograd node for the window, every weight's gradient one product over all positions.

    Forward, per position (``a`` the recurrent product, ``LN`` with its own gain and bias)::

        a_t = W_hh h_{t-1};  (f, i, o, g) = LN_hh(a_t) + from_input_t
        c_t = s(f) c_{t-1} + s(i) tanh(g);  h_t = s(o) tanh(LN_cell(c_t))

    Backward, per position from the last: the chain rule through those lines, with
    ``aten.native_layer_norm_backward`` for both LayerNorms' inputs; after the loop,
    ``dW_hh = sum_t da_t^T h_{t-1}`` and the LayerNorms' gains and biases in one sum each.
    """

    @staticmethod
    def forward(ctx, from_input, h, c, weight_hh, gain_hh, bias_hh, gain_cell, bias_cell, eps):
        T, (B, d) = from_input.shape[0], h.shape
        new = from_input.new_empty
        hs, cs = new(T + 1, B, d), new(T + 1, B, d)  # h_{-1} .. h_{T-1}, c likewise
        a, gates, tanh_cell = new(T, B, 4 * d), new(T, B, 4 * d), new(T, B, d)
        stats = [new(T, B, 1) for _ in range(4)]  # mean and 1/std of LN_hh's and LN_cell's inputs
        hs[0], cs[0] = h, c
        for t in range(T):
            torch.mm(hs[t], weight_hh.t(), out=a[t])
            normed, stats[0][t], stats[1][t] = torch.native_layer_norm(a[t], (4 * d,), gain_hh, bias_hh, eps)
            pre = normed + from_input[t]
            torch.sigmoid(pre[:, : 3 * d], out=gates[t, :, : 3 * d])
            torch.tanh(pre[:, 3 * d :], out=gates[t, :, 3 * d :])
            f, i, o, g = gates[t].chunk(4, dim=1)
            torch.addcmul(f * cs[t], i, g, out=cs[t + 1])
            cell, stats[2][t], stats[3][t] = torch.native_layer_norm(cs[t + 1], (d,), gain_cell, bias_cell, eps)
            torch.tanh(cell, out=tanh_cell[t])
            torch.mul(o, tanh_cell[t], out=hs[t + 1])
        ctx.save_for_backward(hs, cs, a, gates, tanh_cell, *stats, weight_hh, gain_hh, bias_hh, gain_cell, bias_cell)
        return hs[1:].clone(), hs[T].clone(), cs[T].clone()

    @staticmethod
    def backward(ctx, grad_u, grad_h, grad_c):
        hs, cs, a, gates, tanh_cell, m_hh, r_hh, m_cell, r_cell, weight_hh, g_hh, b_hh, g_cell, b_cell = (
            ctx.saved_tensors
        )
        T, _, d = tanh_cell.shape
        layer_norm_input_grad = torch.ops.aten.native_layer_norm_backward
        grad_u = grad_u if grad_u is not None else torch.zeros_like(tanh_cell)
        dh = grad_h if grad_h is not None else torch.zeros_like(hs[0])
        dc = grad_c if grad_c is not None else torch.zeros_like(cs[0])
        d_pre, d_a, d_cell = torch.empty_like(a), torch.empty_like(a), torch.empty_like(tanh_cell)
        for t in reversed(range(T)):
            f, i, o, g = gates[t].chunk(4, dim=1)
            dh = dh + grad_u[t]
            d_cell[t] = dh * o * (1 - tanh_cell[t] * tanh_cell[t])  # into LN_cell's output
            dc = (
                dc
                + layer_norm_input_grad(
                    d_cell[t], cs[t + 1], (d,), m_cell[t], r_cell[t], g_cell, b_cell, [True, False, False]
                )[0]
            )
            sig = torch.cat([dc * cs[t], dc * g, dh * tanh_cell[t]], dim=1)  # d f, d i, d o (after the sigmoid)
            s = gates[t, :, : 3 * d]
            torch.mul(sig, s * (1 - s), out=d_pre[t, :, : 3 * d])
            torch.mul(dc * i, 1 - g * g, out=d_pre[t, :, 3 * d :])
            d_a[t] = layer_norm_input_grad(
                d_pre[t], a[t], (4 * d,), m_hh[t], r_hh[t], g_hh, b_hh, [True, False, False]
            )[0]
            dc = dc * f
            dh = d_a[t] @ weight_hh
        d_weight = d_a.reshape(-1, 4 * d).t() @ hs[:T].reshape(-1, d)
        normed_hh = (a - m_hh) * r_hh
        normed_cell = (cs[1:] - m_cell) * r_cell
        d_gain_hh, d_bias_hh = (d_pre * normed_hh).sum((0, 1)), d_pre.sum((0, 1))
        d_gain_cell, d_bias_cell = (d_cell * normed_cell).sum((0, 1)), d_cell.sum((0, 1))
        return d_pre, dh, dc, d_weight, d_gain_hh, d_bias_hh, d_gain_cell, d_bias_cell, None
