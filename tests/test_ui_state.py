"""attnviz.ui's model versions for names that are not folders, and the settings that survive leaving a page."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnviz import ui

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", ["a" * 300, "~no-such-user-zq/model", "owner/" + "b" * 300])
def test_model_version_of_a_name_the_file_system_refuses_is_empty_not_an_error(name):
    # a name longer than the OS allows raises OSError in Path.is_dir; ~user of an unknown user raises RuntimeError
    assert ui.model_version(name) == ()
