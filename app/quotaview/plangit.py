"""``envelope quotas plan --git-ref REF --branch NAME``: the change written into the
tenancy files as they are at ``REF`` (read with ``git show``, never from the working
tree), value by value with the ``fix`` editor (:func:`app.fix.edit.fix_text`: only the bytes
of each changed value, comments, key order and the padding around it kept), as one
commit on a new local branch made with git plumbing — ``hash-object``, ``read-tree`` and
``update-index`` on a temporary index, ``write-tree``, ``commit-tree``, ``update-ref``
(refused when the branch exists). The working tree, the index and HEAD are untouched,
nothing is pushed."""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from app.cluster.static import Loaded, load_text
from app.fix.edit import fix_text
from app.quotaview.plan import Key, key_of
from app.quotaview.plancommands import patch_ops

__all__ = ["GitChange", "GitError", "commit_change", "read_ref"]

SUFFIXES = (".yaml", ".yml", ".json")


def _realign_line(old: str, new: str) -> str:
    """``new`` (``old`` with one value's bytes replaced) with the run of spaces after the
    change shortened or lengthened by the width the value gained or lost, so the columns
    after it stay where they were (``{deserved: 8,       limit: 32}`` -> ``{deserved: 10,
    limit: 32}`` with the limit in its column). Unchanged when there is no such run."""
    delta = len(new) - len(old)
    if delta == 0:
        return new
    suffix = 0
    while suffix < min(len(old), len(new)) and old[-1 - suffix] == new[-1 - suffix]:
        suffix += 1
    start = len(new) - suffix
    run = new.find("  ", start)
    if run < 0:
        return new
    width = len(new[run:]) - len(new[run:].lstrip(" "))
    if delta > 0:
        cut = min(delta, width - 1)
        return new[:run] + new[run + cut:]
    return new[:run] + " " * -delta + new[run:]


def realign(old: str, new: str) -> str:
    """Line by line, when the edit kept the number of lines (values replaced in place)."""
    old_lines, new_lines = old.split("\n"), new.split("\n")
    if len(old_lines) != len(new_lines):
        return new
    return "\n".join(b if a == b else _realign_line(a, b)
                     for a, b in zip(old_lines, new_lines, strict=True))


class GitError(RuntimeError):
    """A git command failed, or the change cannot be written in place."""


