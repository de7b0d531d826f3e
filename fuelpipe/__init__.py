"""fuelpipe: plan-once LLM decoding in PyTorch, with the oracles that prove it is still right.

``fuelpipe.load(name_or_path)`` gives a ``TextModel`` (``fuelpipe.api``); it is imported on first use, so
``import fuelpipe`` stays free of torch.
"""
from fuelpipe.child_process import ignore_sigint_if_asked

ignore_sigint_if_asked()  # first: a pool's worker ignores a terminal's Ctrl-C while its imports run
__version__ = "0.1.0"

_API = ("load", "TextModel", "Completion")


def __getattr__(name: str):
    if name in _API:
        import fuelpipe.api

        return getattr(fuelpipe.api, name)
    raise AttributeError(f"module 'fuelpipe' has no attribute {name!r}")
