"""`import monarch_tf` keeps working: the helper is `monarch.tensorflow` now
(python/monarch/tensorflow.py). New code: `import monarch.tensorflow as monarch_tf`."""
import os, sys  # noqa: E401
try:
    from monarch.tensorflow import *  # noqa: F401,F403
except ImportError:  # Run from the source tree (bench/suite, tests): python/ is not on the path.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "python"))
    from monarch.tensorflow import *  # noqa: F401,F403
from monarch.tensorflow import __all__  # noqa: F401,E402
