"""longhaul: move training data between sites (client of the local longhauld).

The compiled binding is `longhaul._longhaul`; everything public in it is
re-exported here, so `longhaul.Client`, `longhaul.ExchangeGroup` and the
error types are what they always were. Pure-Python helpers live in
submodules imported on demand: `import longhaul.torch` (needs torch).
"""

from longhaul import _longhaul
from longhaul._longhaul import *  # noqa: F401,F403 - the binding's public API

__doc__ = _longhaul.__doc__ or __doc__

# Classes report the package, as they did when the extension was `longhaul`.
for _name in dir(_longhaul):
    _obj = getattr(_longhaul, _name)
    if not _name.startswith("_") and isinstance(_obj, type) and \
            getattr(_obj, "__module__", None) == _longhaul.__name__:
        try:
            _obj.__module__ = __name__
        except (AttributeError, TypeError):
            pass
del _name, _obj
