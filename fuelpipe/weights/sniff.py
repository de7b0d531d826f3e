"""Which kind of checkpoint a path is, from its first bytes; pickles are refused before anything is read."""
from __future__ import annotations

from pathlib import Path

from fuelpipe.weights.errors import PickleRefusedError, UnsupportedFormatError

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
_PICKLE_MAGIC = (b"PK\x03\x04", b"\x80")  # torch.save zip archive, raw pickle protocol 2+


def sniff_format(path: Path) -> str:
    """"gguf" | "hf_dir"; refuses pickles and anything else with a typed error naming the path."""
    if not path.exists():
        raise UnsupportedFormatError(path, "no such file or directory")
    if path.is_dir():
        return "hf_dir"
    if path.suffix in PICKLE_SUFFIXES:
        raise PickleRefusedError(path, f"{path.suffix} checkpoints are pickles and are refused (loading one can "
                                       "run arbitrary code); convert it to safetensors or GGUF")
    with open(path, "rb") as fh:
        head = fh.read(4)
    if head == b"GGUF":
        return "gguf"
    if any(head.startswith(m) for m in _PICKLE_MAGIC):
        raise PickleRefusedError(path, "the file is a pickle / torch.save archive and is refused (loading one can "
                                       "run arbitrary code); convert it to safetensors or GGUF")
    if path.suffix == ".safetensors":
        raise UnsupportedFormatError(path, "a lone .safetensors file has no config; pass its directory "
                                           "(config.json + *.safetensors)")
    raise UnsupportedFormatError(path, f"unrecognised checkpoint (first bytes {head!r}); "
                                       "expected a .gguf file or an HF safetensors directory")
