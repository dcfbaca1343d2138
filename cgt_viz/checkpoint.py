"""Training checkpoints: one folder per saved step, written so that no crash can lose the last good one.

Layout of `checkpoint_dir`:

    latest                      JSON {"step": k, "dir": "step-0000000k"}: the newest complete checkpoint
    step-0000000k/
        model.safetensors       the model's state_dict
        train_state.safetensors optimizer tensors ("optim.<param index>.<name>") and RNG states ("rng.<name>")
        history.json            the run's history up to step k
        state.json              written last: step, run identity, optimizer groups, non-tensor state,
                                sha256 of the three files above

How a save stays atomic: every file goes into a hidden temporary folder, which is renamed to
`step-…` only once complete; `latest` is then replaced in one rename; only after that are the oldest
folders deleted. A crash at any point leaves `latest` naming a complete folder. Loading verifies the
checksums, so a truncated or tampered file is rejected with a message naming it. Nothing here
unpickles: tensors come from safetensors, the rest from JSON.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import random
import re
import shutil
import socket
import stat
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ._checks import refuse
from .io import load_tensors, published_folder, read_json, save_tensors, sha256_file, write_json

try:
    import fcntl
except ImportError:   # Windows: no flock; the lock is then check-then-write
    fcntl = None

FORMAT = "cgt_viz.checkpoint/2"        # /2: state.json carries its own checksum ("state_sha256")
FORMATS = ("cgt_viz.checkpoint/1", FORMAT)   # /1 (no state checksum) still loads
LATEST = "latest"
_STEP_DIR = re.compile(r"^step-(\d+)$")
_FILES = ("model.safetensors", "train_state.safetensors", "history.json")


@dataclass
class Checkpoint:
    """What `load_checkpoint` returns; tensors are on the CPU."""

    path: Path
    step: int
    run: dict[str, Any]                       # the identity of the run that wrote it (config, task, lr, ...)
    model_state: dict[str, torch.Tensor]
    optimizer_state: dict[str, Any]           # ready for optimizer.load_state_dict
    rng: dict[str, Any]                       # see capture_rng / restore_rng
    history: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------- RNG
def capture_rng(generators: dict[str, torch.Generator]) -> dict[str, Any]:
    """Every random state a training step touches: torch CPU/CUDA, Python, NumPy, and named generators."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(),
                             "python": random.getstate(),
                             "numpy": np.random.get_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    state["generators"] = {name: g.get_state() for name, g in generators.items()}
    return state


