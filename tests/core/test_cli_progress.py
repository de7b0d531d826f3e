"""Progress bars show on a terminal and stay quiet in CI or when stderr is not a tty."""
from __future__ import annotations

import io
import sys

import pytest

from fuelpipe.progress import bar, quiet


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("ci, tty, expect_quiet", [
    (None, True, False), ("true", True, True), ("1", True, True), ("false", True, False), (None, False, True),
])
def test_quiet_when_ci_or_not_a_tty(monkeypatch, ci, tty, expect_quiet):
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    monkeypatch.setattr(sys, "stderr", _Tty() if tty else io.StringIO())
    assert quiet() is expect_quiet


def test_a_terminal_sees_the_bar(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    term = _Tty()
    monkeypatch.setattr(sys, "stderr", term)
    with bar(3, "fuelpipe test") as progress:
        progress.update(3)
    assert "fuelpipe test" in term.getvalue()
