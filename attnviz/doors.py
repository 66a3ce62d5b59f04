"""Modules that are also front doors: attnviz.knockout is the knock-out module (knockout_effects, Plan, ...) and,
called, attnviz.front.knockout(model, text, ...); the same for attnviz.patching, attnviz.logit_attribution,
attnviz.qk_attribution and attnviz.rollout, and for the capture package (attnviz.capture.front.capture).

The door is opened from above: the front door's own module, once it has defined its function, hands that function
to open_door (attnviz.front.experiments for the experiments, attnviz.capture.front for capture). A module never
imports its front door, and calling it imports nothing: the function is held, not looked up. attnviz/__init__.py
imports the front door before it hands out attnviz.knockout (or any other door), so the module a caller reaches
through attnviz is always open. This module imports nothing of attnviz."""

from __future__ import annotations

import inspect
import sys
import types
from collections.abc import Callable


class FrontDoor(types.ModuleType):
    """A module that can be called: module(...) is its __front_door__(...)."""

    def __call__(self, *args, **kwargs):
        return self.__dict__["__front_door__"](*args, **kwargs)

    @property
    def __signature__(self) -> inspect.Signature:
        """The front door's signature (what inspect.signature and a notebook's help show for the call)."""
        return inspect.signature(self.__dict__["__front_door__"])


def open_door(module_name: str, function: Callable) -> None:
    """Makes the module `module_name` (already imported) callable as `function`."""
    module = sys.modules[module_name]
    module.__front_door__ = function
    module.__class__ = FrontDoor
