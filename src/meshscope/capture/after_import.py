"""A finder that runs something on a module right after the module's own code ran, whoever imports it.

Put ahead of the others on ``sys.meta_path``, it finds the modules it watches through the finders after it and
wraps the loader's ``exec_module`` of that one spec, so that `then(module)` runs once the module is complete.
Used for what must be patched in a library only if the script imports it (a framework's optimizer stepper,
`capture.steppers`; fbgemm's table-batched embedding in a fake world, `trace.fake.fbgemm`): importing the library
ourselves would cost every rank its import.
"""

from __future__ import annotations

import importlib.abc
import sys


class AfterImport(importlib.abc.MetaPathFinder):
    """Runs `then(module)` after each module `watched(name)` says yes to is executed."""

    def __init__(self, watched, then):
        self.watched, self.then = watched, then

    def find_spec(self, fullname, path, target=None):
        if not self.watched(fullname):
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if finder is not self and find is not None else None
            if spec is not None:
                break
        else:
            return None
        exec_module = getattr(spec.loader, "exec_module", None)
        if exec_module is None:
            return spec
        then = self.then

        def exec_then(module):
            exec_module(module)
            then(module)

        spec.loader.exec_module = exec_then  # this spec's own loader object (PathFinder makes one per find)
        return spec
