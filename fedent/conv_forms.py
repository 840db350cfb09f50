"""The vectorised trainer's other forms of a convolution (``train.conv``): the same function as ``nn.Conv2d``,
batched over clients differently from ``vmap``'s grouped convolution."""

from __future__ import annotations

import copy
from typing import Self

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedent.looped_conv import Geometry, looped_conv2d


class ConvForm(nn.Conv2d):
    """A ``Conv2d`` computed another way (``fedent.conv_forms``): same parameters, same function."""

    @classmethod
    def of(cls, conv: nn.Conv2d) -> Self:
        out = copy.copy(conv)
        out.__class__ = cls
        return out  # type: ignore[return-value]


class UnfoldConv2d(ConvForm):
    """A ``Conv2d`` computed as im2col (``F.unfold``) and one matmul: the same function as ``F.conv2d``.

    Under ``vmap`` over clients, ``F.conv2d`` with per-client weights becomes one grouped convolution (a group
    per client), which cuDNN runs far below the device's matmul speed; this form becomes a batched matmul
    instead, which tensor cores run well. It costs memory: the unfolded input is k² times the input.
    """

    def forward(self, x: Tensor) -> Tensor:
        n, _, h, w = x.shape
        kh, kw = self.kernel_size
        ph, pw = (int(v) for v in self.padding)  # numeric: swap_convs swaps no "same"/"valid" convolution
        (sh, sw), (dh, dw) = self.stride, self.dilation
        hout = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
        wout = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
        cols = F.unfold(x, (kh, kw), dilation=(dh, dw), padding=(ph, pw), stride=(sh, sw))  # (N, Cin·k², L)
        out = torch.matmul(self.weight.reshape(self.out_channels, -1), cols)  # (N, Cout, L)
        if self.bias is not None:
            out = out + self.bias.unsqueeze(-1)
        return out.reshape(n, self.out_channels, hout, wout)


class LoopedConv2d(ConvForm):
    """A ``Conv2d`` computed by ``fedent.looped_conv``: the same function, batched over clients by looping."""

    def forward(self, x: Tensor) -> Tensor:
        pad = self.padding
        assert not isinstance(pad, str)  # swap_convs swaps only numeric padding
        geom: Geometry = ((int(self.stride[0]), int(self.stride[1])), (int(pad[0]), int(pad[1])),
                          (int(self.dilation[0]), int(self.dilation[1])))
        return looped_conv2d(x, self.weight, self.bias, geom)


def swap_convs(model: nn.Module, form: type[ConvForm]) -> tuple[nn.Module, int]:
    """A shallow structural copy of ``model`` whose plain convolutions (groups 1, zero padding, numeric
    padding) are computed in ``form``; the parameters are not used (``functional_call`` supplies them). Returns
    the copy and how many convolutions were swapped."""
    out = copy.deepcopy(model)
    wrapped = out.__dict__.pop("forward", None)  # a forward set on the instance (fedent.perf's autocast) is a
    if wrapped is not None:                       # closure over the original model: wrapped again for the copy
        rebind = getattr(wrapped, "rebind", None)
        if rebind is None:
            raise ValueError("the model's forward is replaced on the instance in a way this copy cannot repeat; "
                             "use train.conv: direct")
        rebind(out)
    swapped = 0
    for parent in out.modules():
        for name, child in parent.named_children():
            if (type(child) is nn.Conv2d and child.groups == 1 and child.padding_mode == "zeros"
                    and not isinstance(child.padding, str)):
                setattr(parent, name, form.of(child))
                swapped += 1
    return out, swapped


FORMS: dict[str, type[ConvForm]] = {"unfold": UnfoldConv2d, "looped": LoopedConv2d}