def _git(repo: Path, *args: str, stdin: str | None = None, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], input=stdin, capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, check=False)
    if done.returncode != 0:
        raise GitError(f"git {' '.join(args[:3])}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


@dataclass
class RefFiles:
    commit: str
    texts: dict[str, str] = field(default_factory=dict)
    """Path in the repository -> its text at the ref."""
    objects: list[tuple[str, int, dict[str, Any]]] = field(default_factory=list)
    """(path, index of the object in its file, object)."""
    problems: list[str] = field(default_factory=list)


def read_ref(repo: Path, ref: str, paths: list[str]) -> RefFiles:
    """The YAML and JSON files under ``paths`` as they are at ``ref``; a file that does not
    parse is a problem naming it (``REF:path:line``)."""
    commit = _git(repo, "rev-parse", "--verify", f"{ref}^{{commit}}").strip()
    out = RefFiles(commit)
    listed = _git(repo, "ls-tree", "-r", "--name-only", commit, "--", *paths).splitlines()
    for path in listed:
        if not path.endswith(SUFFIXES):
            continue
        text = _git(repo, "cat-file", "blob", f"{commit}:{path}")
        loaded = Loaded()
        load_text(text, f"{ref}:{path}", loaded)
        out.problems += [str(e) for e in loaded.errors]
        out.texts[path] = text
        out.objects += [(path, i, m.obj) for i, m in enumerate(loaded.manifests)]
    if not listed:
        out.problems.append(f"{ref}: no files under {', '.join(paths) or 'the root'}")
    return out


def _objects(text: str, path: str) -> list[dict[str, Any]] | None:
    loaded = Loaded()
    load_text(text, path, loaded)
    return None if loaded.errors else [m.obj for m in loaded.manifests]


@dataclass
class GitChange:
    branch: str
    commit: str
    diff: str
    changed_files: list[str]
    not_written: list[str]
    """Changes git mode leaves to a person (deleting an object from a file)."""


def _edits(files: RefFiles, target: dict[Key, dict[str, Any]]
           ) -> tuple[dict[str, list[list[dict[str, Any]]]], dict[str, list[dict[str, Any]]], list[str]]:
    """Per file, the patch of each object (value by value), new objects by the file they
    join (the first file holding their kind), and what is not written."""
    patches: dict[str, list[list[dict[str, Any]]]] = {p: [] for p in files.texts}
    seen: set[Key] = set()
    first_of_kind: dict[str, str] = {}
    projects_of: dict[Any, str] = {}
    not_written: list[str] = []
    for path, _, obj in files.objects:
        key = key_of(obj)
        ops: list[dict[str, Any]] = []
        if key is not None:
            seen.add(key)
            first_of_kind.setdefault(key[0], path)
            if key[0] == "Project":
                projects_of.setdefault(_parent(obj), path)
            goal = target.get(key)
            if goal is None:
                not_written.append(f"{key[0]} {key[2]} ({path}): delete it from the file by hand")
            else:
                ops = [op for op in patch_ops(obj.get("spec"), goal.get("spec"), "/spec")
                       if op["op"] != "test"]
        patches[path].append(ops)
    added: dict[str, list[dict[str, Any]]] = {}
    for key, obj in target.items():
        if key not in seen:
            # A new Project joins the file of its department's projects, else the first file
            # of its kind (as any new object).
            path = (projects_of.get(_parent(obj)) if key[0] == "Project" else None) or \
                first_of_kind.get(key[0]) or next(iter(files.texts))
            added.setdefault(path, []).append(obj)
    return patches, added, not_written


def _parent(obj: dict[str, Any]) -> Any:
    spec = obj.get("spec")
    return spec.get("parent") if isinstance(spec, dict) else None


def blob_at(repo: Path, commit: str, path: str) -> str:
    """A file's text at a commit (a linked file outside the tenancy paths)."""
    return _git(repo, "cat-file", "blob", f"{commit}:{path}")


def commit_change(repo: Path, files: RefFiles, target: dict[Key, dict[str, Any]], branch: str,
                  message: str, extra: dict[str, tuple[str, str]] | None = None) -> GitChange:
    """Write the target's values into the files at the ref and commit them on ``branch``
    (new). Raises :class:`GitError` when a value cannot be written in place."""
    import difflib

    _git(repo, "check-ref-format", "--branch", branch)
    patches, added, not_written = _edits(files, target)
    new_texts: dict[str, str] = {}
    for path, text in files.texts.items():
        fixed = fix_text(text, path, patches[path])
        if fixed.problems:
            raise GitError("; ".join(fixed.problems))
        out = fixed.fixed
        aligned = realign(text, out)
        if _objects(aligned, path) == _objects(out, path):  # spaces in a string are not padding
            out = aligned
        for obj in added.get(path, []):
            out = out.rstrip("\n") + "\n---\n" + yaml.safe_dump(obj, sort_keys=False)
        if out != text:
            new_texts[path] = out
    originals = dict(files.texts)
    for path, (old_text, new_text) in (extra or {}).items():
        originals[path] = old_text
        if new_text != old_text:
            new_texts[path] = new_text
    if not new_texts:
        raise GitError("the target is what the ref already holds: nothing to commit")
    modes = {}
    for line in _git(repo, "ls-tree", files.commit, "--", *new_texts).splitlines():
        meta, path = line.split("\t", 1)
        modes[path] = meta.split()[0]
    with tempfile.TemporaryDirectory(prefix="envelope-plan-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        _git(repo, "read-tree", files.commit, env=env)
        for path, text in new_texts.items():
            blob = _git(repo, "hash-object", "-w", "--stdin", stdin=text).strip()
            _git(repo, "update-index", "--cacheinfo", f"{modes.get(path, '100644')},{blob},{path}", env=env)
        tree = _git(repo, "write-tree", env=env).strip()
    commit = _git(repo, "commit-tree", tree, "-p", files.commit, "-m", message).strip()
    # The empty old value: update-ref refuses when the branch already exists.
    _git(repo, "update-ref", f"refs/heads/{branch}", commit, "")
    diff = "".join("".join(difflib.unified_diff(originals[p].splitlines(keepends=True),
                                                new_texts[p].splitlines(keepends=True),
                                                f"a/{p}", f"b/{p}")) for p in sorted(new_texts))
    return GitChange(branch, commit, diff, sorted(new_texts), not_written)
