"""The group's gradient reduce rule, independent of arrival order:

    G = (((g_0 + g_1) + g_2) + ... + g_{P-1}) / P      per element, float64, slots ascending

A peer's slot is its index in the step's roster, so every peer sums the same values in the
same order whatever order they arrived in. The step's loss is reduced the same way.
JS twin: frontend_js/reduce.js.
"""
from collections import OrderedDict


def reduce_gradients(by_slot: dict):
    """{slot: grads} -> mean gradients; slots must be exactly 0..P-1."""
    slots = sorted(by_slot)
    if slots != list(range(len(slots))) or not slots:
        raise ValueError(f"slots must be 0..P-1, got {slots}")
    P = float(len(slots))
    first = by_slot[0]
    out = OrderedDict()
    for name in first:
        acc = first[name]
        for s in slots[1:]:
            acc = acc + by_slot[s][name]
        out[name] = acc / P
    return out


def reduce_losses(by_slot: dict) -> float:
    slots = sorted(by_slot)
    acc = by_slot[slots[0]]
    for s in slots[1:]:
        acc = acc + by_slot[s]
    return acc / float(len(slots))
