"""Derived weight copies are shared only while their sources live: a recycled id never finds another's copy."""
import gc

import torch

from fuelpipe.plan import derived_weights


def test_a_copy_is_shared_while_its_source_lives_and_never_after(monkeypatch):
    a = torch.ones(4, 4)
    first = derived_weights.derived("t", [a], lambda: a.t().contiguous())
    assert derived_weights.derived("t", [a], lambda: torch.zeros(1)) is first  # shared: same source object
    monkeypatch.setattr(derived_weights, "_source_key", lambda t: ("same id and address",))  # a recycled identity
    b = torch.full((4, 4), 2.0)
    del a
    gc.collect()
    second = derived_weights.derived("t", [b], lambda: b.t().contiguous())
    assert second is not first and torch.equal(second, b)  # the dead source's copy (still alive) is not served
    a2 = torch.ones(4, 4)
    assert derived_weights.derived("t", [a2], lambda: a2 * 3).eq(3).all()  # b's copy is not served to a2 either
