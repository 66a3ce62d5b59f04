"""Modules that are also front doors: attnviz.knockout is the knock-out module (knockout_effects, Plan, ...) and,
called, attnviz.front.knockout(model, text, ...); the same for attnviz.patching, attnviz.logit_attribution,
attnviz.qk_attribution and attnviz.rollout. attnviz.capture does the same for the capture package.

A module opens its door last thing (open_door(__name__, "knockout")). Calling it imports attnviz.front, which sits
above the module and imports it, only then: the module itself never imports the front door. This module imports
nothing of attnviz."""

from __future__ import annotations

import importlib
import inspect
import sys
import types

FRONT = "attnviz.front"


def _front_function(module: types.ModuleType):
    return getattr(importlib.import_module(FRONT), module.__dict__["__front_door__"])


class FrontDoor(types.ModuleType):
    """A module that can be called: module(...) is attnviz.front.<its __front_door__>(...)."""

    def __call__(self, *args, **kwargs):
        return _front_function(self)(*args, **kwargs)

    @property
    def __signature__(self) -> inspect.Signature:
        """The front door's signature (what inspect.signature and a notebook's help show for the call)."""
        return inspect.signature(_front_function(self))


def open_door(module_name: str, function: str) -> None:
    """Makes the module `module_name` callable as attnviz.front.<function>."""
    module = sys.modules[module_name]
    module.__front_door__ = function
    module.__class__ = FrontDoor
