"""Compiled plans on disk: one verified entry per content key, shared by every process that can read the folder.

Layout under the configured directory::

    v1/<digest>/meta.json     the key's fields, the payload's size and sha256, when it was made
    v1/<digest>/plan.pt2      the payload (an AOTInductor package)
    v1/.tmp/                  entries being written, and entries on their way out

Rules:
* **Atomic, no torn entries.** An entry is written whole into ``.tmp`` (payload, then
  its checksum, then meta.json, each fsynced) and published with one ``rename`` of its
  folder. Two writers of one key both build; the first rename wins and the second
  writer discards its copy and serves the published entry (the same key: the same plan).
* **Never trusted.** A lookup checks that meta.json parses, that its key fields equal
  the requested ones, and that the payload's size and sha256 match; anything else is
  reported (``corrupt`` / ``mismatch``), moved out, and the caller rebuilds.
* **Bounded.** After each store, the least recently used entries (meta.json's mtime,
  refreshed on every hit) are removed until the folder holds at most ``max_bytes``;
  the entry just written always stays. Abandoned ``.tmp`` folders older than an hour go too.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from fuelpipe.errors import ConfigError, PlanError

if TYPE_CHECKING:
    from fuelpipe.plan.plan_cache_key import PlanContentKey

LAYOUT = "v1"
PAYLOAD = "plan.pt2"
META = "meta.json"
STALE_TMP_S = 3600.0
_CHUNK = 1 << 22


@dataclass(frozen=True)
class PlanCacheSpec:
    """``backend.plan_cache``: where compiled plans persist (None: nowhere) and how much they may hold."""

    dir: Optional[str] = None
    max_gb: float = 8.0
    # A folder to copy a verified entry from on a miss, instead of compiling it (the plan_cache oracle's
    # private folder is seeded from the run's own); never written.
    seed: Optional[str] = None

    def __post_init__(self) -> None:
        if not isinstance(self.max_gb, (int, float)) or isinstance(self.max_gb, bool) or not self.max_gb > 0:
            raise ConfigError(f"backend.plan_cache.max_gb must be a number > 0, got {self.max_gb!r}")

    def filed_key(self, key: "PlanContentKey") -> "PlanContentKey":
        """The key a plan is stored and looked up under, given its content key: all of it (a negative control
        overrides this)."""
        return key

    @property
    def enabled(self) -> bool:
        return self.dir is not None

    @property
    def max_bytes(self) -> int:
        return int(self.max_gb * 1e9)


@dataclass(frozen=True)
class Lookup:
    """The answer of one lookup: ``hit`` with the payload's path, or why not."""

    status: str  # hit | miss | corrupt | mismatch
    path: Optional[Path] = None
    detail: str = ""
    extra: Optional[dict] = None  # what the writer recorded beside the payload (a hit only)

    @property
    def hit(self) -> bool:
        return self.status == "hit"


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