def restore_rng(state: dict[str, Any], generators: dict[str, torch.Generator]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = state["cuda"][:torch.cuda.device_count()]
        for i, s in enumerate(cuda_states):
            torch.cuda.set_rng_state(s, i)
    for name, g in generators.items():
        if name in state["generators"]:
            g.set_state(state["generators"][name])


def _rng_to_tensors(rng: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Split RNG states into tensors (safetensors) and JSON-able parts."""
    tensors = {"rng.torch": rng["torch"]}
    for i, s in enumerate(rng.get("cuda", [])):
        tensors[f"rng.cuda.{i}"] = s
    for name, s in rng["generators"].items():
        tensors[f"rng.gen.{name}"] = s
    kind, keys, pos, has_gauss, cached = rng["numpy"]
    tensors["rng.numpy"] = torch.from_numpy(np.asarray(keys, dtype=np.uint32).view(np.int32).copy())
    version, internal, gauss = rng["python"]
    meta = {"numpy": [kind, int(pos), int(has_gauss), float(cached)],
            "python": [version, list(internal), gauss],
            "n_cuda": len(rng.get("cuda", [])),
            "generators": sorted(rng["generators"])}
    return tensors, meta


def _rng_from_tensors(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    kind, pos, has_gauss, cached = meta["numpy"]
    keys = tensors["rng.numpy"].numpy().view(np.uint32)
    version, internal, gauss = meta["python"]
    rng = {"torch": tensors["rng.torch"],
           "numpy": (kind, keys, pos, has_gauss, cached),
           "python": (version, tuple(internal), gauss),
           "generators": {name: tensors[f"rng.gen.{name}"] for name in meta["generators"]}}
    if meta["n_cuda"]:
        rng["cuda"] = [tensors[f"rng.cuda.{i}"] for i in range(meta["n_cuda"])]
    return rng


# ---------------------------------------------------------------------------------------- optimizer
def _optimizer_to_tensors(opt_state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """torch optimizer state_dict -> tensors "optim.<index>.<name>" + JSON (groups, non-tensor values)."""
    tensors, scalars = {}, {}
    for index, per_param in opt_state["state"].items():
        for name, value in per_param.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optim.{index}.{name}"] = value
            else:
                scalars[f"{index}.{name}"] = value
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()} for g in opt_state["param_groups"]]
    return tensors, {"param_groups": groups, "scalars": scalars}


def _optimizer_from_tensors(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        if key.startswith("optim."):
            _, index, name = key.split(".", 2)
            state.setdefault(int(index), {})[name] = value
    for key, value in meta["scalars"].items():
        index, name = key.split(".", 1)
        state.setdefault(int(index), {})[name] = value
    groups = [{k: (tuple(v) if k == "betas" else v) for k, v in g.items()} for g in meta["param_groups"]]
    return {"state": state, "param_groups": groups}


# ------------------------------------------------------------------------------------------- saving
def _state_digest(state: dict[str, Any]) -> str:
    """sha256 of state.json's content without its own checksum entry (canonical JSON)."""
    body = {k: v for k, v in state.items() if k != "state_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def save_checkpoint(checkpoint_dir: str | os.PathLike, step: int, run: dict[str, Any], model_state: dict[str, torch.Tensor],
                    optimizer_state: dict[str, Any], rng: dict[str, Any], history: dict[str, Any],
                    keep: int = 2, extra: dict[str, Any] | None = None) -> Path:
    """Write one checkpoint folder atomically, point `latest` at it, keep the newest `keep` folders."""
    root = Path(checkpoint_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / step_dir_name(step)
    # debris of a save that was killed (one writer per folder: see RunLock): step folders, old ones moved aside,
    # and the temp file of an interrupted `latest` update
    for stale in [*root.glob(".tmp-step-*"), *root.glob(".old-step-*")]:
        shutil.rmtree(stale, ignore_errors=True)
    for stale in root.glob(f".{LATEST}.*.tmp"):
        stale.unlink(missing_ok=True)
    tmp = root / f".tmp-{step_dir_name(step)}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    # re-saving a step (after a resume) moves the old one aside, never deletes it first
    with published_folder(tmp, final, root / f".old-{final.name}-{uuid.uuid4().hex[:8]}"):
        save_tensors(tmp / "model.safetensors", model_state)
        opt_tensors, opt_meta = _optimizer_to_tensors(optimizer_state)
        rng_tensors, rng_meta = _rng_to_tensors(rng)
        save_tensors(tmp / "train_state.safetensors", {**opt_tensors, **rng_tensors})
        write_json(tmp / "history.json", history)
        state = {"format": FORMAT, "step": step, "run": run, "optimizer": opt_meta, "rng": rng_meta,
                 "extra": extra or {}, "sha256": {name: sha256_file(tmp / name) for name in _FILES}}
        write_json(tmp / "state.json", {**state, "state_sha256": _state_digest(state)})
    write_json(root / LATEST, {"step": step, "dir": final.name})
    for old in list_checkpoints(root)[:-keep] if keep > 0 else []:
        if old != final:
            shutil.rmtree(old, ignore_errors=True)
    return final


# ------------------------------------------------------------------------------------------ loading
def list_checkpoints(checkpoint_dir: str | os.PathLike) -> list[Path]:
    """Complete-looking step folders (those with a state.json), oldest first."""
    root = Path(checkpoint_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir()
             if (m := _STEP_DIR.match(p.name)) and not p.is_symlink() and (p / "state.json").is_file()]
    return [p for _, p in sorted(found)]


def latest_checkpoint(checkpoint_dir: str | os.PathLike) -> Path | None:
    """The folder `latest` names, else the newest step folder; None if there is no checkpoint at all."""
    root = Path(checkpoint_dir)
    pointer = root / LATEST
    if pointer.exists() and not pointer.is_file():
        raise ValueError(f"the checkpoint pointer {str(pointer)!r} must be a file, got a directory or other "
                         f"non-file; move it away (the step-* folders next to it are untouched)")
    if pointer.is_file():
        try:
            name = read_json(pointer)["dir"]
        except (ValueError, KeyError, TypeError):
            name = None
        if name is not None:
            target = _inside(root, name, f"the checkpoint pointer {str(pointer)!r}")
            if (target / "state.json").is_file():
                return target
    found = list_checkpoints(root)
    return found[-1] if found else None


def _inside(root: Path, name: Any, what: str) -> Path:
    """root / name, refused unless name is a step-* folder name that stays inside root (no '..', no link out)."""
    if not isinstance(name, str) or not _STEP_DIR.match(name):
        raise ValueError(f"{what} must name a step-NNNNNNNN folder inside {str(root)!r}, got {name!r}; refusing "
                         f"to follow it")
    target = root / name
    if target.is_symlink() or target.resolve().parent != root.resolve():
        raise ValueError(f"{what} names {name!r}, which leads outside {str(root)!r} (a symbolic link); refusing to "
                         f"follow it")
    return target


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Read and verify a step folder, or the latest checkpoint of a checkpoint_dir.

    Raises FileNotFoundError when there is none, ValueError when a file is truncated, tampered or not ours.
    Reading the latest checkpoint of a run that is still training is safe: when the folder it resolved to is
    rotated away while it is read (a newer one became `latest`), it reads the new `latest` instead.
    """
    path = Path(path)
    if (path / "state.json").is_file():
        return _load_step(path)
    attempts = 50
    for attempt in range(attempts):
        found = latest_checkpoint(path)
        if found is None:
            raise FileNotFoundError(f"no checkpoint in {str(path)!r} (expected a 'latest' file or step-* folders)")
        try:
            return _load_step(found)
        except (FileNotFoundError, ValueError):
            # rotated away while read: `latest` names another folder now (save_checkpoint points it at the new
            # folder before it deletes old ones). A damaged checkpoint that is still the latest is an error
            if attempt + 1 < attempts and latest_checkpoint(path) != found:
                continue
            raise
    raise AssertionError("unreachable")


def _load_step(path: Path) -> Checkpoint:
    """Read and verify one step folder."""
    state_file = path / "state.json"
    state = read_json(state_file)
    if not isinstance(state, dict) or state.get("format") not in FORMATS:
        raise ValueError(f"{str(state_file)!r} is not a cgt_viz checkpoint (format {FORMAT!r} expected)")
    missing = [k for k in ("step", "run", "optimizer", "rng", "sha256") if k not in state]
    missing += [f"sha256.{n}" for n in _FILES if not isinstance(state.get("sha256"), dict) or n not in state["sha256"]]
    if missing:
        raise ValueError(f"{str(state_file)!r} lacks {missing}; it is damaged or not written by cgt_viz, refusing "
                         f"to load it")
    if state["format"] == FORMAT and state.get("state_sha256") != _state_digest(state):
        raise ValueError(f"{str(state_file)!r} does not match its checksum (edited, truncated or tampered); "
                         f"refusing to load it")
    m = _STEP_DIR.match(path.name)
    if m and int(m.group(1)) != state["step"]:
        raise ValueError(f"{str(state_file)!r} says step {state['step']!r} but its folder is {path.name!r}; "
                         f"refusing to load it")
    for name in _FILES:
        file = path / name
        if not file.is_file():
            raise ValueError(f"checkpoint {str(path)!r} is incomplete: {name} is missing")
        if sha256_file(file) != state["sha256"][name]:
            raise ValueError(f"checkpoint file {str(file)!r} does not match its checksum (truncated or tampered); "
                             f"refusing to load it")
    train_state = load_tensors(path / "train_state.safetensors")
    return Checkpoint(path=path, step=int(state["step"]), run=state["run"],
                      model_state=load_tensors(path / "model.safetensors"),
                      optimizer_state=_optimizer_from_tensors(train_state, state["optimizer"]),
                      rng=_rng_from_tensors(train_state, state["rng"]),
                      history=read_json(path / "history.json"), extra=state.get("extra", {}))


# --------------------------------------------------------------------------------------------- locking
LOCK_NAME = ".lock"


class FolderLocked(RuntimeError):
    """Another live process writes to this run or checkpoint folder."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # exists, owned by someone else
        return True
    return True


class RunLock:
    """One writer per folder: `with RunLock(folder): ...` holds `folder/.lock` (JSON: pid, host, time).

    The holder keeps the lock file open with an exclusive `fcntl.flock` for as long as it holds the lock, so
    taking it is one atomic kernel operation: of many processes racing for a free or stale lock exactly one
    wins. A second writer is refused with FolderLocked naming the holder. A lock file left by a process that no
    longer runs on this host (kill -9, a crashed kernel) is stale and taken over; one from another host is never
    guessed at: the message says which file to remove once that run is known to be gone.
    """

    def __init__(self, folder: str | os.PathLike, what: str = "folder"):
        self.folder, self.what = Path(folder), what
        self.path = self.folder / LOCK_NAME
        self._held = False
        self._fd: int | None = None

    def _not_a_lock(self, what: str) -> ValueError:
        return refuse(f"the lock file {str(self.path)!r} of {self.what} {str(self.folder)!r}",
                      "a regular file (or absent)", what,
                      hint="a lock is never written through a link; remove it if no run uses this folder. "
                           "Nothing was written")

    def _open(self) -> int:
        """Open (or create) the lock file itself, never what a link at its path points to: a `.lock` that is a
        symbolic link (to a file the user can write) would otherwise be truncated and overwritten with the
        lock's JSON. O_NOFOLLOW refuses a link atomically; the fstat after it refuses a hard link and anything
        that is not a regular file (a FIFO, a device), before a byte is written."""
        with contextlib.suppress(OSError):
            if self.path.is_symlink():
                raise self._not_a_lock(f"a symbolic link to {os.readlink(self.path)!r}")
        flags = os.O_CREAT | os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
        try:
            fd = os.open(self.path, flags, 0o644)
        except OSError as err:
            if err.errno == errno.ELOOP:   # a link put there between the check above and the open
                raise self._not_a_lock("a symbolic link") from None
            raise OSError(err.errno, f"{self.what} {str(self.folder)!r} is not writable ({err.strerror}); "
                                     f"nothing was written") from None
        st = os.fstat(fd)
        problem = ("not a regular file" if not stat.S_ISREG(st.st_mode)
                   else f"a hard link shared with {st.st_nlink - 1} other name(s)" if st.st_nlink > 1 else None)
        if problem:
            os.close(fd)
            raise self._not_a_lock(problem)
        return fd

    def _holder(self, fd: int | None = None) -> tuple[dict | None, int | None, str | None]:
        """(the lock file's JSON, pid, host); Nones when it is empty or unreadable."""
        try:
            if fd is not None:
                os.lseek(fd, 0, os.SEEK_SET)
                raw = b""
                while chunk := os.read(fd, 65536):
                    raw += chunk
            else:
                raw = self.path.read_bytes()
            holder = json.loads(raw.decode("utf-8"))
            return holder, int(holder["pid"]), str(holder["host"])
        except (ValueError, KeyError, TypeError, OSError):
            return None, None, None

    def _in_use(self, pid: int | None) -> FolderLocked:
        mine = " (this process)" if pid == os.getpid() else ""
        who = f"pid {pid}{mine}" if pid is not None else "another process"
        return FolderLocked(f"{self.what} {str(self.folder)!r} is in use by {who} on this host (lock file "
                            f"{str(self.path)!r}); one writer per folder: wait for it to finish, stop it, or choose "
                            f"another folder")

    def acquire(self) -> "RunLock":
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise OSError(err.errno, f"{self.what} {str(self.folder)!r} cannot be created, so it is not writable "
                                     f"({err.strerror}); nothing was written") from None
        for _ in range(20):
            fd = self._open()
            try:
                if fcntl is not None:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        raise self._in_use(self._holder()[1]) from None
                    try:   # a holder releasing unlinks the file: make sure we locked the file that is at the path
                        if os.fstat(fd).st_ino != os.lstat(self.path).st_ino:
                            os.close(fd)
                            continue
                    except FileNotFoundError:
                        os.close(fd)
                        continue
                holder, pid, host = self._holder(fd)
                if holder is not None and host != socket.gethostname():
                    raise FolderLocked(f"{self.what} {str(self.folder)!r} is in use by pid {pid} on host {host!r} "
                                       f"(lock file {str(self.path)!r}); one writer per folder. If that run is "
                                       f"gone, remove the lock file")
                if pid is not None and _pid_alive(pid) and pid != os.getpid():
                    raise self._in_use(pid)   # a holder that keeps no flock (an older cgt_viz): its pid runs
                if pid == os.getpid() and fcntl is None:
                    raise self._in_use(pid)
                # free, or stale (its process is gone): ours now. We hold the flock, so nobody else writes here
                os.ftruncate(fd, 0)
                os.lseek(fd, 0, os.SEEK_SET)
                os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                         "time": time.time()}).encode())
                os.fsync(fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.close(fd)
                raise
            self._fd, self._held = fd, True
            return self
        raise FolderLocked(f"{self.what} {str(self.folder)!r}: could not take the lock {str(self.path)!r}; another "
                           f"process keeps taking and releasing it")

    def release(self) -> None:
        if self._held:
            self._held = False
            fd, self._fd = self._fd, None
            try:
                # unlink while still holding the flock, then close (which drops it): a process that opened the
                # old file meanwhile sees it is no longer at the path and opens the new one
                holder = self._holder(fd)[1]
                if holder == os.getpid():
                    self.path.unlink(missing_ok=True)
            except OSError:
                pass
            finally:
                if fd is not None:
                    with contextlib.suppress(OSError):
                        os.close(fd)

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> bool:
        self.release()
        return False
