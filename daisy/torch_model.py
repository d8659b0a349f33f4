"""The same architecture as daisy/model.py as a PyTorch nn.Module — OPTIONAL (needs torch).

Used to load our checkpoints in PyTorch (docs/ARCHITECTURE.md shows how), by the interop tests
and as the float32 baseline of bench/. The app never imports this module.

    import torch
    from daisy.torch_model import DaisyGPT
    ck = torch.load("model.pt", weights_only=True)
    model = DaisyGPT(**ck["config"], quantized=True).double()
    model.load_state_dict(ck["model"])
    logits = model(tokens)                       # (B, T, 257)

quantized=True emulates the INT8 units (per-row / per-column block scales, round half to even,
clamp ±127, integer-valued float64 GEMM, (acc * s_row) * s_col) so float64 logits match the
reference to float tolerance; quantized=False is the plain float model.
"""
import math

import torch
from torch import nn

VOCAB_SIZE = 257
NORM_EPS = 1e-5
SCALE_FLOOR = 2.0 ** -60


def fake_qmatmul(a, b):
    """a (..., M, K) @ b (..., K, N) through the INT8 unit, in torch."""
    sa = a.abs().amax(dim=-1).clamp_min(SCALE_FLOOR) / 127.0                  # (..., M)
    sb = b.abs().amax(dim=-2).clamp_min(SCALE_FLOOR) / 127.0                  # (..., N)
    qa = torch.round(a / sa.unsqueeze(-1)).clamp(-127, 127)                   # ties to even
    qb = torch.round(b / sb.unsqueeze(-2)).clamp(-127, 127)
    return (qa @ qb) * sa.unsqueeze(-1) * sb.unsqueeze(-2)


class RMSNorm(nn.Module):
    def __init__(self, C):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(C))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + NORM_EPS) * self.weight


class Block(nn.Module):
    def __init__(self, C, H, mm):
        super().__init__()
        self.H, self.mm = H, mm
        self.norm1 = RMSNorm(C)
        self.attn = nn.Module()
        self.attn.qkv = nn.Linear(C, 3 * C, bias=False)
        self.attn.proj = nn.Linear(C, C, bias=False)
        self.norm2 = RMSNorm(C)
        self.mlp = nn.Module()
        self.mlp.fc = nn.Linear(C, 4 * C, bias=False)
        self.mlp.proj = nn.Linear(4 * C, C, bias=False)

    def linear(self, x, lin):
        return self.mm(x, lin.weight.t())

    def forward(self, x):
        B, T, C = x.shape
        D = C // self.H
        qkv = self.linear(self.norm1(x), self.attn.qkv)                        # (B, T, 3C)
        q, k, v = qkv.view(B, T, 3, self.H, D).permute(2, 0, 3, 1, 4)           # (B, H, T, D)
        s = self.mm(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(D))             # (B, H, T, T)
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        p = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1)
        y = self.mm(p, v).transpose(1, 2).reshape(B, T, C)                     # (B, T, C)
        x = x + self.linear(y, self.attn.proj)
        x = x + self.linear(torch.relu(self.linear(self.norm2(x), self.mlp.fc)), self.mlp.proj)
        return x


class DaisyGPT(nn.Module):
    def __init__(self, width=32, seq_len=32, layers=2, heads=4, quantized=False, **_ignored):
        super().__init__()
        mm = fake_qmatmul if quantized else torch.matmul
        self.mm = mm
        self.wte = nn.Embedding(VOCAB_SIZE, width)
        self.wpe = nn.Embedding(seq_len, width)
        self.blocks = nn.ModuleList(Block(width, heads, mm) for _ in range(layers))
        self.norm_f = RMSNorm(width)
        self.head = nn.Linear(width, VOCAB_SIZE, bias=False)

    def forward(self, idx):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))       # (B, T, C)
        for block in self.blocks:
            x = block(x)
        return self.mm(self.norm_f(x), self.head.weight.t())                   # (B, T, V)
