"""Named registries that packages extend: families, fx passes, backends, oracles, experiment stages.

Every registry is filled the same way, built-ins included: from the Python
entry points of its group (``fuelpipe.families``, ``fuelpipe.fx_passes``,
``fuelpipe.backends``, ``fuelpipe.oracles``, ``fuelpipe.stages``), read once
on first use, and then by ``register()`` calls in-process. fuelpipe's own
entries are entry points of the ``fuelpipe`` distribution (``pyproject.toml``),
so an installed package adds a family exactly as fuelpipe adds Llama.

An entry point names either one entry or a sequence of entries; each entry
carries its own ``name``. Two entries of one name are a typed
``RegistrationClashError`` naming both sources (distribution and object
path), never a silent override.
"""
from __future__ import annotations

import contextlib
import difflib
import threading
from dataclasses import dataclass
from importlib import metadata
from typing import Generic, Iterable, Iterator, Optional, TypeVar

from fuelpipe.errors import ConfigError

T = TypeVar("T")

OWN_DISTRIBUTION = "fuelpipe"


class RegistrationClashError(ConfigError):
    """Two entries of one registry share a name."""


class ExtensionLoadError(ConfigError):
    """An entry point could not be imported, or named something that is not an entry of its group."""


def did_you_mean(kind: str, name: str, available: Iterable[str]) -> str:
    options = sorted(available)
    close = difflib.get_close_matches(str(name), options, n=1)
    hint = f" did you mean {close[0]!r}?" if close else ""
    return f"unknown {kind} {name!r};{hint} available: {', '.join(options)}"


@dataclass(frozen=True)
class Source:
    """Where an entry came from: ``distribution 'fuelpipe' (models.llama:FAMILY)`` or an in-process call."""

    distribution: Optional[str]  # None: registered in-process
    where: str  # the entry point's object path, or the registering module

    def __str__(self) -> str:
        if self.distribution is None:
            return f"in-process registration ({self.where})"
        return f"distribution {self.distribution!r} ({self.where})"


class Registry(Generic[T]):
    """Entries of one kind by name: entry points of ``group`` first, then in-process registrations."""

    def __init__(self, group: str, kind: str, entry_type: type, *, required: bool = True) -> None:
        self.group, self.kind, self.entry_type = group, kind, entry_type
        self.required = required  # fuelpipe itself ships entries of this group: none found = not installed
        self._entries: dict[str, tuple[T, Source]] = {}
        self._loaded = False
        self._lock = threading.RLock()

    # ---- reading -----------------------------------------------------------------------------
    def get(self, name: str) -> T:
        entries = self._all()
        if not isinstance(name, str) or name not in entries:
            raise ConfigError(did_you_mean(self.kind, name, entries))
        return entries[name][0]

    __getitem__ = get

    def __len__(self) -> int:
        return len(self._all())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._all()

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._all()))

    def names(self) -> tuple[str, ...]:
        return tuple(self)

    def items(self) -> list[tuple[str, T]]:
        return sorted(self.entries().items())

    def entries(self) -> dict[str, T]:
        return {name: entry for name, (entry, _) in self._all().items()}

    def source(self, name: str) -> Source:
        self.get(name)
        return self._all()[name][1]

    # ---- writing -----------------------------------------------------------------------------
    def register(self, entry: T, *, where: Optional[str] = None) -> T:
        """Add ``entry`` in-process (tests, notebooks); a name already taken is a clash."""
        with self._lock:
            self._load()
            self._add(entry, Source(None, where or _caller()))
        return entry

    def unregister(self, name: str) -> None:
        """Remove an entry registered in-process (entry points stay: uninstall their package)."""
        with self._lock:
            self._load()
            if name not in self._entries:
                raise ConfigError(did_you_mean(self.kind, name, self._entries))
            if self._entries[name][1].distribution is not None:
                raise ConfigError(f"{self.kind} {name!r} comes from {self._entries[name][1]}; "
                                  "only in-process registrations can be removed")
            del self._entries[name]

    @contextlib.contextmanager
    def swapped(self, entry: T) -> Iterator[T]:
        """Serve ``entry`` in place of the registered entry of its name for the block (planted-bug tests)."""
        with self._lock:
            self._load()
            name = getattr(entry, "name")
            saved = self._entries.get(name)
            self._entries[name] = (entry, Source(None, f"swapped in by {_caller()}"))
        try:
            yield entry
        finally:
            with self._lock:
                if saved is None:
                    self._entries.pop(name, None)
                else:
                    self._entries[name] = saved

    # ---- loading -----------------------------------------------------------------------------
    def _all(self) -> dict[str, tuple[T, Source]]:
        if not self._loaded:
            with self._lock:
                self._load()
        return self._entries

    def _load(self) -> None:
        if self._loaded:
            return
        self._entries = {}
        try:
            for ep in sorted(metadata.entry_points(group=self.group), key=_own_first):
                source = Source(ep.dist.name if ep.dist is not None else "unknown distribution", ep.value)
                try:
                    obj = ep.load()
                except Exception as err:  # a broken plugin names itself; it does not crash deep inside
                    raise ExtensionLoadError(
                        f"entry point {ep.name!r} of group {self.group!r} from {source} failed to import: "
                        f"{type(err).__name__}: {err}") from err
                for entry in _entries_of(obj):
                    self._add(entry, source)
            if self.required and not any(s.distribution == OWN_DISTRIBUTION for _, s in self._entries.values()):
                raise ExtensionLoadError(
                    f"no {self.kind} entries of the {OWN_DISTRIBUTION!r} distribution were found in entry-point "
                    f"group {self.group!r}: fuelpipe is not installed in this environment, or its metadata is "
                    "stale; run: pip install -e . (from the checkout)")
        except BaseException:
            self._entries = {}  # nothing half-loaded: the next read tries again and reports the same error
            raise
        self._loaded = True

    def _add(self, entry: T, source: Source) -> None:
        if not isinstance(entry, self.entry_type):
            raise ExtensionLoadError(
                f"{source} registers {entry!r} in group {self.group!r}; expected a "
                f"{self.entry_type.__name__} (or a sequence of them)")
        name = getattr(entry, "name")
        if not isinstance(name, str) or not name:
            raise ExtensionLoadError(f"{source} registers a {self.kind} with name {name!r}; a name is a non-empty string")
        if name in self._entries:
            raise RegistrationClashError(
                f"{self.kind} {name!r} is registered twice: by {self._entries[name][1]} and by {source}")
        self._entries[name] = (entry, source)


def _entries_of(obj) -> list:
    if isinstance(obj, (list, tuple)):
        return list(obj)
    return [obj]


def _own_first(ep) -> tuple[int, str]:
    dist = ep.dist.name if ep.dist is not None else ""
    return (0 if dist == OWN_DISTRIBUTION else 1, ep.value)


def _caller() -> str:
    import inspect

    frame = inspect.stack()[2]
    return f"{frame.filename}:{frame.lineno}"
