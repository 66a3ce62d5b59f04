"""attnviz.paths: where attnviz writes, chosen by ATTNVIZ_CACHE_DIR, then XDG_CACHE_HOME, then ~/.cache."""

from pathlib import Path

from attnviz import paths


def test_attnviz_cache_dir_wins_and_folders_are_created(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNVIZ_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert paths.cache_dir() == tmp_path / "mine"
    assert paths.converted_dir() == tmp_path / "mine" / "converted" and paths.converted_dir().is_dir()
    assert paths.trained_dir() == tmp_path / "mine" / "trained" and paths.trained_dir().is_dir()
    assert not (tmp_path / "xdg").exists()


def test_xdg_then_home(tmp_path, monkeypatch):
    monkeypatch.delenv("ATTNVIZ_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert paths.cache_dir() == tmp_path / "xdg" / "attnviz" and paths.cache_dir().is_dir()
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(Path, "home", classmethod(lambda cls: tmp_path / "home"))
    assert paths.cache_dir() == tmp_path / "home" / ".cache" / "attnviz"
