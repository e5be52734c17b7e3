"""`--upload`: a deterministic pack without .git and ignored paths, and a safe unpack."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from corral.agent.runtime import StageFailure
from corral.agent.uploads import unpack_upload
from corral.client.uploads import Ignore, PackedDirectory, UploadError, pack_directory


def _tree(root: Path) -> Path:
    files = {
        "train.py": "print('x')\n",
        "data/small.csv": "a,b\n",
        "data/raw/huge.bin": "x" * 100,
        "model.ckpt": "weights",
        "sub/model.ckpt": "weights",
        "logs/run.txt": "log",
        ".git/HEAD": "ref: refs/heads/main\n",
        "sub/.git": "gitdir: elsewhere\n",
        ".corralignore": "# big things\n*.ckpt\ndata/raw\nlogs/\n\n!keep.ckpt\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (root / "link").symlink_to("train.py")
    return root


def _read(packed: PackedDirectory) -> bytes:
    """The archive's bytes; the archive is closed."""
    try:
        return packed.archive.read()
    finally:
        packed.close()


def _names(packed_bytes: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(packed_bytes), mode="r:gz") as tar:
        return tar.getnames()


def test_pack_leaves_out_git_and_ignored_paths(tmp_path: Path) -> None:
    """.git (folder or file) and .corralignore's patterns are left out; the rest is packed."""
    packed = pack_directory(_tree(tmp_path))
    names = _names(_read(packed))
    assert names == [
        ".corralignore",
        "link",
        "train.py",
        "data",
        "sub",
        "data/small.csv",
    ]
    assert packed.files == 3


def test_the_same_tree_packs_to_the_same_digest(tmp_path: Path) -> None:
    """Times, owners and walk order do not change the archive; a changed byte does."""
    root = _tree(tmp_path / "a")
    first = pack_directory(root)
    assert first.size_bytes == len(_read(first))
    os.utime(root / "train.py", (1, 1))
    assert _digest(root) == first.digest
    copy = _tree(tmp_path / "b")
    assert _digest(copy) == first.digest
    (copy / "train.py").write_text("print('y')\n")
    assert _digest(copy) != first.digest


def _digest(root: Path) -> str:
    packed = pack_directory(root)
    packed.close()
    return packed.digest


def test_ignore_patterns() -> None:
    """Names match at any depth, paths from the top, a trailing / only folders."""
    ignore = Ignore.parse("*.pyc\n/build\nout/\ndocs/*.md\n")
    assert ignore.ignores("a/b/c.pyc", False)
    assert ignore.ignores("build", True) and not ignore.ignores("src/build", True)
    assert ignore.ignores("out", True) and not ignore.ignores("out", False)
    assert ignore.ignores("docs/x.md", False) and not ignore.ignores("x.md", False)


def test_packing_a_missing_directory_says_so(tmp_path: Path) -> None:
    """--upload of something that is not a directory is a clear error."""
    with pytest.raises(UploadError, match="is not a directory"):
        pack_directory(tmp_path / "nope")


def test_unpack_restores_the_tree(tmp_path: Path) -> None:
    """What was packed is what the kernel's directory holds, links included."""
    packed = pack_directory(_tree(tmp_path / "src"))
    into = tmp_path / "kernel" / "upload"
    (into / "stale").mkdir(parents=True)  # left by an earlier attempt: replaced
    unpack_upload(_read(packed), into)
    assert (into / "train.py").read_text() == "print('x')\n"
    assert (into / "link").readlink() == Path("train.py")
    assert not (into / "stale").exists() and not (into / ".git").exists()


def _archive(info: tarfile.TarInfo, data: bytes = b"x") -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_unpack_refuses_names_leading_out(tmp_path: Path) -> None:
    """A `..` name is refused: upload_failure, not retried, nothing written outside."""
    with pytest.raises(StageFailure) as caught:
        unpack_upload(_archive(tarfile.TarInfo("../escape.txt")), tmp_path / "k" / "upload")
    assert caught.value.cause == "upload_failure" and not caught.value.retryable
    assert not (tmp_path / "k" / "escape.txt").exists()


def test_unpack_keeps_absolute_names_inside(tmp_path: Path) -> None:
    """An absolute name lands inside the directory (its leading / dropped), never at the root."""
    into = tmp_path / "upload"
    unpack_upload(_archive(tarfile.TarInfo(f"{tmp_path}/owned")), into)
    assert not (tmp_path / "owned").exists()
    assert (into / tmp_path.relative_to("/") / "owned").read_bytes() == b"x"


def test_unpack_refuses_links_leading_out(tmp_path: Path) -> None:
    """A symlink pointing outside the directory is refused."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        link = tarfile.TarInfo("passwd")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    with pytest.raises(StageFailure, match="upload_failure"):
        unpack_upload(out.getvalue(), tmp_path / "upload")


def test_unpack_refuses_what_is_no_archive(tmp_path: Path) -> None:
    """Bytes that are no tar.gz fail the preparation for good."""
    with pytest.raises(StageFailure, match="upload_failure"):
        unpack_upload(b"\x1f\x8bnot really", tmp_path / "upload")
