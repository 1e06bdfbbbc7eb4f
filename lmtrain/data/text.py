"""Folder corpora: ``<folder>/{train,valid,test}.txt``, downloaded with ``datasets`` when missing (a corpus that is
one file is split by lines in ``lmtrain.data.tokenizer``).

Where a corpus comes from is data in its config (``hub_dataset``, ``hub_config``, ``hub_data_files``,
``hub_field``), passed to :func:`datasets.load_dataset`; nothing here is keyed by corpus name.
Downloads fail fast when offline: ``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE`` switch them off, and a
short connection probe runs before ``datasets`` (which would otherwise retry for ~20 s).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from lmtrain.data.errors import DataError

log = logging.getLogger(__name__)

SPLITS = ("train", "valid", "test")
HUB_SPLIT = {"train": "train", "valid": "validation", "test": "test"}  # our split name -> datasets split
PROBE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class HubSource:
    """Where ``datasets.load_dataset`` finds a corpus: dataset id or builder, config, files, text field."""

    dataset: str
    config: str | None = None
    data_files: dict[str, str] = field(default_factory=dict)  # datasets split -> URL (builders like "text")
    field: str = "text"


def split_paths(folder: Path) -> dict[str, Path]:
    """``{split: folder/split.txt}`` for train, valid, test."""
    return {split: folder / f"{split}.txt" for split in SPLITS}


def format_line(text: str) -> str:
    """One row as a line in the standard format: a leading space, a trailing " \\n" (empty rows: " \\n")."""
    body = text.rstrip("\n")
    if not body.startswith(" "):
        body = " " + body
    if not body.endswith(" "):
        body += " "
    return body + "\n"


def _offline_reason() -> str | None:
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on"):
            return f"{var}={os.environ[var]}"
    return None


def _probe(source: HubSource) -> None:
    """Raise OSError quickly when the download hosts cannot be reached (skipped behind a proxy)."""
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return
    urls = list(source.data_files.values()) or [os.environ.get("HF_ENDPOINT", "https://huggingface.co")]
    for host in {urlparse(url).hostname for url in urls if urlparse(url).scheme in ("http", "https")}:
        socket.create_connection((host, 443), timeout=PROBE_TIMEOUT_S).close()


def download(source: HubSource, folder: Path, cache_dir: Path | None, name: str = "") -> None:
    """Fetch the three splits with ``datasets`` and write ``folder/{train,valid,test}.txt`` atomically.

    Raises DataError naming the folder and the three files when the download cannot happen.
    """
    files = ", ".join(f"{s}.txt" for s in SPLITS)
    fix = f"put {files} in {folder} (or set LMTRAIN_DATA_DIR to a folder that holds {folder.name}/)"
    reason = _offline_reason()
    if reason is not None:
        raise DataError(f"{folder} is missing {files} and downloads are off ({reason}): {fix}.")
    try:
        _probe(source)
        import datasets  # slow import, only when a download is needed

        data_files = dict(source.data_files) or None
        loaded = datasets.load_dataset(
            source.dataset,
            source.config,
            data_files=data_files,
            cache_dir=str(cache_dir / "hf") if cache_dir else None,
        )
        texts = {split: loaded[HUB_SPLIT[split]][source.field] for split in SPLITS}
    except Exception as err:  # network, hub or format failure: all mean "no files"
        hosts = sorted({str(urlparse(u).hostname) for u in source.data_files.values()})
        hub_id = source.dataset + (f" ({source.config})" if source.config else "")
        what = ", ".join(hosts) if hosts else hub_id
        raise DataError(
            f"could not download corpus {name or folder.name!r} from {what} into {folder} "
            f"({type(err).__name__}: {' '.join(str(err).split())[:200]}): {fix}."
        ) from err
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp_paths = {}
        for split, path in split_paths(folder).items():
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            with open(tmp, "w", encoding="utf-8", newline="\n") as out:
                out.writelines(format_line(row) for row in texts[split])
            tmp_paths[tmp] = path
        for tmp, path in tmp_paths.items():
            os.replace(tmp, path)
    except OSError as err:
        for tmp in folder.glob(f".*.{os.getpid()}.tmp"):
            tmp.unlink(missing_ok=True)
        raise DataError(f"could not write the downloaded corpus into {folder} ({err}): {fix}.") from err
    log.info("downloaded %s into %s", source.dataset, folder)


def ensure_corpus(
    folder: Path, name: str, source: HubSource | None, cache_dir: Path | None, own: bool = False
) -> dict[str, Path]:
    """Paths of the three split files in ``folder``, downloading them first when all are missing.

    A folder missing only some splits, or with an empty file, is an error (sources are never mixed). ``own``: the
    folder is ``data.path`` (not ``LMTRAIN_DATA_DIR``'s), which the messages name.
    """
    paths = split_paths(folder)
    missing = [f"{s}.txt" for s, p in paths.items() if not p.is_file()]
    files = ", ".join(f"{s}.txt" for s in SPLITS)
    one_file = "or set data.path to one text file, which is split by lines (the last 5% test, the 5% before valid)"
    if len(missing) == len(SPLITS):
        if source is None and own and not folder.exists():
            raise DataError(f"data.path {folder} does not exist: set it to a folder holding {files}, {one_file}")
        if source is None:
            state = "does not exist" if not folder.is_dir() else f"holds none of {files}"
            raise DataError(
                f"corpus folder {folder} {state}, and data={name} has no download: put {files} there, {one_file} "
                "(or use data=ptb|wikitext2|wikitext103|synthetic)."
            )
        download(source, folder, cache_dir, name)
    elif missing:
        where = one_file if own else f"or set LMTRAIN_DATA_DIR to a folder that holds {folder.name}/"
        raise DataError(f"corpus folder {folder} is missing {', '.join(missing)}: put {files} there, {where}")
    for path in paths.values():
        if path.stat().st_size == 0:
            raise DataError(
                f"data file {path} is empty: put the {path.stem} split there as text, one sentence per line."
            )
    return paths


def note_split_folder(path: Path) -> None:
    """A warning when ``path``, a file split by lines, is a folder's train.txt beside its valid.txt and test.txt."""
    if path.name == "train.txt" and all(p.is_file() for p in split_paths(path.parent).values()):
        log.warning("splitting the file %s by lines; data.path=%s would read its folder's three splits", path,
                    path.parent)  # fmt: skip


def hub_source(
    dataset: str | None, config: str | None, data_files: Mapping[str, str] | None, text_field: str
) -> HubSource | None:
    """A HubSource from flat config values, or None when ``dataset`` is null (no download)."""
    if not dataset:
        return None
    files = {str(k): str(v) for k, v in (data_files or {}).items()}
    unknown = sorted(set(files) - set(HUB_SPLIT.values()))
    if unknown:
        raise DataError(f"hub_data_files has unknown split(s) {unknown}: use the keys train, validation, test.")
    return HubSource(dataset, config, files, text_field)