class PlanStore:
    def __init__(self, root: str | os.PathLike, max_bytes: int) -> None:
        self.root = Path(root).expanduser() / LAYOUT
        self.tmp = self.root / ".tmp"
        self.max_bytes = max_bytes
        self._given = str(root)
        given = Path(root).expanduser()
        for parent in (self.root, given, *given.parents):
            if parent.exists() and not parent.is_dir():
                raise ConfigError(f"backend.plan_cache.dir {self._given!r} cannot be used: {parent} is a file")

    def entry(self, digest: str) -> Path:
        return self.root / digest

    # ---- reading --------------------------------------------------------------------------
    def lookup(self, digest: str, fields: dict) -> Lookup:
        folder = self.entry(digest)
        meta_path = folder / META
        if not folder.is_dir():
            if os.path.lexists(folder):  # a plain file (or a link) where the entry folder belongs
                return self._reject(folder, "corrupt", f"{folder} is not an entry folder (a plain file or link)")
            return Lookup("miss")
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, ValueError) as err:
            return self._reject(folder, "corrupt", f"unreadable {META}: {err}")
        if meta.get("key") != fields:
            diff = sorted(k for k in set(fields) | set(meta.get("key") or {})
                          if (meta.get("key") or {}).get(k) != fields.get(k))
            return self._reject(folder, "mismatch", f"stored key differs in {diff}")
        payload = folder / PAYLOAD
        try:
            size = payload.stat().st_size
        except OSError as err:
            return self._reject(folder, "corrupt", f"payload missing: {err}")
        if size != meta.get("bytes"):
            return self._reject(folder, "corrupt", f"payload is {size} bytes, {META} says {meta.get('bytes')}")
        if file_sha256(payload) != meta.get("sha256"):
            return self._reject(folder, "corrupt", "payload sha256 differs from the one recorded")
        try:
            os.utime(meta_path)  # least recently used goes first
        except OSError:
            pass
        return Lookup("hit", payload, extra=meta.get("extra") or {})

    def _reject(self, folder: Path, status: str, detail: str) -> Lookup:
        self.discard(folder)
        return Lookup(status, None, detail)

    # ---- writing --------------------------------------------------------------------------
    def store(self, digest: str, fields: dict, write_payload: Callable[[Path], None],
              extra: Optional[dict] = None) -> tuple[Path, bool]:
        """Build an entry with ``write_payload(path)`` and publish it; (payload path, published by us).

        ``extra``: JSON facts about the build kept in meta.json (for example which passes applied).

        When another writer published the same key first, ours is discarded and theirs returned.
        """
        staging = self.tmp / f"{digest}-{uuid.uuid4().hex}"
        try:
            staging.mkdir(parents=True)
        except OSError as err:  # a read-only or full folder: said so, typed (lookups still serve hits)
            raise PlanError(f"backend.plan_cache.dir {self._given!r}: cannot write a new entry: {err}") from err
        try:
            payload = staging / PAYLOAD
            write_payload(payload)
            _fsync(payload)
            meta = {"key": fields, "bytes": payload.stat().st_size, "sha256": file_sha256(payload),
                    "created": time.time(), "pid": os.getpid(), "extra": extra or {}}
            (staging / META).write_text(json.dumps(meta, indent=1, sort_keys=True))
            _fsync(staging / META)
            final = self.entry(digest)
            published = self._publish(staging, final)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
        if published:
            self.evict(keep=digest)
        return final / PAYLOAD, published

    def _publish(self, staging: Path, final: Path) -> bool:
        """Rename ``staging`` to ``final``; False when another writer's entry is already there.

        Anything else at ``final`` (a plain file, a link) is no entry: it is moved out and the rename
        retried, so it cannot make every later build compile without ever publishing."""
        for _ in range(2):
            try:
                os.rename(staging, final)
                return True
            except OSError:
                if final.is_dir() and not final.is_symlink():  # another writer published this key first
                    return False
                if not os.path.lexists(final):
                    raise
                self.discard(final)
        return False

    # ---- bounding -------------------------------------------------------------------------
    def entries(self) -> list[tuple[float, int, Path]]:
        """(last use, bytes, folder) of every published entry."""
        out = []
        if not self.root.is_dir():
            return out
        for folder in self.root.iterdir():
            if folder.name.startswith(".") or not folder.is_dir():
                continue
            try:
                used = (folder / META).stat().st_mtime
                size = sum(p.stat().st_size for p in folder.iterdir())
            except OSError:
                continue
            out.append((used, size, folder))
        return sorted(out)

    def total_bytes(self) -> int:
        return sum(size for _, size, _ in self.entries())

    def evict(self, keep: Optional[str] = None) -> list[str]:
        removed = []
        entries = self.entries()
        total = sum(size for _, size, _ in entries)
        for _, size, folder in entries:
            if total <= self.max_bytes:
                break
            if folder.name == keep:
                continue
            self.discard(folder)
            total -= size
            removed.append(folder.name)
        now = time.time()
        for folder in (self.tmp.iterdir() if self.tmp.is_dir() else ()):
            try:
                if now - folder.lstat().st_mtime > STALE_TMP_S:
                    _remove(folder)
            except OSError:
                pass
        return removed

    def discard(self, folder: Path) -> None:
        """Move ``folder`` (an entry, or a file where one belongs) out of the lookup path first (one rename),
        then delete it."""
        trash = self.tmp / f"trash-{uuid.uuid4().hex}"
        try:
            self.tmp.mkdir(parents=True, exist_ok=True)
            os.rename(folder, trash)
        except OSError:
            return  # already gone (another process removed or replaced it), or a folder we may not change
        _remove(trash)


def _remove(path: Path) -> None:
    """Delete a folder tree, or a file or link, as far as permitted."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink()
        except OSError:
            pass


def _fsync(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())
