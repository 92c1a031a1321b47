"""A stand-in for flash-attn, for picotron (tests/test_picotron.py): with this folder on the path,
``import flash_attn`` finds it.

picotron 59714b1 imports three names from flash-attn at import time (picotron/model.py:7-9), and flash-attn
cannot be installed without CUDA (its setup.py raises "CUDA_HOME environment variable is not set"). With
``FLASH_ATTEN=0``, picotron's own CPU setting, it calls none of them (model.py:127 and :218 take the torch
paths), so each one here raises if called. One file, not a package: its submodules are put in
``sys.modules`` as it is imported, which is where ``import flash_attn.layers.rotary`` looks once the parent
is imported. It never imports meshscope.
"""

import sys
import types


def unavailable(*args, **kwargs):
    raise NotImplementedError("flash_attn stand-in (tests/jobs/picotron_shim): run picotron with FLASH_ATTEN=0")


__path__ = []  # a package to the import system, with no folder to search
for _name, _attr in (("flash_attn_interface", "flash_attn_func"), ("layers", None),
                     ("layers.rotary", "apply_rotary_emb"), ("ops", None), ("ops.triton", None),
                     ("ops.triton.layer_norm", "layer_norm_fn")):
    _module = types.ModuleType(f"{__name__}.{_name}")
    _module.__path__ = []
    if _attr:
        setattr(_module, _attr, unavailable)
    sys.modules[_module.__name__] = _module
